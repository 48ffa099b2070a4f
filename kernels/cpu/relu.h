// relu's rule over a run in place, for the CPU kernels that apply a ReLU after a product (linear_relu,
// conv2d_relu and its pooled form): v < 0 ? 0 : v, so that a NaN and a -0 come through as relu lets them
// (Note [linear_relu keeps a NaN], kernels/cpu/linear.cpp). Internal to kernels/cpu.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/parallel.h"

namespace frugal::cpu {

// y[i] = y[i] < 0 ? 0 : y[i], i < n; T: a float type, or a 16-bit float compared through f32.
template <typename T>
void relu_in_place(T* y, int64_t n) {
  parallel_for(0, n, parallel_grain(), [&](int64_t b, int64_t e) {
    if constexpr (std::is_floating_point_v<T>) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) y[i] = y[i] < T(0) ? T(0) : y[i];
    } else {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) y[i] = float(y[i]) < 0.0f ? T(0.0f) : y[i];
    }
  });
}

}  // namespace frugal::cpu
