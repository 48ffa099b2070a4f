// CPU kernels of the fused attention probabilities (op_attention_softmax, formulas in core/op_table.h): one
// pass per row over its allowed prefix only; the scaled and masked scores never exist in memory. f32/f64 rows
// use Eigen's vectorised exp; f16/bf16 rows compute in f32 element by element.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/op_table_attention.h"
#include "core/parallel.h"
#include "kernels/cpu/register.h"

namespace frugal {
namespace {

// Row r of a [rows, t] input reads columns [0, allowed(r)).
inline int64_t allowed(const AttentionSoftmaxArgs& a, int64_t r) { return a.causal ? r % a.t + 1 : a.t; }

// x, y: [rows, t]
template <typename T>
void attention_softmax_forward_cpu(const AttentionSoftmaxArgs& a) {
  using C = acc_t<T>;
  const T* in = static_cast<const T*>(a.x);
  T* out = static_cast<T*>(a.y);
  const int64_t t = a.t;
  const C scale = C(a.scale);
  parallel_for(0, a.rows, items_per_grain(t), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* x = in + r * t;
      T* y = out + r * t;
      const int64_t n = allowed(a, r);
      if constexpr (std::is_same_v<T, C>) {
        Eigen::Map<const Eigen::Array<C, Eigen::Dynamic, 1>> xv(x, n);
        Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>> yv(y, n);
        // max(scale x) is scale max(x) for scale > 0 and scale min(x) otherwise.
        const C m = scale >= 0 ? scale * xv.maxCoeff() : scale * xv.minCoeff();
        yv = (xv * scale - m).exp();
        yv *= C(1) / yv.sum();
      } else {
        float m = -INFINITY;
        for (int64_t j = 0; j < n; ++j) m = std::max(m, scale * float(x[j]));
        float sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += std::exp(scale * float(x[j]) - m);
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; ++j) y[j] = T(std::exp(scale * float(x[j]) - m) * inv);
      }
      std::fill(y + n, y + t, T(0));
    }
  });
}

// y, dy, dx: [rows, t]
template <typename T>
void attention_softmax_backward_cpu(const AttentionSoftmaxArgs& a) {
  using C = acc_t<T>;
  const T* ys = static_cast<const T*>(a.y);
  const T* dys = static_cast<const T*>(a.dy);
  T* dxs = static_cast<T*>(a.dx);
  const int64_t t = a.t;
  const C scale = C(a.scale);
  parallel_for(0, a.rows, items_per_grain(t), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* y = ys + r * t;
      const T* dy = dys + r * t;
      T* dx = dxs + r * t;
      const int64_t n = allowed(a, r);
      if constexpr (std::is_same_v<T, C>) {
        Eigen::Map<const Eigen::Array<C, Eigen::Dynamic, 1>> yv(y, n), dyv(dy, n);
        Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>> dxv(dx, n);
        const C dot = (yv * dyv).sum();
        dxv = scale * yv * (dyv - dot);
      } else {
        float dot = 0;
        for (int64_t j = 0; j < n; ++j) dot += float(y[j]) * float(dy[j]);
        for (int64_t j = 0; j < n; ++j) dx[j] = T(scale * float(y[j]) * (float(dy[j]) - dot));
      }
      std::fill(dx + n, dx + t, T(0));
    }
  });
}

const bool kRegistered = [] {
  cpu::for_types<float, double, Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_attention_softmax.set(DeviceType::CPU, dtype_v<T>, attention_softmax_forward_cpu<T>);
    op_attention_softmax_backward.set(DeviceType::CPU, dtype_v<T>, attention_softmax_backward_cpu<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
