// Naive reference kernels: the plainest loops, in f64, that the fast kernels are tested and benchmarked
// against.
#pragma once

#include "core/op_table.h"

namespace frugal::reference {

// C = alpha * A @ B + beta * C over GemmArgs, each element summed in f64.
template <typename T>
void gemm(const GemmArgs& g) {
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < g.k; ++p)
          s += double(static_cast<const T*>(g.a)[b * g.a_batch + i * g.a_row + p * g.a_col]) *
               double(static_cast<const T*>(g.b)[b * g.b_batch + p * g.b_row + j * g.b_col]);
        T& c = static_cast<T*>(g.c)[b * g.c_batch + i * g.c_row + j];
        c = T(g.alpha * s + (g.beta == 0 ? 0.0 : g.beta * double(c)));
      }
}

}  // namespace frugal::reference

namespace frugal {
// The Eigen f32 GEMM (the build's fallback when oneDNN is absent), callable beside the registered kernel.
void gemm_f32_eigen_cpu(const GemmArgs& g);
}  // namespace frugal
