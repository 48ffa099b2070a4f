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

bool detail::passive_waiting() {
  static const bool passive = [] {
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    return policy && strcasecmp(policy, "passive") == 0;
  }();
  return passive;
}

int64_t detail::small_product_grain() { return passive_waiting() ? int64_t(1) << 20 : kGrain; }

// Note [passive waiting and the grain]
// Under OpenMP's default waiting the pool's threads spin a while after a parallel region, and the next
// region starts them in about 0.6 us (an empty region, 2 threads of a 2-core Zen 4). Under
// OMP_WAIT_POLICY=PASSIVE they sleep at once, and every region wakes them: 32-41 us a region on the same
// machine, whatever the gap between regions. So a loop worth forking under the default waiting (kGrain
// elements, a few microseconds) is not worth it there. Measured on that machine, passive (medians of 301,
// one thread against two):
// - an f32 add of 2^18 elements 33 us against 56, 2^19 66 against 91, 2^20 191 against 168;
// - a softmax over rows of 256: 2^17 elements 75 against 96, 2^18 150 against 147, 2^19 302 against 239.
// The break-even moves with the work an element costs; kPassiveGrain, 2^18, is the size at which neither
// loses much. An int8 MLP's forward (784 -> 256 -> 256 -> 10, dynamic) on 256 rows went from 12 parallel
// regions to oneDNN's 3, and from 705-712 to 381-384 us (64 rows: 321-425 to 202 us); W1's, W2's and W3's
// training steps under passive waiting moved within noise (4 alternated rounds: W1 1.34-2.13 ms before,
// 1.34-1.35 after; W2 8.90-9.24 and 8.93-9.26; W3 65.1-65.8 and 65.5-69.3). Under the default waiting
// nothing changes.
int64_t parallel_grain() { return detail::passive_waiting() ? kPassiveGrain : kGrain; }

// Note [a product on one thread under passive waiting]
// oneDNN's primitives and dnnl_sgemm start a parallel region for each call, which under passive waiting
// wakes the sleeping threads (Note [passive waiting and the grain]): a product that takes less than about
// twice that wake-up on one thread is faster there alone. So under passive waiting a product below
// kPassiveF32Product multiply-adds (2^22: 72 us at one thread's f32 ceiling of 117 GFLOP/s on a Zen 4, two
// wake-ups), kPassiveBf16Product (bf16 dot products, twice the rate) or kPassiveInt8Product (VNNI, four
// times) runs with one thread: the scope sets the calling thread's OpenMP thread count to 1 around the
// call, and around the making of a oneDNN plan, since a primitive keeps the thread count it was made with
// (the plan caches are keyed on the shape, which decides the scope, so the CPU kernels and their meta twins
// still share each plan). The decision is per call: a GEMM run as several calls (panels, batch entries)
// starts a region for each, so each call's own work is what a second thread would share. Measured on a
// 2-core Zen 4 under passive waiting (thresholds 4x lower, as here, 4x higher, and none):
// - W1's training step: 1.22-1.36, 1.22-1.38, 1.32-1.40 and 1.34-1.56 ms (its 256 -> 10 layer's three
//   products run alone);
// - W1's MLP forward (medians of 1001): int8 on 8 rows 120-165 -> 30 us (OpenMP's default waiting: 26-48),
//   on 64 rows 275-277 -> 109 us; f32 on 64 rows 313 -> 266-270 us.
// A convolution counts the direct algorithm's multiply-adds (kernels/cpu/conv_onednn.cpp, and the int8
// convolution's plans in kernels/cpu/quant.cpp), whatever kernel oneDNN picks, a chunk of images at a time.
// W2's CNN forward (medians of 301, 3 rounds alternated with the library before): f32 on one image 390-413
// -> 105-148 us (on one thread 103, under the default waiting 74), on 4 images 668-691 -> 432-553 us; its
// static int8 form on one image 352-380 -> 59-90 us, on 4 images 575-619 -> 264-378 us; on 16 images
// within noise. W2's training step (batch 64: every convolution above the threshold; in its evaluation the
// first layer's chunks of 10 images are below) 11.4-14.2 -> 10.9-12.0 ms, within noise; 2^24 and 2^26 as
// the f32 threshold were no better.
// Under the default waiting nothing changes.
detail::OneThreadProduct::OneThreadProduct(int64_t macs, int64_t one_thread_below) {
  if (!passive_waiting() || macs >= one_thread_below || omp_in_parallel()) return;
  if (const int n = omp_get_max_threads(); n > 1) {
    omp_set_num_threads(1);
    restore_ = n;
  }
}

detail::OneThreadProduct::~OneThreadProduct() {
  if (restore_ > 0) omp_set_num_threads(restore_);
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
