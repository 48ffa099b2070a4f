// The thread count (core/parallel.h): set_num_threads bounds it, and a malformed FRUGAL_NUM_THREADS is
// reported, not ignored. tests/CMakeLists.txt runs this program again with malformed values in the
// environment (test_core_threads_bad_env_*).
#include <omp.h>
#include <strings.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "core/ops.h"
#include "core/quant_kernels.h"
#include "nn/conv.h"
#include "nn/quant.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;

// A sum over a long run, so that it forks (parallel_for with more than one chunk).
double parallel_sum() { return sum(ones({1 << 20})).item<double>(); }

// What OMP_WAIT_POLICY says, read here on its own.
bool env_says_passive() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  return policy != nullptr && strcasecmp(policy, "passive") == 0;
}

// The chunks parallel_for runs a loop of n elements in, at parallel_grain().
int chunks_of(int64_t n) {
  std::atomic<int> chunks{0};
  parallel_for(0, n, parallel_grain(), [&](int64_t, int64_t) { ++chunks; });
  return chunks.load();
}

// Set by tests/CMakeLists.txt beside a malformed FRUGAL_NUM_THREADS.
bool env_is_malformed() { return std::getenv("FRUGAL_TEST_MALFORMED_NUM_THREADS") != nullptr; }

TEST(Threads, SetNumThreadsRefusesCountsOutsideTheRange) {
  if (env_is_malformed()) GTEST_SKIP() << "FRUGAL_NUM_THREADS is malformed in this run";
  const int before = num_threads();
  // 100000 threads would make libgomp abort when the next parallel region starts.
  expect_error<Error>([] { set_num_threads(100000); },
                      {"set_num_threads", "100000", "[1, " + std::to_string(max_threads()) + "]"});
  expect_error<Error>([] { set_num_threads(0); }, {"set_num_threads", "0", "[1, "});
  expect_error<Error>([] { set_num_threads(-3); }, {"set_num_threads", "-3"});
  EXPECT_EQ(num_threads(), before);  // a refused count changes nothing
  EXPECT_EQ(parallel_sum(), double(1 << 20));
  set_num_threads(3);
  EXPECT_EQ(num_threads(), 3);
  EXPECT_EQ(parallel_sum(), double(1 << 20));
  set_num_threads(before);
}

TEST(Threads, EnvironmentValuesOutsideTheRangeAreErrors) {
  EXPECT_GE(max_threads(), 16);
  EXPECT_EQ(detail::num_threads_from_env(nullptr), 0);  // unset: OpenMP's default
  EXPECT_EQ(detail::num_threads_from_env(""), 0);
  EXPECT_EQ(detail::num_threads_from_env("1"), 1);
  EXPECT_EQ(detail::num_threads_from_env("4"), 4);
  EXPECT_EQ(detail::num_threads_from_env(std::to_string(max_threads()).c_str()), max_threads());
  const std::string too_many = std::to_string(max_threads() + 1);
  for (const std::string bad : {"abc", "-3", "0", "2x", " 4", "4.5", "100000", "99999999999999999999"})
    expect_error<Error>([&] { detail::num_threads_from_env(bad.c_str()); },
                        {"FRUGAL_NUM_THREADS='" + bad + "'", "[1, " + std::to_string(max_threads()) + "]"});
  expect_error<Error>([&] { detail::num_threads_from_env(too_many.c_str()); }, {too_many});
}

// tests/CMakeLists.txt also runs the two tests below under OMP_WAIT_POLICY=ACTIVE and PASSIVE.
TEST(Threads, TheGrainFollowsTheWaitingPolicy) {
  if (env_is_malformed()) GTEST_SKIP() << "FRUGAL_NUM_THREADS is malformed in this run";
  const bool passive = env_says_passive();
  EXPECT_EQ(detail::passive_waiting(), passive);
  EXPECT_EQ(parallel_grain(), passive ? kPassiveGrain : kGrain);
  EXPECT_EQ(items_per_grain(0), parallel_grain());
  EXPECT_EQ(items_per_grain(3), parallel_grain() / 3);
  EXPECT_EQ(items_per_grain(parallel_grain() + 1), 1);
  const int before = num_threads();
  set_num_threads(2);
  EXPECT_EQ(chunks_of(parallel_grain()), 1);  // one grain: no fork
  EXPECT_EQ(chunks_of(kGrain + 1), passive ? 1 : 2);
  EXPECT_EQ(chunks_of(parallel_grain() + 1), 2);
  set_num_threads(before);
}

TEST(Threads, ASmallProductRunsOnOneThreadUnderPassiveWaiting) {
  if (env_is_malformed()) GTEST_SKIP() << "FRUGAL_NUM_THREADS is malformed in this run";
  const bool passive = env_says_passive();
  const int before = num_threads();
  set_num_threads(2);
  for (const int64_t below :
       {detail::kPassiveF32Product, detail::kPassiveBf16Product, detail::kPassiveInt8Product}) {
    {
      const detail::OneThreadProduct scope(below - 1, below);
      EXPECT_EQ(omp_get_max_threads(), passive ? 1 : 2) << below;
    }
    EXPECT_EQ(omp_get_max_threads(), 2) << below;  // set back
    {
      const detail::OneThreadProduct scope(below, below);
      EXPECT_EQ(omp_get_max_threads(), 2) << below;
    }
  }
  // Inside a parallel region the scope changes nothing.
  std::atomic<int> changed{0};
#pragma omp parallel num_threads(2)
  {
    const int outer = omp_get_max_threads();
    {
      const detail::OneThreadProduct scope(1, detail::kPassiveF32Product);
      changed += omp_get_max_threads() != outer;
    }
    changed += omp_get_max_threads() != outer;
  }
  EXPECT_EQ(changed.load(), 0);
  // f32 and bf16 products below and above the thresholds: right, and the thread count set back after each.
  for (const int64_t n : {4, 200}) {
    const Tensor a = testing::uniform({n, n}, -1, 1, DType::F32, 5);
    const Tensor b = testing::uniform({n, n}, -1, 1, DType::F32, 6);
    const std::string what = " of " + std::to_string(n) + " x " + std::to_string(n);
    const Tensor c = matmul(a, b);
    EXPECT_EQ(num_threads(), 2);
    testing::expect_close(c, matmul(a.to(DType::F64), b.to(DType::F64)).to_vector<double>(), {1e-4, 1e-4},
                          "f32 matmul" + what);
    const Tensor a16 = a.to(DType::BF16), b16 = b.to(DType::BF16);
    const Tensor c16 = matmul(a16, b16);
    EXPECT_EQ(num_threads(), 2);
    testing::expect_close(c16, matmul(a16.to(DType::F64), b16.to(DType::F64)).to_vector<double>(),
                          {0.05, 0.01}, "bf16 matmul" + what);
  }
  // A layer on a few rows (kernels/cpu/linear.cpp's own kernel, not oneDNN's): 8 x 256 x 300 multiply-adds
  // are below kPassiveF32Product, 8 x 1024 x 600 above.
  for (const int64_t n : {256, 1024}) {
    const Tensor x = testing::uniform({8, 300 + 300 * (n > 256)}, -1, 1, DType::F32, 7);
    const Tensor w = testing::uniform({n, x.size(1)}, -1, 1, DType::F32, 8);
    const Tensor b = testing::uniform({n}, -1, 1, DType::F32, 9);
    const Tensor y = ops::linear_relu(x, w, b);
    EXPECT_EQ(num_threads(), 2);
    const Tensor ref =
        relu(add(matmul(x.to(DType::F64), transpose(w.to(DType::F64), 0, 1)), b.to(DType::F64)));
    testing::expect_close(y, ref.to_vector<double>(), {1e-4, 1e-4},
                          "linear_relu on 8 rows to " + std::to_string(n));
  }
  set_num_threads(before);
}

// Convolutions below and above the thresholds (the direct algorithm's multiply-adds; f32, bf16 and oneDNN's
// int8 convolution): right in every direction, and the thread count set back after each. Under passive
// waiting (the test_core_threads_waiting_PASSIVE run) the small ones make and run their primitives on one
// thread.
TEST(Threads, ASmallConvolutionRunsOnOneThreadUnderPassiveWaiting) {
  if (env_is_malformed()) GTEST_SKIP() << "FRUGAL_NUM_THREADS is malformed in this run";
  const int before = num_threads();
  set_num_threads(2);
  NoGradGuard ng;
  // 16 -> 16 channels, 3 x 3 over 12 x 12: 331,776 multiply-adds an image, so 1 image is below 2^22 and 16
  // are above; the int8 layer (32 -> 32 over 16 x 16, 2.4M an image) is below 2^24 on 1 image, above on 16.
  for (const int64_t n : {1, 16}) {
    const std::string what = " on " + std::to_string(n) + " images";
    const Tensor x = testing::uniform({n, 16, 12, 12}, -1, 1, DType::F32, 7);
    const Tensor w = testing::uniform({16, 16, 3, 3}, -0.3, 0.3, DType::F32, 8);
    const Tensor b = testing::uniform({16}, -0.1, 0.1, DType::F32, 9);
    const Tensor x64 = x.to(DType::F64), w64 = w.to(DType::F64), b64 = b.to(DType::F64);
    const Tensor y64 = ops::conv2d(x64, w64, b64, 1, 1);
    testing::expect_close(ops::conv2d(x, w, b, 1, 1), y64.to_vector<double>(), {1e-4, 1e-4},
                          "f32 conv" + what);
    EXPECT_EQ(num_threads(), 2);
    const Tensor dy = testing::uniform(y64.shape(), -1, 1, DType::F32, 10);
    testing::expect_close(
        ops::conv2d_backward_data(dy, w, x.shape(), 1, 1, 1, 1),
        ops::conv2d_backward_data(dy.to(DType::F64), w64, x.shape(), 1, 1, 1, 1).to_vector<double>(),
        {1e-4, 1e-4}, "f32 conv's d x" + what);
    testing::expect_close(ops::conv2d_backward_weight(dy, x, w.shape(), 1, 1, 1, 1, false).first,
                          ops::conv2d_backward_weight(dy.to(DType::F64), x64, w.shape(), 1, 1, 1, 1, false)
                              .first.to_vector<double>(),
                          {1e-3, 1e-4}, "f32 conv's d weight" + what);
    EXPECT_EQ(num_threads(), 2);
    const Tensor x16 = x.to(DType::BF16), w16 = w.to(DType::BF16), b16 = b.to(DType::BF16);
    testing::expect_close(
        ops::conv2d(x16, w16, b16, 1, 1),
        ops::conv2d(x16.to(DType::F64), w16.to(DType::F64), b16.to(DType::F64), 1, 1).to_vector<double>(),
        {0.05, 0.02}, "bf16 conv" + what);
    EXPECT_EQ(num_threads(), 2);
    // int8: oneDNN's convolution against the im2col path, which computes the same sums.
    nn::Conv2d conv(nn::Conv2dOptions(32, 32, 3).padding(1));
    const Tensor xq = testing::uniform({n, 32, 16, 16}, -1, 2, DType::F32, 11);
    nn::QuantizedConv2d q(conv->options(), conv->weight, conv->bias, nullptr);
    const Tensor onednn = q->forward(xq);
    EXPECT_EQ(num_threads(), 2);
    cpu::set_int8_conv_onednn(false);
    const Tensor im2col = q->forward(xq);
    cpu::set_int8_conv_onednn(true);  // the default
    testing::expect_close(onednn, im2col.to_vector<double>(), {1e-5, 1e-5}, "int8 conv" + what);
  }
  set_num_threads(before);
}

// Run with FRUGAL_NUM_THREADS=abc (or -3, 100000, 2x): the count is not taken silently from elsewhere; the
// first call that needs it throws, naming the variable, its value and the valid range, until
// set_num_threads() sets one.
TEST(Threads, MalformedEnvironmentValueIsReported) {
  if (!env_is_malformed()) GTEST_SKIP() << "run with a malformed FRUGAL_NUM_THREADS (tests/CMakeLists.txt)";
  const char* env = std::getenv("FRUGAL_NUM_THREADS");
  ASSERT_NE(env, nullptr);
  const std::string value = env;
  expect_error<Error>([] { num_threads(); }, {"FRUGAL_NUM_THREADS", "'" + value + "'", "[1, "});
  expect_error<Error>([] { parallel_sum(); }, {"FRUGAL_NUM_THREADS", "'" + value + "'"});
  set_num_threads(2);
  EXPECT_EQ(num_threads(), 2);
  EXPECT_EQ(parallel_sum(), double(1 << 20));
}

}  // namespace
}  // namespace frugal
