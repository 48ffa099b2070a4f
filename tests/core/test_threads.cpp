// The thread count (core/parallel.h): set_num_threads bounds it, and a malformed FRUGAL_NUM_THREADS is
// reported, not ignored. tests/CMakeLists.txt runs this program again with malformed values in the
// environment (test_core_threads_bad_env_*).
#include <cstdlib>
#include <string>

#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;

// A sum over a long run, so that it forks (parallel_for with more than one chunk).
double parallel_sum() { return sum(ones({1 << 20})).item<double>(); }

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
