// CPU kernels of the fused batch norm (op_batch_norm, formulas in core/batch_norm.h), threads over channels:
// each channel's n planes of hw elements are read twice in the training forward (the mean, then the centred
// squares: two passes keep the variance exact where one-pass sums would cancel) and once more for y, and
// twice in the backward (the two sums, then dx). f16/bf16 convert element by element and accumulate in f32.
// The reference they are tested against is the composite of mean, var and elementwise ops it replaced
// (tests/nn/test_batch_norm.cpp).
#include <algorithm>
#include <cmath>

#include "core/batch_norm.h"
#include "core/parallel.h"
#include "kernels/cpu/register.h"

namespace frugal {
namespace {

int64_t channel_grain(const BatchNormArgs& a) { return items_per_grain(a.n * a.hw); }

template <typename T>
void batch_norm_forward_cpu(const BatchNormArgs& a) {
  using C = acc_t<T>;
  const T* xs = static_cast<const T*>(a.x);
  T* ys = static_cast<T*>(a.y);
  const C* w = static_cast<const C*>(a.weight);
  const C* b = static_cast<const C*>(a.bias);
  C* means = static_cast<C*>(a.mean);
  C* invstds = static_cast<C*>(a.invstd);
  const int64_t hw = a.hw;
  const C inv_m = C(1) / C(a.n * a.hw);
  parallel_for(0, a.c, channel_grain(a), [&](int64_t kb, int64_t ke) {
    for (int64_t k = kb; k < ke; ++k) {
      C mu, is;
      if (a.training) {
        C sum = 0;
        for (int64_t i = 0; i < a.n; ++i) {
          const T* x = xs + (i * a.c + k) * hw;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < hw; ++j) sum += C(x[j]);
        }
        mu = sum * inv_m;
        C ss = 0;
        for (int64_t i = 0; i < a.n; ++i) {
          const T* x = xs + (i * a.c + k) * hw;
#pragma omp simd reduction(+ : ss)
          for (int64_t j = 0; j < hw; ++j) {
            const C d = C(x[j]) - mu;
            ss += d * d;
          }
        }
        is = C(1) / std::sqrt(ss * inv_m + C(a.eps));
        means[k] = mu;
        invstds[k] = is;
      } else {
        mu = means[k];
        is = invstds[k];
      }
      const C scale = w ? is * w[k] : is, shift = b ? b[k] : C(0);
      for (int64_t i = 0; i < a.n; ++i) {
        const T* x = xs + (i * a.c + k) * hw;
        T* y = ys + (i * a.c + k) * hw;
#pragma omp simd
        for (int64_t j = 0; j < hw; ++j) y[j] = T((C(x[j]) - mu) * scale + shift);
      }
    }
  });
}

template <typename T>
void batch_norm_backward_cpu(const BatchNormArgs& a) {
  using C = acc_t<T>;
  const T* xs = static_cast<const T*>(a.x);
  const T* dys = static_cast<const T*>(a.dy);
  T* dxs = static_cast<T*>(a.dx);
  const C* w = static_cast<const C*>(a.weight);
  const C* means = static_cast<const C*>(a.mean);
  const C* invstds = static_cast<const C*>(a.invstd);
  C* dw = static_cast<C*>(a.dweight);
  C* db = static_cast<C*>(a.dbias);
  const int64_t hw = a.hw;
  const C inv_m = C(1) / C(a.n * a.hw);
  parallel_for(0, a.c, channel_grain(a), [&](int64_t kb, int64_t ke) {
    for (int64_t k = kb; k < ke; ++k) {
      const C mu = means[k], is = invstds[k];
      C sum_dy = 0, sum_dy_xh = 0;
      for (int64_t i = 0; i < a.n; ++i) {
        const T* x = xs + (i * a.c + k) * hw;
        const T* dy = dys + (i * a.c + k) * hw;
#pragma omp simd reduction(+ : sum_dy, sum_dy_xh)
        for (int64_t j = 0; j < hw; ++j) {
          const C d = C(dy[j]);
          sum_dy += d;
          sum_dy_xh += d * (C(x[j]) - mu) * is;
        }
      }
      if (dw) dw[k] = sum_dy_xh;
      if (db) db[k] = sum_dy;
      if (!dxs) continue;
      const C scale = w ? is * w[k] : is;
      const C mean_dy = a.training ? sum_dy * inv_m : C(0),
              mean_dy_xh = a.training ? sum_dy_xh * inv_m : C(0);
      for (int64_t i = 0; i < a.n; ++i) {
        const T* x = xs + (i * a.c + k) * hw;
        const T* dy = dys + (i * a.c + k) * hw;
        T* dx = dxs + (i * a.c + k) * hw;
#pragma omp simd
        for (int64_t j = 0; j < hw; ++j) {
          const C xh = (C(x[j]) - mu) * is;
          dx[j] = T(scale * (C(dy[j]) - mean_dy - xh * mean_dy_xh));
        }
      }
    }
  });
}

const bool kRegistered = [] {
  cpu::for_types<float, double, Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_batch_norm.set(DeviceType::CPU, dtype_v<T>, batch_norm_forward_cpu<T>);
    op_batch_norm_backward.set(DeviceType::CPU, dtype_v<T>, batch_norm_backward_cpu<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
