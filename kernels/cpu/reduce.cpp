// CPU reduction kernels. Three walks: a contiguous inner run (Eigen's vectorised sum), reduced dims outside
// contiguous kept dims (rows accumulated into a vector), and a general strided walk. Sums of f32 and the
// 16-bit floats accumulate in f32 lanes (the vectorised walks) or f64 (the general walk); integers in i64.
// The naive reference is tests/kernels/test_reduce.cpp's loop over every element in f64.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/op_table.h"
#include "core/parallel.h"
#include "kernels/cpu/register.h"

namespace frugal {
namespace {

using cpu::for_types;

// Offset (in elements) of output o's first input element.
int64_t kept_offset(const ReduceArgs& a, int64_t o) {
  int64_t off = 0;
  for (int d = a.kept_ndim - 1; d >= 0; --d) {
    off += (o % a.kept_sizes[d]) * a.kept_strides[d];
    o /= a.kept_sizes[d];
  }
  return off;
}

// Calls f(i, offset) for every reduced element i (in row-major order of the reduced dims) starting at base.
template <typename F>
void for_each_reduced(const ReduceArgs& a, int64_t base, F&& f) {
  if (a.red_ndim == 0) {
    f(int64_t(0), base);
    return;
  }
  const int inner = a.red_ndim - 1;
  const int64_t run = a.red_sizes[inner], step = a.red_strides[inner];
  int64_t idx[kMaxDims] = {};
  for (int64_t i = 0; i < a.n_reduce; i += run) {
    int64_t off = base;
    for (int d = 0; d < inner; ++d) off += idx[d] * a.red_strides[d];
    for (int64_t j = 0; j < run; ++j) f(i + j, off + j * step);
    for (int d = inner - 1; d >= 0; --d) {
      if (++idx[d] < a.red_sizes[d]) break;
      idx[d] = 0;
    }
  }
}

template <typename T>
using Wide = std::conditional_t<std::is_floating_point_v<acc_t<T>>, double, int64_t>;

// Grain for splitting outputs across threads: about kGrain input elements per chunk.
int64_t out_grain(const ReduceArgs& a) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, a.n_reduce));
}

template <typename T>
void sum_cpu(const ReduceArgs& a) {
  using C = acc_t<T>;
  const T* in = reinterpret_cast<const T*>(a.in);
  using Out = std::conditional_t<std::is_floating_point_v<C>, T, int64_t>;
  Out* res = reinterpret_cast<Out*>(a.out);
  const bool inner_contiguous = a.red_ndim == 1 && a.red_strides[0] == 1;
  if constexpr (std::is_same_v<T, C> && std::is_floating_point_v<C>) {
    if (inner_contiguous) {
      // One contiguous run per output: Eigen's vectorised sum; a single long run is split across threads.
      using Vec = Eigen::Map<const Eigen::Array<C, Eigen::Dynamic, 1>>;
      const int64_t n = a.n_reduce;
      if (a.n_out == 1 && n > 4 * kGrain) {
        const int64_t chunks = std::min<int64_t>(num_threads(), n / kGrain);
        std::vector<double> part(size_t(chunks), 0.0);
        const int64_t per = (n + chunks - 1) / chunks;
        parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
          for (int64_t c = b; c < e; ++c) {
            const int64_t lo = c * per, len = std::min(n, lo + per) - lo;
            part[size_t(c)] = double(Vec(reinterpret_cast<const C*>(in) + lo, len).sum());
          }
        });
        double s = 0;
        for (double p : part) s += p;
        res[0] = Out(s);
        return;
      }
      parallel_for(0, a.n_out, out_grain(a), [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o)
          res[o] = Out(Vec(reinterpret_cast<const C*>(in) + kept_offset(a, o), n).sum());
      });
      return;
    }
  }
  if constexpr (std::is_floating_point_v<C>) {
    if (a.kept_ndim == 1 && a.kept_strides[0] == 1 && a.red_ndim == 1 && a.n_out <= 1024 &&
        a.n_reduce * a.n_out >= 4 * kGrain) {
      // Many rows of a short contiguous kept run (a bias gradient [M, n] -> [n]): the rows split into chunks
      // (their number from the shape alone, so the sums do not depend on the thread count), each summed into
      // its own partial row, then the partial rows in order.
      const int64_t n = a.n_out, rows = a.n_reduce, step = a.red_strides[0];
      const int64_t chunks = std::min<int64_t>(16, rows * n / (2 * kGrain)),
                    per = (rows + chunks - 1) / chunks;
      std::vector<C> part(size_t(chunks * n), C(0));
      parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c) {
          C* acc = part.data() + c * n;
          for (int64_t r = c * per, r1 = std::min(rows, (c + 1) * per); r < r1; ++r) {
            const T* row = in + r * step;
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) acc[j] += C(row[j]);
          }
        }
      });
      for (int64_t j = 0; j < n; ++j) {
        C s = 0;
        for (int64_t c = 0; c < chunks; ++c) s += part[size_t(c * n + j)];
        res[j] = Out(s);
      }
      return;
    }
    if (a.kept_ndim == 1 && a.kept_strides[0] == 1) {
      // Reduced dims outside a contiguous kept run (e.g. a bias gradient): accumulate whole rows, split the
      // row across threads.
      parallel_for(0, a.n_out, 1024, [&](int64_t b, int64_t e) {
        constexpr int64_t kCols = 512;  // accumulators for a block of columns, on the stack
        for (int64_t c0 = b; c0 < e; c0 += kCols) {
          const int64_t w = std::min(kCols, e - c0);
          C acc[kCols] = {};
          for_each_reduced(a, 0, [&](int64_t, int64_t off) {
            const T* row = in + off + c0;
            for (int64_t j = 0; j < w; ++j) acc[j] += C(row[j]);
          });
          for (int64_t j = 0; j < w; ++j) res[c0 + j] = Out(acc[j]);
        }
      });
      return;
    }
  }
  parallel_for(0, a.n_out, out_grain(a), [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      Wide<T> s = 0;
      for_each_reduced(a, kept_offset(a, o), [&](int64_t, int64_t off) { s += Wide<T>(acc_t<T>(in[off])); });
      res[o] = Out(s);
    }
  });
}

// max / min (value) and argmax / argmin (index): NaN wins, as in PyTorch; ties keep the first index.
template <typename T, bool kMax, bool kIndex>
void extreme_cpu(const ReduceArgs& a) {
  using C = acc_t<T>;
  const T* in = reinterpret_cast<const T*>(a.in);
  parallel_for(0, a.n_out, out_grain(a), [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      C best = C(0);
      int64_t best_i = -1;
      bool nan = false;
      for_each_reduced(a, kept_offset(a, o), [&](int64_t i, int64_t off) {
        if (nan) return;
        const C v = C(in[off]);
        if constexpr (std::is_floating_point_v<C>) {
          if (std::isnan(v)) {
            nan = true;
            best = v;
            best_i = i;
            return;
          }
        }
        if (best_i < 0 || (kMax ? v > best : v < best)) {
          best = v;
          best_i = i;
        }
      });
      if constexpr (kIndex)
        reinterpret_cast<int64_t*>(a.out)[o] = best_i;
      else
        reinterpret_cast<T*>(a.out)[o] = T(best);
    }
  });
}

// Two passes per output (mean, then squared deviations) in f64: stable without Welford's extra divisions.
template <typename T>
void var_cpu(const ReduceArgs& a) {
  const T* in = reinterpret_cast<const T*>(a.in);
  T* out = reinterpret_cast<T*>(a.out);
  const double n = double(a.n_reduce), denom = n - a.correction;
  parallel_for(0, a.n_out, out_grain(a), [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      const int64_t base = kept_offset(a, o);
      double s = 0, ss = 0;
      for_each_reduced(a, base, [&](int64_t, int64_t off) { s += double(acc_t<T>(in[off])); });
      const double m = s / n;
      for_each_reduced(a, base, [&](int64_t, int64_t off) {
        const double d = double(acc_t<T>(in[off])) - m;
        ss += d * d;
      });
      out[o] = T(acc_t<T>(denom > 0 ? ss / denom : std::numeric_limits<double>::quiet_NaN()));
    }
  });
}

const bool kRegistered = [] {
  for_types<float, double, Half, BFloat16, int64_t, int32_t, uint8_t, bool>([](auto t) {
    using T = decltype(t);
    constexpr DType dt = dtype_v<T>;
    op_sum.set(DeviceType::CPU, dt, sum_cpu<T>);
    op_max.set(DeviceType::CPU, dt, extreme_cpu<T, true, false>);
    op_min.set(DeviceType::CPU, dt, extreme_cpu<T, false, false>);
    op_argmax.set(DeviceType::CPU, dt, extreme_cpu<T, true, true>);
    op_argmin.set(DeviceType::CPU, dt, extreme_cpu<T, false, true>);
  });
  for_types<float, double, Half, BFloat16>(
      [](auto t) { op_var.set(DeviceType::CPU, dtype_v<decltype(t)>, var_cpu<decltype(t)>); });
  return true;
}();

}  // namespace
}  // namespace frugal
