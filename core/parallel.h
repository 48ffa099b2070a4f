// Threads: one OpenMP pool shared with oneDNN and Eigen. Work smaller than a grain stays on the calling
// thread, so small tensors pay no fork/join.
//
//   parallel_for(0, n, parallel_grain(), [&](int64_t begin, int64_t end) {
//     for (i = begin; i < end; ++i) ...;
//   });
//   set_num_threads(4);
//
// FRUGAL_NUM_THREADS, read when the library loads, sets the pool size: an integer in [1, max_threads()]. A
// library must not throw while it loads, so a malformed value (abc, -3, 100000) is kept as an error that the
// first call needing the thread count throws, naming the variable, its value and the valid range:
// num_threads() and every parallel region (parallel_for, the CPU kernels that fork), until set_num_threads()
// sets a count.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace frugal {

// Elements below which an elementwise loop runs on one thread while idle threads spin (OpenMP's default
// waiting): a fork/join costs about as much as this work there (0.6 us on a 2-core Zen 4).
inline constexpr int64_t kGrain = 32768;
// The same under OMP_WAIT_POLICY=PASSIVE, where the threads sleep between parallel regions and waking them
// costs 30-40 us a region on the same machine (Note [passive waiting and the grain], core/parallel.cpp).
inline constexpr int64_t kPassiveGrain = int64_t(1) << 18;

// The grain of a loop over elements (or rows of them) by the waiting policy: kGrain, or kPassiveGrain under
// OMP_WAIT_POLICY=PASSIVE (read once, as libgomp reads it at load). A loop whose items are heavy (an image,
// a head) passes a grain of its own instead.
int64_t parallel_grain();
// Items per chunk of a loop whose items each cost about `elements` elements' work: a grain's worth, and at
// least one.
inline int64_t items_per_grain(int64_t elements) {
  return std::max<int64_t>(1, parallel_grain() / std::max<int64_t>(elements, 1));
}

// The most threads set_num_threads() accepts: 4 times the hardware threads, and at least 16. More than the
// cores only slows compute down, and far more makes libgomp abort when it cannot start them.
int max_threads();
int num_threads();            // throws Error for a malformed FRUGAL_NUM_THREADS (see above)
void set_num_threads(int n);  // throws Error naming the valid range for n outside [1, max_threads()]

namespace detail {
// The threads a parallel region may use (omp_get_max_threads()); throws what num_threads() throws.
int pool_threads();
// The work (multiply-adds) below which a small product runs on one thread: the few rows' dot products of a
// layer's forward (kernels/cpu/linear.cpp, quant_few_rows.cpp, sparse.cpp), which read each weight once.
// kGrain while idle threads spin (OpenMP's default waiting: a fork/join costs about that much work); 2^20
// under OMP_WAIT_POLICY=PASSIVE, where waking the sleeping threads costs tens of microseconds, more than such
// a product takes on one thread (W1's MLP on one row: 90-160 us on 2 threads, 14 us on one).
int64_t small_product_grain();
// Whether OMP_WAIT_POLICY asks for passive waiting (read once, as libgomp reads it at load).
bool passive_waiting();

// Multiply-adds below which a product runs on one thread under passive waiting, by the speed of its
// arithmetic (Note [a product on one thread under passive waiting], core/parallel.cpp).
inline constexpr int64_t kPassiveF32Product = int64_t(1) << 22;
inline constexpr int64_t kPassiveBf16Product = int64_t(1) << 23;
inline constexpr int64_t kPassiveInt8Product = int64_t(1) << 24;

// While it lives, the parallel regions the calling thread starts (oneDNN's included) have one thread, when
// passive waiting is on, no region encloses the caller, and the product's `macs` are below
// `one_thread_below`; otherwise it does nothing. oneDNN's primitives fix their thread count when they are
// made, so a plan is made, as well as run, under such a scope.
class OneThreadProduct {
 public:
  OneThreadProduct(int64_t macs, int64_t one_thread_below);
  ~OneThreadProduct();
  OneThreadProduct(const OneThreadProduct&) = delete;
  OneThreadProduct& operator=(const OneThreadProduct&) = delete;

 private:
  int restore_ = 0;  // the thread count to set back, 0 for none
};
// The thread count a value of FRUGAL_NUM_THREADS asks for, 0 for unset or empty; throws Error naming the
// variable, the value and the valid range otherwise. Exposed for tests.
int num_threads_from_env(const char* value);
}  // namespace detail

template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& f) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  const int64_t max_chunks = (n + grain - 1) / std::max<int64_t>(grain, 1);
  const int nt = int(std::min<int64_t>(max_chunks, detail::pool_threads()));
  if (nt <= 1 || omp_in_parallel()) {
    f(begin, end);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = omp_get_thread_num(), nthreads = omp_get_num_threads();
    const int64_t chunk = (n + nthreads - 1) / nthreads;
    const int64_t b = begin + t * chunk, e = std::min(end, b + chunk);
    if (b < e) f(b, e);
  }
}

}  // namespace frugal
