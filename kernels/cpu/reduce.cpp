// CPU reduction kernels. Sums take three walks: a contiguous inner run (vectorised blocks), reduced dims
// outside contiguous kept dims (rows added into columns), and a general strided walk; all three are pairwise
// sums (Note [pairwise sums], kernels/cpu/cascade.h), in f32 for f32 and the 16-bit floats (f64 on the
// general walk), f64 for f64, exact i64 for integers. The naive reference is tests/kernels/test_reduce.cpp's
// loop over every element in f64.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/op_table_reduce.h"
#include "core/parallel.h"
#include "kernels/cpu/cascade.h"
#include "kernels/cpu/register.h"
#include "kernels/math.h"

namespace frugal {
namespace {

using cpu::for_types;

// Offset (in elements) of element i, in row-major order, of the dims (sizes, strides).
int64_t offset_of(int64_t i, int ndim, const int64_t* sizes, const int64_t* strides) {
  int64_t off = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    off += (i % sizes[d]) * strides[d];
    i /= sizes[d];
  }
  return off;
}

// Offset (in elements) of output o's first input element.
int64_t kept_offset(const ReduceArgs& a, int64_t o) {
  return offset_of(o, a.kept_ndim, a.kept_sizes, a.kept_strides);
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

// Grain for splitting outputs across threads: about parallel_grain() input elements per chunk.
int64_t out_grain(const ReduceArgs& a) { return items_per_grain(a.n_reduce); }

// Offset (in elements) of reduced element r (in row-major order of the reduced dims) from its output's first.
int64_t reduced_offset(const ReduceArgs& a, int64_t r) {
  return offset_of(r, a.red_ndim, a.red_sizes, a.red_strides);
}

// Floating sums follow Note [pairwise sums] (kernels/cpu/cascade.h) on every walk, so they are accurate and
// the same for any thread count.
template <typename T>
void sum_cpu(const ReduceArgs& a) {
  using C = acc_t<T>;
  const T* in = reinterpret_cast<const T*>(a.in);
  using Out = std::conditional_t<std::is_floating_point_v<C>, T, int64_t>;
  Out* res = reinterpret_cast<Out*>(a.out);
  if constexpr (std::is_floating_point_v<C>) {
    if (a.red_ndim == 1 && a.red_strides[0] == 1) {
      // One contiguous run per output (a full sum, rows): vectorised blocks, threads over runs or chunks.
      cpu::run_sums<C, T>(
          a.n_out, a.n_reduce, [&](int64_t o) { return in + kept_offset(a, o); },
          [&](int64_t o, C s) { res[o] = Out(s); });
      return;
    }
    if (a.kept_ndim == 1 && a.kept_strides[0] == 1) {
      // Reduced dims outside a contiguous kept run (a bias gradient [M, n] -> [n]): rows added into columns.
      std::vector<C> cols(size_t(a.n_out));
      const int64_t step = a.red_ndim == 1 ? a.red_strides[0] : 0;
      cpu::column_sums<C>(a.n_reduce, a.n_out, cols.data(), [&](int64_t r, C* acc, int64_t c0, int64_t c1) {
        const T* row = in + (a.red_ndim == 1 ? r * step : reduced_offset(a, r)) + c0;
#pragma omp simd
        for (int64_t j = 0; j < c1 - c0; ++j) acc[j] += C(row[j]);
      });
      for (int64_t j = 0; j < a.n_out; ++j) res[j] = Out(cols[size_t(j)]);
      return;
    }
    // Any other layout, one output at a time: blocks of kSumBlock elements summed in f64 (in order), merged
    // pairwise.
    parallel_for(0, a.n_out, out_grain(a), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        cpu::PairwiseSum<double> s;
        double block = 0;
        int64_t in_block = 0;
        for_each_reduced(a, kept_offset(a, o), [&](int64_t, int64_t off) {
          block += double(C(in[off]));
          if (++in_block == cpu::kSumBlock) {
            s.add(block);
            block = 0;
            in_block = 0;
          }
        });
        if (in_block > 0) s.add(block);
        res[o] = Out(C(s.total()));
      }
    });
    return;
  }
  // Integers: exact in i64 modulo 2^64 (Note [integer overflow wraps] in kernels/math.h), in any order.
  parallel_for(0, a.n_out, out_grain(a), [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      int64_t s = 0;
      for_each_reduced(a, kept_offset(a, o),
                       [&](int64_t, int64_t off) { s = math::wrap_add(s, int64_t(in[off])); });
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
