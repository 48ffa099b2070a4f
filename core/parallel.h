// Threads: one OpenMP pool shared with oneDNN and Eigen. Work smaller than a grain stays on the calling
// thread, so small tensors pay no fork/join. FRUGAL_NUM_THREADS (read at load) sets the pool size.
//
//   parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) { for (i = begin; i < end; ++i) ...; });
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace frugal {

// Elements below which an elementwise loop runs on one thread (a fork/join costs about as much as this work).
inline constexpr int64_t kGrain = 32768;

int num_threads();
void set_num_threads(int n);  // throws Error for n < 1

template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& f) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  const int64_t max_chunks = (n + grain - 1) / std::max<int64_t>(grain, 1);
  const int nt = int(std::min<int64_t>(max_chunks, omp_get_max_threads()));
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
