// CPU fused softmax + cross-entropy (CrossEntropyArgs in core/op_table.h): forward and backward each read a
// row of logits once. The reference they are tested against is the composite in nn/functional_losses.cpp.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "core/op_table_softmax.h"
#include "core/parallel.h"
#include "kernels/cpu/register.h"

namespace frugal {
namespace {

// Rows are processed in chunks small enough to stay in L1, so a chunk's max and its sum of exponentials read
// it from cache: one pass over the row in memory, with an online (rescaled) log-sum-exp across chunks.
constexpr int64_t kChunk = 512;

template <typename C>
using Vec = Eigen::Array<C, Eigen::Dynamic, 1>;

// A chunk of a row as a map of C values: the row itself when T is C, else converted into buf.
template <typename T, typename C>
Eigen::Map<const Vec<C>> chunk_of(const T* x, int64_t n, C* buf) {
  if constexpr (std::is_same_v<T, C>) {
    (void)buf;
    return Eigen::Map<const Vec<C>>(x, n);
  } else {
    for (int64_t j = 0; j < n; ++j) buf[j] = C(x[j]);
    return Eigen::Map<const Vec<C>>(buf, n);
  }
}

// logits [rows, classes], target [rows] -> loss [rows], lse [rows] (in C)
template <typename T>
void cross_entropy_forward_cpu(const CrossEntropyArgs& a) {
  using C = acc_t<T>;
  const T* logits = static_cast<const T*>(a.logits);
  C* loss = static_cast<C*>(a.loss);
  C* lse = static_cast<C*>(a.lse);
  const int64_t classes = a.classes;
  const C eps = C(a.label_smoothing), keep = C(1) - eps;
  parallel_for(0, a.rows, items_per_grain(classes), [&](int64_t b, int64_t e) {
    alignas(64) C buf[kChunk];
    for (int64_t r = b; r < e; ++r) {
      const int64_t t = a.target[r];
      if (t == a.ignore_index) {
        loss[r] = lse[r] = C(0);
        continue;
      }
      const T* x = logits + r * classes;
      C m = -INFINITY, s = 0, sum_x = 0;
      for (int64_t j0 = 0; j0 < classes; j0 += kChunk) {
        const int64_t n = std::min(kChunk, classes - j0);
        const auto xv = chunk_of<T, C>(x + j0, n, buf);
        const C cm = std::max(m, xv.maxCoeff());
        // exp(-inf - -inf) would be nan: a row that is -inf so far contributes nothing.
        if (cm != -INFINITY) {
          s = (m == -INFINITY ? C(0) : s * std::exp(m - cm)) + (xv - cm).exp().sum();
        }
        m = cm;
        if (eps != C(0)) sum_x += xv.sum();
      }
      lse[r] = m + std::log(s);
      loss[r] = lse[r] - keep * C(x[t]) - (eps != C(0) ? eps / C(classes) * sum_x : C(0));
    }
  });
}

// logits [rows, classes], target [rows], lse [rows], grad [rows] -> d_logits [rows, classes]
template <typename T>
void cross_entropy_backward_cpu(const CrossEntropyArgs& a) {
  using C = acc_t<T>;
  const T* logits = static_cast<const T*>(a.logits);
  const C* lse = static_cast<const C*>(a.lse);
  const C* grad = static_cast<const C*>(a.grad);
  T* d_logits = static_cast<T*>(a.d_logits);
  const int64_t classes = a.classes;
  const C eps = C(a.label_smoothing), keep = C(1) - eps, off = eps / C(classes);
  parallel_for(0, a.rows, items_per_grain(classes), [&](int64_t b, int64_t e) {
    alignas(64) C buf[kChunk];
    for (int64_t r = b; r < e; ++r) {
      const int64_t t = a.target[r];
      const T* x = logits + r * classes;
      T* d = d_logits + r * classes;
      if (t == a.ignore_index) {
        std::fill(d, d + classes, T(0));
        continue;
      }
      const C g = grad[r], l = lse[r];
      for (int64_t j0 = 0; j0 < classes; j0 += kChunk) {
        const int64_t n = std::min(kChunk, classes - j0);
        const auto xv = chunk_of<T, C>(x + j0, n, buf);
        if constexpr (std::is_same_v<T, C>) {
          Eigen::Map<Vec<C>>(d + j0, n) = ((xv - l).exp() - off) * g;
        } else {
          Eigen::Map<Vec<C>>(buf, n) = ((xv - l).exp() - off) * g;
          for (int64_t j = 0; j < n; ++j) d[j0 + j] = T(buf[j]);
        }
      }
      // The target's term, from the stored value so f16/bf16 round once.
      d[t] = T((std::exp(C(x[t]) - l) - off - keep) * g);
    }
  });
}

const bool kRegistered = [] {
  cpu::for_types<float, double, Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_cross_entropy.set(DeviceType::CPU, dtype_v<T>, cross_entropy_forward_cpu<T>);
    op_cross_entropy_backward.set(DeviceType::CPU, dtype_v<T>, cross_entropy_backward_cpu<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
