// Helpers of the GPU tests: a fixture that skips without a device, a comparison of an op run on the GPU with
// the same op run on the CPU, and a stand-in GPU for checking the suites themselves on a machine without one.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/op_table_copy.h"
#include "tests/test_util.h"

namespace frugal::testing {

inline const Device kGpu = cuda(0);

namespace detail {
inline void host_copy(const DeviceCopyArgs& a) { std::memcpy(a.dst, a.src, size_t(a.nbytes)); }
}  // namespace detail

// With FRUGAL_FAKE_GPU=1 on a machine without a GPU, cuda:0 becomes host memory running the CPU's kernels
// (every op table's, use_cpu_kernels_on in tests/test_util.h), so that the GPU suites' own logic (views,
// dtypes, shapes, autograd and optimizers across devices) runs here. It checks the tests, not the CUDA
// kernels: both sides of every comparison run the same code.
inline bool fake_gpu() {
  static const bool on = [] {
    const char* env = std::getenv("FRUGAL_FAKE_GPU");
    if (!env || std::strcmp(env, "1") != 0 || cuda_is_available()) return false;
    memory::register_backing(DeviceType::CUDA, [](int) { return memory::make_host_backing(); });
    register_device_count(DeviceType::CUDA, [] { return 1; });
    use_cpu_kernels_on(DeviceType::CUDA);
    for (int t = 0; t < kNumDTypes; ++t)
      op_copy_between_devices.set(DeviceType::CUDA, DType(t), detail::host_copy);
    return true;
  }();
  return on;
}

// Skips every test of the suite when there is no usable GPU (any error from the driver counts as none).
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fake_gpu() && !cuda_is_available())
      GTEST_SKIP() << "no CUDA device: frugal was built without CUDA, or there is no driver or no GPU here; "
                      "the GPU tests run on a machine with one (scripts/gpu-check.sh)";
  }
};

// Runs f on the inputs as given (cpu) and on copies of them on the GPU, and expects the same dtype, shape and
// values (within tol). f may take views of its inputs, so that layouts other than contiguous are exercised.
inline void expect_gpu_matches_cpu(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                   const std::vector<Tensor>& inputs, Tol tol, const std::string& what) {
  std::vector<Tensor> on_gpu;
  for (const Tensor& t : inputs) on_gpu.push_back(t.to(kGpu));
  const Tensor want = f(inputs);
  const Tensor got = f(on_gpu);
  ASSERT_EQ(got.device(), kGpu) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  expect_close(got.to(kCPU).to_vector<double>(), want.to_vector<double>(), tol, what);
}

}  // namespace frugal::testing
