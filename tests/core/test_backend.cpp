// The CUDA backend loads on demand (Note [the CUDA backend loads on demand] in core/device.h): a program that
// stays on the CPU maps no CUDA library, the first question about CUDA loads it, and a backend that cannot
// load is a clear error. Each test runs in a process of its own (ctest runs one test per process).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "core/memory.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

// The shared objects this process has mapped (/proc/self/maps), one path a line.
std::string mapped_files() {
  std::ifstream maps("/proc/self/maps");
  std::stringstream all;
  all << maps.rdbuf();
  return all.str();
}

TEST(Backend, CpuWorkMapsNoCudaLibraryUntilCudaIsAskedFor) {
  if (std::getenv("FRUGAL_CUDA_BACKEND")) GTEST_SKIP() << "FRUGAL_CUDA_BACKEND is set";
  // A little of everything a CPU program does: ops, a GEMM, autograd, the arena's statistics.
  Tensor w = randn({16, 8}).requires_grad_();
  Tensor loss = sum(relu(matmul(randn({4, 16}), w)));
  loss.backward();
  EXPECT_GT(memory::stats(kCPU).allocated.peak, 0);
  const std::string before = mapped_files();
  for (const char* lib : {"libfrugal_cuda", "libcudart", "libcublas", "libcudnn", "libcuda."})
    EXPECT_EQ(before.find(lib), std::string::npos) << lib << " is mapped by a program that uses the CPU only";

  const bool has_gpu = cuda_is_available();  // the first question about CUDA loads the backend
  EXPECT_EQ(has_gpu, device_count(DeviceType::CUDA) > 0);
#ifdef FRUGAL_HAVE_CUDA
  EXPECT_TRUE(load_backend(DeviceType::CUDA)) << backend_error(DeviceType::CUDA);
  EXPECT_EQ(backend_error(DeviceType::CUDA), "");
  const std::string after = mapped_files();
  EXPECT_NE(after.find("libfrugal_cuda"), std::string::npos) << "the backend was not loaded";
  EXPECT_NE(after.find("libcudart"), std::string::npos);
#else
  EXPECT_FALSE(has_gpu);
  EXPECT_FALSE(load_backend(DeviceType::CUDA));
  EXPECT_NE(backend_error(DeviceType::CUDA).find("frugal was built without CUDA"), std::string::npos);
#endif
  EXPECT_TRUE(load_backend(DeviceType::CPU));
  EXPECT_EQ(backend_error(DeviceType::CPU), "");
}

// Run by ctest with FRUGAL_CUDA_BACKEND pointing at a file that is not there (test_core_backend_missing):
// every way of asking for CUDA gives the same clear answer, and the CPU goes on working.
TEST(Backend, MissingBackendFileIsAClearError) {
  const char* path = std::getenv("FRUGAL_CUDA_BACKEND");
  if (!path)
    GTEST_SKIP() << "run with FRUGAL_CUDA_BACKEND=<a missing file> (ctest: test_core_backend_missing)";
  EXPECT_FALSE(load_backend(DeviceType::CUDA));
  const std::string why = backend_error(DeviceType::CUDA);
  EXPECT_NE(why.find(std::string("the CUDA backend ") + path + " cannot be loaded: "), std::string::npos)
      << why;
  EXPECT_NE(why.find("FRUGAL_CUDA_BACKEND"), std::string::npos) << why;
  EXPECT_FALSE(cuda_is_available());
  EXPECT_EQ(device_count(DeviceType::CUDA), 0);
  try {
    (void)ones({2, 3}).to(cuda(0));
    FAIL() << "expected DeviceError";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("no allocator for cuda:0: " + why), std::string::npos) << e.what();
  }
  EXPECT_EQ(ones({2, 3}).sum().item<float>(), 6.0f);
}

}  // namespace
}  // namespace frugal
