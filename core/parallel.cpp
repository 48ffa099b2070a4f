// The thread pool's size: FRUGAL_NUM_THREADS at load, set_num_threads() after (core/parallel.h).
#include "core/parallel.h"

#include <strings.h>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "core/error.h"

namespace frugal {

namespace {

// A malformed FRUGAL_NUM_THREADS: the message every call needing the thread count throws, until
// set_num_threads() clears it. Written once at load, before any other thread can read it.
std::string g_env_error;
std::atomic<bool> g_env_bad{false};

// Applies FRUGAL_NUM_THREADS once, when the library loads, before any parallel region runs; never throws.
const bool kEnvApplied = [] {
  try {
    if (const int n = detail::num_threads_from_env(std::getenv("FRUGAL_NUM_THREADS")); n > 0)
      omp_set_num_threads(n);
  } catch (const Error& e) {
    g_env_error = e.what();
    g_env_bad.store(true);
  }
  return true;
}();

}  // namespace

int max_threads() {
  static const int n = std::max(16, 4 * int(std::max(1u, std::thread::hardware_concurrency())));
  return n;
}

int detail::num_threads_from_env(const char* value) {
  if (value == nullptr || *value == '\0') return 0;
  int n = 0;
  const char* end = value + std::strlen(value);
  const auto [ptr, ec] = std::from_chars(value, end, n);
  FRUGAL_CHECK(ec == std::errc() && ptr == end && n >= 1 && n <= max_threads(), "FRUGAL_NUM_THREADS='", value,
               "' is not a thread count; expected an integer in [1, ", max_threads(),
               "] (at most 4 times the hardware threads), or unset for OpenMP's default. Fix the variable, "
               "or call set_num_threads()");
  return n;
}

int detail::pool_threads() {
  if (g_env_bad.load(std::memory_order_acquire)) [[unlikely]]
    throw Error(g_env_error);
  return omp_get_max_threads();
}

int64_t detail::small_product_grain() {
  static const int64_t grain = [] {
    const char* policy = std::getenv("OMP_WAIT_POLICY");  // read once, as libgomp reads it at load
    return policy && strcasecmp(policy, "passive") == 0 ? int64_t(1) << 20 : kGrain;
  }();
  return grain;
}

int num_threads() { return detail::pool_threads(); }

void set_num_threads(int n) {
  FRUGAL_CHECK(n >= 1 && n <= max_threads(), "set_num_threads: ", n,
               " threads is out of range; expected [1, ", max_threads(), "] (at most 4 times the ",
               std::thread::hardware_concurrency(), " hardware threads, and at least 16)");
  omp_set_num_threads(n);
  g_env_bad.store(false, std::memory_order_release);
}

}  // namespace frugal
