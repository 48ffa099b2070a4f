// CPU softmax / log-softmax over contiguous rows: max, then sum of exp(x - max), then the outputs; and their
// backward (a row's sum, then the outputs). f32/f64 rows use Eigen's vectorised exp (through cpu::exp_into);
// f16/bf16 rows compute in f32 element by element.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "core/op_table_softmax.h"
#include "core/parallel.h"
#include "kernels/cpu/map.h"
#include "kernels/cpu/register.h"
#include "kernels/cpu/vec.h"

namespace frugal {
namespace {

template <typename T>
void softmax_cpu(const SoftmaxArgs& s) {
  using C = acc_t<T>;
  const T* in = static_cast<const T*>(s.in);
  T* out = static_cast<T*>(s.out);
  const int64_t cols = s.cols;
  parallel_for(0, s.rows, items_per_grain(cols), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* x = in + r * cols;
      T* y = out + r * cols;
      if constexpr (std::is_same_v<T, C>) {
        // The next row (its first 16 KiB: the hardware's prefetcher follows a longer one) on its way from
        // memory while this one's exps are computed (rows of 1024 on a Xeon: 0.37-0.44 of the copy's rate
        // -> 0.51-0.55; the same for the backward's two rows was slower).
        if (r + 1 < e) cpu::prefetch_rows(x + cols, 1, std::min<int64_t>(cols, 16384 / sizeof(T)), cols);
        Eigen::Map<const Eigen::Array<C, Eigen::Dynamic, 1>> xv(x, cols);
        Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>> yv(y, cols);
        const C m = xv.maxCoeff();
        // A row of -inf (or with +inf/nan) gives nan through x - m, as in PyTorch.
        cpu::exp_into(yv, xv - m);
        const C sum = yv.sum();
        if (s.log)
          yv = (xv - m) - std::log(sum);
        else
          yv *= C(1) / sum;
      } else {
        float m = -INFINITY;
        for (int64_t j = 0; j < cols; ++j) m = std::max(m, float(x[j]));
        float sum = 0;
        for (int64_t j = 0; j < cols; ++j) sum += std::exp(float(x[j]) - m);
        const float log_sum = std::log(sum), inv = 1.0f / sum;
        for (int64_t j = 0; j < cols; ++j)
          y[j] = T(s.log ? float(x[j]) - m - log_sum : std::exp(float(x[j]) - m) * inv);
      }
    }
  });
}

// op_softmax_backward: per row, the sum (of g y, or of g for log-softmax), then the outputs.
template <typename T>
void softmax_backward_cpu(const SoftmaxBackwardArgs& s) {
  using C = acc_t<T>;
  const T* ys = static_cast<const T*>(s.y);
  const T* gs = static_cast<const T*>(s.grad);
  T* dxs = static_cast<T*>(s.dx);
  const int64_t cols = s.cols;
  parallel_for(0, s.rows, items_per_grain(cols), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* y = ys + r * cols;
      const T* g = gs + r * cols;
      T* dx = dxs + r * cols;
      if constexpr (std::is_same_v<T, C>) {
        Eigen::Map<const Eigen::Array<C, Eigen::Dynamic, 1>> yv(y, cols), gv(g, cols);
        Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>> dv(dx, cols);
        if (s.log) {
          const C sum = gv.sum();
          cpu::exp_into(dv, yv);
          dv = gv - dv * sum;
        } else {
          const C dot = (gv * yv).sum();
          dv = yv * (gv - dot);
        }
      } else {
        float sum = 0;
        for (int64_t j = 0; j < cols; ++j) sum += s.log ? float(g[j]) : float(g[j]) * float(y[j]);
        for (int64_t j = 0; j < cols; ++j)
          dx[j] = T(s.log ? float(g[j]) - std::exp(float(y[j])) * sum : float(y[j]) * (float(g[j]) - sum));
      }
    }
  });
}

const bool kRegistered = [] {
  cpu::for_types<float, double, Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_softmax.set(DeviceType::CPU, dtype_v<T>, softmax_cpu<T>);
    op_softmax_backward.set(DeviceType::CPU, dtype_v<T>, softmax_backward_cpu<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
