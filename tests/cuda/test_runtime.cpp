// The CUDA plumbing and the arena on a real GPU: error messages name the call and file:line (host only, runs
// in every CUDA build), then, with a device, statistics, limits and out-of-memory advice, empty_cache()
// returning segments to the driver, blocks reused per stream, and a whole small training step on the GPU.
#include <gtest/gtest.h>

#include "tests/cuda/gpu_test.h"

#ifdef FRUGAL_HAVE_CUDA
#include "kernels/cuda/runtime.h"
#endif

namespace frugal {
namespace {

using testing::expect_error;
using testing::GpuTest;

constexpr int64_t kMiB = 1024 * 1024;

#ifdef FRUGAL_HAVE_CUDA
TEST(CudaRuntime, FailedCallsNameTheCallAndWhere) {
  expect_error<DeviceError>([] { FRUGAL_CUDA_CHECK(cudaErrorInvalidValue); },
                            {"CUDA error: cudaErrorInvalidValue failed at",
                             "test_runtime.cpp:", "cudaErrorInvalidValue (invalid argument)"});
  expect_error<DeviceError>(
      [] { gpu::check(cudaErrorLaunchOutOfResources, "launch of my_kernel", "f.cu", 7); },
      {"launch of my_kernel failed at f.cu:7", "cudaErrorLaunchOutOfResources"});
  EXPECT_NO_THROW(FRUGAL_CUDA_CHECK(cudaSuccess));
}

TEST(CudaRuntime, NoDeviceMeansNoGpuNotAnError) {
  // On a machine without a driver cudaGetDeviceCount fails; frugal reads that as zero devices.
  EXPECT_GE(gpu::device_count(), 0);
  EXPECT_EQ(cuda_is_available(), gpu::device_count() > 0);
  if (!cuda_is_available())
    expect_error<DeviceError>([] { zeros({2}, testing::kGpu); },
                              {"no allocator for cuda:0", "no GPU answers"});
}
#endif

using GpuMemory = GpuTest;

TEST_F(GpuMemory, StatisticsLimitAndOutOfMemoryAdvice) {
  const Device gpu = testing::kGpu;
  memory::empty_cache(gpu);
  const auto before = memory::stats(gpu);
  {
    Tensor a = empty({3 * kMiB / 4}, gpu);  // 3 MiB of f32
    const auto s = memory::stats(gpu);
    EXPECT_EQ(s.requested.current, before.requested.current + 3 * kMiB);
    EXPECT_GE(s.reserved.current, before.reserved.current + 3 * kMiB);
    memory::allocator(gpu).check_invariants();
  }
  EXPECT_EQ(memory::stats(gpu).requested.current, before.requested.current);
  memory::empty_cache(gpu);  // the segment goes back to the driver
  EXPECT_EQ(memory::stats(gpu).reserved.current, before.reserved.current);

  memory::set_memory_limit(gpu, memory::stats(gpu).reserved.current + 64 * kMiB);
  expect_error<OutOfMemoryError>(
      [&] { empty({256 * kMiB / 4}, gpu); },
      {"out of memory on cuda:0", "268435456 bytes (256.00 MiB)", "lower the batch size"});
  memory::set_memory_limit(gpu, 0);
  EXPECT_GE(memory::stats(gpu).num_ooms, 1);
  EXPECT_NE(memory::memory_summary(gpu).find("cuda:0"), std::string::npos);
}

TEST_F(GpuMemory, BlocksAreReusedOnTheirOwnStream) {
  if (testing::fake_gpu()) GTEST_SKIP() << "needs real CUDA streams";
#ifdef FRUGAL_HAVE_CUDA
  const Device gpu = testing::kGpu;
  cudaStream_t s1 = nullptr, s2 = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  void* first = nullptr;
  {
    gpu::StreamGuard on_s1(0, s1);
    Tensor a = ones({1000}, gpu);  // the fill runs on s1
    first = a.raw_data();
  }
  {
    gpu::StreamGuard on_s1(0, s1);
    Tensor b = empty({1000}, gpu);
    EXPECT_EQ(b.raw_data(), first);  // the same stream takes its cached block back
  }
  {
    gpu::StreamGuard on_s2(0, s2);
    Tensor c = empty({1000}, gpu);
    EXPECT_NE(c.raw_data(), first);  // another stream does not
    bool found = false;
    for (const auto& blk : memory::snapshot(gpu))
      if (blk.address == reinterpret_cast<uintptr_t>(c.raw_data())) {
        found = true;
        EXPECT_EQ(blk.stream, reinterpret_cast<memory::Stream>(s2));
      }
    EXPECT_TRUE(found);
  }
  ASSERT_EQ(cudaStreamSynchronize(s1), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s2), cudaSuccess);
  memory::empty_cache(gpu);  // waits for any pending frees, then returns the segments
  memory::allocator(gpu).check_invariants();
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
#endif
}

// A few steps of a small MLP with Adam on each device: the same losses (to f32 rounding).
TEST_F(GpuMemory, AnMlpTrainsTheSameOnTheGpu) {
  auto losses = [](Device d) {
    manual_seed(11);
    nn::Sequential net;
    net->push_back(nn::Linear(20, 64));
    net->push_back(nn::ReLU());
    net->push_back(nn::Linear(64, 5));
    net->to(d);
    optim::Adam opt(net->parameters(), optim::AdamOptions(1e-2));
    const Tensor x = testing::uniform({32, 20}, -1, 1, DType::F32, 61).to(d);
    const Tensor y = testing::uniform({32}, 0, 5, DType::F64, 62).to(DType::I64).to(d);
    std::vector<double> out;
    for (int step = 0; step < 5; ++step) {
      opt.zero_grad();
      const Tensor loss = nn::functional::cross_entropy(net->forward(x), y);
      loss.backward();
      opt.step();
      out.push_back(loss.item<double>());
    }
    return out;
  };
  testing::expect_close(losses(testing::kGpu), losses(kCPU), {1e-5, 1e-5}, "losses");
}

}  // namespace
}  // namespace frugal
