// Moving tensors and modules between devices (ops::copy_ across devices, Tensor::to, nn::Module::to), reading
// and printing a device tensor, and the errors of ops that mix devices. On a machine with a GPU, cuda:0 is
// the real one; elsewhere this program plays a GPU on the CPU: a host-memory backing for cuda:0, a byte copy
// that checks what the op layer hands it, and the CPU's kernels of every op table registered for it
// (testing::use_cpu_kernels_on), so that the device logic of the op layer runs on every machine.
#include <gtest/gtest.h>

#include <cstring>

#include "core/op_table_copy.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;

struct FakeCopies {
  int64_t calls = 0;
  int64_t bytes = 0;
};
FakeCopies g_fake;

void fake_copy(const DeviceCopyArgs& a) {
  EXPECT_NE(a.src_device.is_cpu(), a.dst_device.is_cpu()) << "a copy that is not host <-> device";
  ++g_fake.calls;
  g_fake.bytes += a.nbytes;
  std::memcpy(a.dst, a.src, size_t(a.nbytes));
}

// True when cuda:0 is a real GPU; otherwise installs the simulated one (once per process).
bool real_gpu() {
  static const bool real = [] {
    if (cuda_is_available()) return true;
    memory::register_backing(DeviceType::CUDA, [](int) { return memory::make_host_backing(); });
    // Every op table's kernels (copy_ converts with cast, fills with fill, transposes with transpose2d): a
    // CUDA build registers its real kernels, which must not run on host memory.
    testing::use_cpu_kernels_on(DeviceType::CUDA);
    for (int t = 0; t < kNumDTypes; ++t) op_copy_between_devices.set(DeviceType::CUDA, DType(t), fake_copy);
    return false;
  }();
  return real;
}

const Device kGpu = cuda(0);

void expect_same(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.shape(), b.shape());
  ASSERT_EQ(a.dtype(), b.dtype());
  EXPECT_EQ(a.to_vector<double>(), b.to_vector<double>());
}

TEST(Devices, TensorRoundTripsThroughTheDevice) {
  const bool real = real_gpu();
  const Tensor x = randn({3, 5});
  const int64_t calls = g_fake.calls;
  const Tensor g = x.to(kGpu);
  EXPECT_EQ(g.device(), kGpu);
  EXPECT_TRUE(g.is_contiguous());
  EXPECT_TRUE(x.to(kCPU).is_same(x));  // already there: no copy
  EXPECT_TRUE(g.to(kGpu).is_same(g));
  const Tensor back = g.to(kCPU);
  EXPECT_EQ(back.device(), kCPU);
  expect_same(back, x);
  if (!real) {
    EXPECT_EQ(g_fake.calls, calls + 2);  // one copy each way, whole
    EXPECT_GE(memory::stats(kGpu).allocated.current, 60);
  }
  // A view crosses as its own elements, in order.
  expect_same(x.t().to(kGpu).to(kCPU), x.t().contiguous());
  expect_same(x.narrow(1, 1, 3).to(kGpu).to(kCPU), x.narrow(1, 1, 3).contiguous());
  // Every dtype, including those a device has no arithmetic for.
  for (DType t : {DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8, DType::Bool}) {
    const Tensor y = x.to(t);
    expect_same(y.to(kGpu).to(kCPU), y);
  }
}

TEST(Devices, LargeCopiesCrossInChunks) {
  real_gpu();
  // 20 MiB: more than the two 8 MiB staging buffers of the CUDA path, with a ragged last chunk.
  const Tensor x = randn({5 * 1024 * 1024 + 7});
  expect_same(x.to(kGpu).to(kCPU), x);
  const Tensor empty_x = zeros({0, 3});
  EXPECT_EQ(empty_x.to(kGpu).to(kCPU).shape(), (Shape{0, 3}));
}

TEST(Devices, CopyConvertsAndBroadcastsAcrossDevices) {
  real_gpu();
  const Tensor row = testing::uniform({4}, -2, 2);
  Tensor d = zeros({3, 4}, TensorOptions(DType::F64).device(kGpu));
  d.copy_(row);  // f32 cpu [4] -> f64 cuda [3, 4]
  expect_same(d.to(kCPU), row.to(DType::F64).expand({3, 4}).contiguous());
  // Into a non-contiguous destination on the device.
  Tensor big = zeros({4, 3}, kGpu);
  Tensor view = big.t();
  const Tensor src = testing::uniform({3, 4}, -1, 1);
  view.copy_(src);
  expect_same(big.to(kCPU), src.t().contiguous());
  // Back into a non-contiguous host destination, converting.
  Tensor host = zeros({4, 3}, DType::F64);
  Tensor host_view = host.t();
  host_view.copy_(view);
  expect_same(host.to(DType::F32), src.t().contiguous());
  // copy_ bumps the destination's version, as any in-place op.
  const uint64_t v = big.storage()->version();
  view.copy_(src);
  EXPECT_GT(big.storage()->version(), v);
}

TEST(Devices, ReadingAndPrintingCopyToTheHostFirst) {
  real_gpu();
  const Tensor x = tensor<float>({1.5f, -2, 3.25f, 4}, {2, 2});
  const Tensor g = x.to(kGpu);
  EXPECT_EQ(g.to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(g.select(0, 1).select(0, 0).item<float>(), 3.25f);
  EXPECT_EQ(g.t().to_vector<double>(), x.t().to_vector<double>());
  EXPECT_EQ(g.str(), "tensor([[ 1.5000, -2.0000],\n        [ 3.2500,  4.0000]], device='cuda:0')");
  EXPECT_EQ(x.to(DType::BF16).to(kGpu).str(),
            "tensor([[ 1.5000, -2.0000],\n        [ 3.2500,  4.0000]], device='cuda:0', dtype=bf16)");
}

TEST(Devices, ModuleToMovesParametersInPlace) {
  real_gpu();
  manual_seed(3);
  nn::Linear layer(3, 2);
  const Tensor weight = layer->weight;  // another handle to the same parameter
  const std::vector<double> w = layer->weight.to_vector<double>(), b = layer->bias.to_vector<double>();
  layer->to(kGpu);
  for (const Tensor& p : layer->parameters()) EXPECT_EQ(p.device(), kGpu);
  EXPECT_EQ(weight.device(), kGpu);  // the handle follows: the optimizer keeps working on the same tensor
  EXPECT_TRUE(weight.requires_grad());
  EXPECT_EQ(layer->weight.to_vector<double>(), w);
  layer->to(kCPU);
  EXPECT_EQ(weight.device(), kCPU);
  EXPECT_EQ(layer->weight.to_vector<double>(), w);
  EXPECT_EQ(layer->bias.to_vector<double>(), b);
}

TEST(Devices, OpsThatMixDevicesNameThem) {
  real_gpu();
  const Tensor a = ones({2, 3}), g = ones({2, 3}, kGpu);
  expect_error<DeviceError>([&] { ops::add(a, g); }, {"add", "cpu", "cuda:0", ".to(device)"});
  expect_error<DeviceError>([&] { ops::where(gt(a, 0.0), a, g); }, {"where", "cpu", "cuda:0"});
  expect_error<DeviceError>([&] { ops::matmul(a, g.t()); }, {"matmul", "cpu", "cuda:0"});
  expect_error<DeviceError>([&] { ops::cat({a, g}); }, {"cat", "cpu", "cuda:0"});
  expect_error<DeviceError>([&] { ops::index_select(g, 0, tensor<int64_t>({0})); },
                            {"index_select", "cpu", "cuda:0"});
  expect_error<DeviceError>(
      [&] {
        ops::scatter_add(ones({2, 3}), 0, zeros({1, 3}, DType::I64), ones({1, 3}, kGpu));
      },
      {"scatter_add", "cpu", "cuda:0"});
  expect_error<DeviceError>(
      [&] {
        ops::index_add(ones({2, 3}), 0, tensor<int64_t>({1}), ones({1, 3}, kGpu));
      },
      {"index_add", "cpu", "cuda:0"});
  expect_error<DeviceError>(
      [&] {
        nn::functional::cross_entropy(randn({2, 3}).to(kGpu), tensor<int64_t>({0, 1}));
      },
      {"cross_entropy", "cpu", "cuda:0"});
  Tensor dst = ones({2, 3});
  Tensor wide = ones({2, 4}, kGpu);
  expect_error<ShapeError>([&] { dst.copy_(wide); }, {"copy_", "[2, 4]", "[2, 3]"});
}

}  // namespace
}  // namespace frugal
