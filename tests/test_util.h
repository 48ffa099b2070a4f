// Shared test helpers: seeded random inputs, a naive broadcasting reference, dtype-aware comparison, and a
// check that an error names what it should.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <any>
#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "core/op_table.h"
#include "frugal.h"

namespace frugal::testing {

// Absolute and relative tolerance for results stored in dtype t (16-bit floats round once at the end).
struct Tol {
  double atol, rtol;
};
inline Tol tol_for(DType t) {
  switch (t) {
    case DType::F64:
      return {1e-12, 1e-10};
    case DType::F32:
      return {1e-5, 1e-5};
    case DType::F16:
      return {2e-3, 2e-3};
    case DType::BF16:
      return {1.6e-2, 1.6e-2};
    default:
      return {0, 0};
  }
}

// Uniform values in [lo, hi) of dtype t (drawn in f64 from a fixed seed, then converted).
inline Tensor uniform(const Shape& shape, double lo, double hi, DType t = DType::F32, uint64_t seed = 1) {
  Generator g(seed);
  return add(mul(rand(shape, DType::F64, &g), hi - lo), lo).to(t);
}

// Expects actual ≈ expected elementwise: |a - e| <= atol + rtol * |e|; nan matches nan, inf matches inf.
inline void expect_close(const std::vector<double>& actual, const std::vector<double>& expected, Tol tol,
                         const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    if (std::isnan(e)) {
      EXPECT_TRUE(std::isnan(a)) << what << " at " << i << ": expected nan, got " << a;
    } else if (std::isinf(e)) {
      EXPECT_EQ(a, e) << what << " at " << i;
    } else {
      EXPECT_LE(std::fabs(a - e), tol.atol + tol.rtol * std::fabs(e))
          << what << " at " << i << ": got " << a << ", expected " << e;
    }
    if (::testing::Test::HasFailure()) return;  // one clear failure, not thousands
  }
}
inline void expect_close(const Tensor& actual, const std::vector<double>& expected, Tol tol,
                         const std::string& what) {
  expect_close(actual.to_vector<double>(), expected, tol, what);
}

// The row-major multi-index of flat index i in shape.
inline std::vector<int64_t> unravel(int64_t i, const Shape& shape) {
  std::vector<int64_t> idx(size_t(shape.size()));
  for (int d = shape.size() - 1; d >= 0; --d) {
    idx[size_t(d)] = i % shape[d];
    i /= shape[d];
  }
  return idx;
}

// Flat index into `shape` of the element that multi-index `idx` (of the broadcast shape) reads.
inline int64_t broadcast_index(const std::vector<int64_t>& idx, const Shape& shape) {
  int64_t flat = 0;
  const int lead = int(idx.size()) - shape.size();
  for (int d = 0; d < shape.size(); ++d) flat = flat * shape[d] + (shape[d] == 1 ? 0 : idx[size_t(d + lead)]);
  return flat;
}

// Naive elementwise reference in f64 with NumPy broadcasting.
inline std::vector<double> reference_binary(const Tensor& a, const Tensor& b,
                                            const std::function<double(double, double)>& f) {
  const Shape out = broadcast_shapes(a.shape(), b.shape(), "reference");
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  std::vector<double> r(size_t(out.numel()));
  for (int64_t i = 0; i < out.numel(); ++i) {
    const auto idx = unravel(i, out);
    r[size_t(i)] =
        f(av[size_t(broadcast_index(idx, a.shape()))], bv[size_t(broadcast_index(idx, b.shape()))]);
  }
  return r;
}

// Expects fn to throw E with a message containing every one of `parts`.
template <typename E>
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an exception containing '" << (parts.empty() ? "" : parts[0]) << "'";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message '" << msg << "' lacks '" << p << "'";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type, message: " << e.what();
  }
}

// Expects fn to throw exactly E (not a subclass or sibling) with every one of `parts` in the message.
template <typename E>
void expect_exact_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected " << typeid(E).name() << " mentioning '" << (parts.empty() ? "" : parts[0])
                  << "', nothing thrown";
  } catch (const std::exception& e) {
    EXPECT_EQ(typeid(e), typeid(E)) << "wrong exception type; message: " << e.what();
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "'" << msg << "' lacks '" << p << "'";
  }
}

// A fixture with a fresh scratch directory per test (named after the test and the process), removed
// afterwards.
class ScratchDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("frugal_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name() + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

// The kernels of every op table for one device type, as they were before a stand-in replaced them.
struct SavedKernelRows {
  DeviceType device = DeviceType::CPU;
  std::vector<std::pair<OpTableRef, ErasedKernelRow>> rows;
};

// A stand-in device on the CPU (the stand-in GPUs of tests/cuda/gpu_test.h and tests/core/test_devices.cpp):
// every op table's row for `device` takes the CPU's kernels, of every dtype (none where the CPU has none), so
// that no test on the stand-in reaches a real kernel of that device with host memory. Run it after static
// initialisation (every kernel registered); op_copy_between_devices, which the CPU has no kernels of, is left
// without any for `device`. restore_kernels(saved) undoes it.
inline SavedKernelRows use_cpu_kernels_on(DeviceType device) {
  SavedKernelRows saved{device, {}};
  for (const OpTableRef& t : op_tables())
    saved.rows.emplace_back(t, t.copy_row(t.table, DeviceType::CPU, device));
  return saved;
}
inline void restore_kernels(const SavedKernelRows& saved) {
  for (const auto& [t, row] : saved.rows) t.set_row(t.table, saved.device, row);
}

// The tensors autograd saves for backward while this is alive, in order, as they are
// (autograd::SavedTensorHooks that keep each one unchanged).
class SavedTensors {
 public:
  SavedTensors()
      : hooks_(
            [this](const Tensor& t) -> std::any {
              kept.push_back(t);
              return t;
            },
            [](const std::any& a) { return std::any_cast<Tensor>(a); }) {}
  std::vector<Tensor> kept;

 private:
  autograd::SavedTensorHooks hooks_;
};

}  // namespace frugal::testing
