// CPU kernels of the fused layer normalisation (op_layer_norm, formulas in core/op_table.h): each row is
// read twice in the forward (mean, then the centred sum of squares and the output: two passes keep the
// variance exact where one-pass sums would cancel) and twice in the backward (the two row sums, then dx),
// while it sits in L1. Plain loops under `omp simd` so f32 and f64 vectorise; f16/bf16 inputs convert
// element by element and accumulate in f32 (a 16-bit x-hat converts in runs: Note [16-bit x-hat in runs]).
// The x-hat forms (op_layer_norm_xhat, op_layer_norm_backward_xhat) are the same loops writing, or reading,
// x-hat in its saved dtype; the rounded forms (op_layer_norm_rounded, op_layer_norm_affine) make y from that
// rounded x-hat. The reference they are tested against is the composite nn::functional::layer_norm_composite
// (the rounded forms: a plain loop in their test).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "core/op_table_norm.h"
#include "core/parallel.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/register.h"
#include "kernels/cpu/vec.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace frugal {
namespace {

// a * b + c rounded once where the machine has a fused multiply-add, twice where it has none: written out, so
// that no compiler can contract one form of normalize_row and not the other.
template <typename C>
inline C mul_add(C a, C b, C c) {
#if defined(__FMA__)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// Note [16-bit x-hat in runs]: a 16-bit x-hat (under autocast) is rounded, and read back, through the
// vectorised conversions of kernels/cpu/convert.h, a run of kRun values at a time through a float buffer in
// L1: the conversion of one value inside the row's simd loop (core/half.h's, with its NaN branch) kept GCC
// from vectorising the loop, and the x-hat forward of W3's 2048 x 128 rows took 7x the plain one (360
// against 53 us). The backward reads a row of x-hat back into f32 at once (rows of up to kRowBuffer; longer
// ones convert each value where it is read): an f16 x-hat (whose scalar conversion has branches for
// subnormals) made the backward 4x slower than from bf16 (412 against 104 us). The conversions are
// core/half.h's bit for bit, so every x-hat value written or read is the scalar conversion's, and the
// forward's results are the scalar loop's. The backward's row sums are vectorised over the f32 buffer, and
// may round differently from the same sums over a row read value by value (as rows past kRowBuffer are): both
// are sums of the same values, deterministic, to f32 rounding.
constexpr int64_t kRun = 256;
constexpr int64_t kRowBuffer = 4096;  // the backward's: one row of x-hat in f32
template <typename S>
constexpr bool kSixteenBit = std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>;
template <typename S, typename C>
constexpr bool kConvertInRuns = std::is_same_v<C, float>&& kSixteenBit<S>;
// f(j0, len) for the runs [j0, j0 + len) of [0, n), each at most kRun long.
template <typename F>
inline void for_runs(int64_t n, F&& f) {
  for (int64_t j0 = 0; j0 < n; j0 += kRun) f(j0, std::min(kRun, n - j0));
}

// y[j] = T(xh w[j] + bias[j]) with xh = (x[j] - mu) rs (each factor only when given), and xo[j] = S(xh)
// when S is not void (the x-hat form): the same operations in the same order either way, so y is the same
// bit for bit. Every product that meets a sum goes through mul_add: left to the compiler, whether it fuses
// them depends on its contraction rules (GCC's -ffp-contract=fast fuses across statements, clang's default
// only within one) and on whether the product is also stored, as in the x-hat form.
template <bool kWeight, bool kBias, typename S, typename T, typename C>
inline void normalize_row_values(const T* x, T* y, S* xo, const C* w, const C* bias, C mu, C rs, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const C d = C(x[j]) - mu;
    const C xh = d * rs;
    if constexpr (!std::is_void_v<S>) xo[j] = S(xh);
    C v;
    if constexpr (kWeight && kBias)
      v = mul_add(xh, w[j], bias[j]);
    else if constexpr (kWeight)
      v = xh * w[j];
    else if constexpr (kBias)
      v = mul_add(d, rs, bias[j]);
    else
      v = xh;
    y[j] = T(v);
  }
}
// (A 16-bit x-hat: kept in f32 runs, rounded a run at a time; Note [16-bit x-hat in runs].)
template <bool kWeight, bool kBias, typename S, typename T, typename C>
inline void normalize_row(const T* x, T* y, S* xo, const C* w, const C* bias, C mu, C rs, int64_t n) {
  if constexpr (kConvertInRuns<S, C>) {
    alignas(64) float run[kRun];
    for_runs(n, [&](int64_t j0, int64_t len) {
      normalize_row_values<kWeight, kBias>(x + j0, y + j0, run, w ? w + j0 : w, bias ? bias + j0 : bias, mu,
                                           rs, len);
      cpu::from_f32(run, xo + j0, len);
    });
  } else {
    normalize_row_values<kWeight, kBias>(x, y, xo, w, bias, mu, rs, n);
  }
}

// The rounded forms' affine map (op_layer_norm_rounded, op_layer_norm_affine): xh w[j] + bias[j] of the
// x-hat already rounded to S and read back into the compute type, each factor only when given, to be rounded
// to S; one function, so that the forward and the affine op that makes its output again in the backward
// agree bit for bit.
template <bool kWeight, bool kBias, typename C>
inline C affine_value(C xh, const C* w, const C* bias, int64_t j) {
  if constexpr (kWeight && kBias)
    return mul_add(xh, w[j], bias[j]);
  else if constexpr (kWeight)
    return xh * w[j];
  else if constexpr (kBias)
    return xh + bias[j];
  else
    return xh;
}

// op_layer_norm_affine's row: y[j] = the affine map of xo[j], both of S.
template <bool kWeight, bool kBias, typename S, typename C>
inline void affine_row(const S* xo, S* y, const C* w, const C* bias, int64_t n) {
  if constexpr (kConvertInRuns<S, C>) {
    alignas(64) float run[kRun];
    for_runs(n, [&](int64_t j0, int64_t len) {
      cpu::to_f32(xo + j0, run, len);
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) run[j] = affine_value<kWeight, kBias>(run[j], w, bias, j0 + j);
      cpu::from_f32(run, y + j0, len);
    });
  } else {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) y[j] = S(affine_value<kWeight, kBias>(C(xo[j]), w, bias, j));
  }
}

// The rounded form's row: xo[j] = S(xh) as normalize_row's, then y[j] (of S) the affine map of that rounded
// xo[j], not of xh (affine_row: what makes y again in the backward).
template <bool kWeight, bool kBias, typename S, typename T, typename C>
inline void rounded_row_loops(const T* x, S* y, S* xo, const C* w, const C* bias, C mu, C rs, int64_t n) {
  if constexpr (kConvertInRuns<S, C>) {
    alignas(64) float run[kRun];
    for_runs(n, [&](int64_t j0, int64_t len) {
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) run[j] = (C(x[j0 + j]) - mu) * rs;
      cpu::from_f32(run, xo + j0, len);
    });
  } else {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) xo[j] = S((C(x[j]) - mu) * rs);
  }
  affine_row<kWeight, kBias>(xo, y, w, bias, n);
}

template <bool kWeight, bool kBias, typename S, typename T, typename C>
inline void rounded_row(const T* x, S* y, S* xo, const C* w, const C* bias, C mu, C rs, int64_t n) {
#if FRUGAL_BF16_SIMD
  if constexpr (std::is_same_v<T, float> && std::is_same_v<S, BFloat16>) {
    // Note [the rounded row in registers]: f32 x, bf16 x-hat and y (W6's norms under autocast) take 16 values
    // at a time through the whole row: x-hat, its rounding, the affine map of the rounded value and y's
    // rounding, with the same operations as rounded_row_loops. Through those (three passes over L1
    // buffers and three conversion calls a row) the form took 2.1x the plain f32 forward. A block whose
    // x-hat or y holds a nonzero f32 subnormal (cpu::bf16_flushes) goes through the loops
    // instead, as do the last n % 16 values.
    const __m512 vmu = _mm512_set1_ps(mu), vrs = _mm512_set1_ps(rs);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
      const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + j), vmu), vrs);
      const __m256i xb = cpu::f32x16_to_bf16(xh);
      const __m512 xr = cpu::bf16x16_to_f32(xb);
      __m512 v = xr;
      if constexpr (kWeight && kBias)
        v = _mm512_fmadd_ps(xr, _mm512_loadu_ps(w + j), _mm512_loadu_ps(bias + j));
      else if constexpr (kWeight)
        v = _mm512_mul_ps(xr, _mm512_loadu_ps(w + j));
      else if constexpr (kBias)
        v = _mm512_add_ps(xr, _mm512_loadu_ps(bias + j));
      if (!_kortestz_mask16_u8(cpu::bf16_flushes(xh), cpu::bf16_flushes(v))) {
        rounded_row_loops<kWeight, kBias>(x + j, y + j, xo + j, w ? w + j : w, bias ? bias + j : bias, mu, rs,
                                          16);
        continue;
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xo + j), xb);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + j), cpu::f32x16_to_bf16(v));
    }
    if (j < n)
      rounded_row_loops<kWeight, kBias>(x + j, y + j, xo + j, w ? w + j : w, bias ? bias + j : bias, mu, rs,
                                        n - j);
    return;
  }
#endif
  rounded_row_loops<kWeight, kBias>(x, y, xo, w, bias, mu, rs, n);
}

// Calls f.template operator()<kWeight, kBias>() for the affine parameters given.
template <typename F>
inline void with_affine(const void* w, const void* bias, F&& f) {
  if (w && bias)
    f.template operator()<true, true>();
  else if (w)
    f.template operator()<true, false>();
  else if (bias)
    f.template operator()<false, true>();
  else
    f.template operator()<false, false>();
}

// Note [a row's statistics]: the mean of a row and the sum of its squared deviations from it. In the compute
// type, in vectors of the widest kind the build has: two vector accumulators over the whole vectors, their
// lanes summed as a tree, then the last n % L values in order; an order that depends on n alone, not on
// where the row lies (Eigen's sums start with the elements before the first aligned one), so that a row and
// its copy get the same statistics. GCC's simd reductions ended in a chain of 16 scalar adds each, which took
// 40% of a forward over W3's rows of 128. Rows of f16/bf16 are summed as they are read, in simd reductions.
// Never inlined: one compiled body for every form (plain, x-hat, rounded), where the compiler cannot fuse the
// squares into the sums in one caller and not in another, so the forms' statistics agree bit for bit.
template <typename T, typename C>
[[gnu::noinline]] void row_stats(const T* x, int64_t n, C inv_n, C& mu, C& ss) {
  if constexpr (std::is_same_v<T, C>) {
    using V = cpu::Vec<C>;
    constexpr int64_t L = cpu::kLanes<C>;
    auto load = [&](int64_t j) {
      V v;
      std::memcpy(&v, x + j, sizeof(V));
      return v;
    };
    auto lanes = [](V v) {  // a tree: lane i + w into lane i, w = L / 2, ..., 1
#if defined(__AVX512F__)
      // The same tree, in registers (GCC's reduce_add: the halves added, then their halves, ...).
      if constexpr (std::is_same_v<C, float>)
        return _mm512_reduce_add_ps(reinterpret_cast<__m512>(v));
      else if constexpr (std::is_same_v<C, double>)
        return _mm512_reduce_add_pd(reinterpret_cast<__m512d>(v));
#endif
      C l[L];
      std::memcpy(l, &v, sizeof(V));
#pragma GCC unroll 8
      for (int64_t w = L / 2; w > 0; w /= 2)
#pragma GCC unroll 16
        for (int64_t i = 0; i < w; ++i) l[i] += l[i + w];
      return l[0];
    };
    // f over the whole vectors into two accumulators, then g over the rest, one by one, into their total.
    auto sum_of = [&](auto f, auto g) {
      V a0 = V{}, a1 = V{};
      int64_t j = 0;
      for (; j + 2 * L <= n; j += 2 * L) {
        a0 += f(load(j));
        a1 += f(load(j + L));
      }
      if (j + L <= n) {
        a0 += f(load(j));
        j += L;
      }
      C total = lanes(a0 + a1);
      for (; j < n; ++j) total += g(x[j]);
      return total;
    };
    mu = sum_of([](V v) { return v; }, [](C v) { return v; }) * inv_n;
    const C m = mu;
    ss = sum_of(
        [m](V v) {
          const V d = v - m;
          return d * d;
        },
        [m](C v) {
          const C d = v - m;
          return d * d;
        });
  } else {
    C sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) sum += C(x[j]);
    mu = sum * inv_n;
    C s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; ++j) {
      const C d = C(x[j]) - mu;
      s += d * d;
    }
    ss = s;
  }
}

// x: [rows, cols]; y: [rows, cols] of T, or of S when kRounded; weight, bias: [cols] or null; mean, rstd:
// [rows]; xhat: [rows, cols] of S when S is not void
template <typename T, typename S = void, bool kRounded = false>
void layer_norm_forward_cpu(const LayerNormArgs& a) {
  using C = acc_t<T>;
  using Y = std::conditional_t<kRounded, S, T>;
  const T* xs = static_cast<const T*>(a.x);
  Y* ys = static_cast<Y*>(a.y);
  S* xos = static_cast<S*>(a.xhat);
  const C* w = static_cast<const C*>(a.weight);
  const C* bias = static_cast<const C*>(a.bias);
  C* means = static_cast<C*>(a.mean);
  C* rstds = static_cast<C*>(a.rstd);
  const int64_t n = a.cols;
  const C inv_n = C(1) / C(n), eps = C(a.eps);
  parallel_for(0, a.rows, items_per_grain(n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* x = xs + r * n;
      Y* y = ys + r * n;
      S* xo = nullptr;
      if constexpr (!std::is_void_v<S>) xo = xos + r * n;
      C mu, ss;
      row_stats(x, n, inv_n, mu, ss);
      const C rs = C(1) / std::sqrt(ss * inv_n + eps);
      means[r] = mu;
      rstds[r] = rs;
      with_affine(w, bias, [&]<bool kWeight, bool kBias>() {
        if constexpr (kRounded)
          rounded_row<kWeight, kBias>(x, y, xo, w, bias, mu, rs, n);
        else
          normalize_row<kWeight, kBias>(x, y, xo, w, bias, mu, rs, n);
      });
    }
  });
}

// op_layer_norm_affine for x of T: y [rows, cols] = the affine map of xhat [rows, cols] (both of S).
template <typename T, typename S>
void layer_norm_affine_cpu(const LayerNormArgs& a) {
  using C = acc_t<T>;
  const S* xos = static_cast<const S*>(a.xhat);
  S* ys = static_cast<S*>(a.y);
  const C* w = static_cast<const C*>(a.weight);
  const C* bias = static_cast<const C*>(a.bias);
  const int64_t n = a.cols;
  parallel_for(0, a.rows, items_per_grain(n), [&](int64_t b, int64_t e) {
    with_affine(w, bias, [&]<bool kWeight, bool kBias>() {
      for (int64_t r = b; r < e; ++r) affine_row<kWeight, kBias>(xos + r * n, ys + r * n, w, bias, n);
    });
  });
}

// Where the backward reads x-hat from: x with the row's mean and rstd, or a saved x-hat of S.
template <typename T, typename C>
struct XhatFromX {
  const T* x;
  C mu, rs;
  C operator[](int64_t j) const { return (C(x[j]) - mu) * rs; }
};
template <typename S, typename C>
struct XhatSaved {
  const S* xo;
  C operator[](int64_t j) const { return C(xo[j]); }
};

// dy (D), dx (T): [rows, cols]; x (from x) or xhat of S (saved x-hat): [rows, cols]; weight: [cols] or null;
// mean (from x only), rstd: [rows]; dweight, dbias: [cols] or null; workspace: [chunks, 2, cols] when
// dweight or dbias is wanted. A 16-bit dy under an f32 T (d x-hat under autocast) is read back into f32 a
// row at a time, as a 16-bit x-hat is: the values the cast op would have made, without its pass and tensor.
template <typename T, typename S = void, typename D = T>
void layer_norm_backward_cpu(const LayerNormArgs& a) {
  using C = acc_t<T>;
  constexpr bool kFromX = std::is_void_v<S>;
  using XS = std::conditional_t<kFromX, T, S>;
  const XS* xs = static_cast<const XS*>(kFromX ? a.x : a.xhat);
  const D* dys = static_cast<const D*>(a.dy);
  constexpr bool kDyInRuns = !std::is_same_v<D, T> && kConvertInRuns<D, C>;
  T* dxs = static_cast<T*>(a.dx);
  const C* w = static_cast<const C*>(a.weight);
  const C* means = static_cast<const C*>(a.mean);
  const C* rstds = static_cast<const C*>(a.rstd);
  C* ws = static_cast<C*>(a.workspace);
  const int64_t n = a.cols, rows = a.rows, chunks = std::max<int64_t>(1, a.chunks);
  const bool param_grads = a.dweight || a.dbias;
  const C inv_n = C(1) / C(n);
  const int64_t per_chunk = (rows + chunks - 1) / chunks;
  const int64_t grain = items_per_grain(per_chunk * n);
  // One chunk's rows; kWeight: the weight multiplies dy (a branch on it inside the loops made GCC gather the
  // weight under a mask, as slow with no weight as with one).
  auto chunk_rows = [&]<bool kWeight>(int64_t c) {
    C* pdw = param_grads ? ws + c * 2 * n : nullptr;  // this chunk's partial sums
    C* pdb = param_grads ? pdw + n : nullptr;
    if (param_grads) std::fill(pdw, pdw + 2 * n, C(0));
    // Row r from its x-hat, read through `xhat` (xhat[j]: x-hat's j-th value in the compute type), and dy
    // (D, or f32 read back).
    auto row = [&](int64_t r, const auto& xhat_at, const auto* dy) {
      // Every loop below reads local copies of the accessor and the pointers: through the lambdas' captures
      // by reference, GCC left the first loops scalar where x-hat comes from x (W3's norms: 233 us against
      // 45 for 2048 rows of 128 on a Xeon).
      const auto xhat = xhat_at;
      const C* const wv = w;
      const auto grad = [=](int64_t j) {  // [=]: wv goes unused without a weight
        if constexpr (kWeight)
          return C(dy[j]) * wv[j];
        else
          return C(dy[j]);
      };
      const C rs = rstds[r];
      C sum_g = 0, sum_gx = 0;
      if (param_grads) {
        C* const dw = pdw;
        C* const db = pdb;
#pragma omp simd reduction(+ : sum_g, sum_gx)
        for (int64_t j = 0; j < n; ++j) {
          const C xh = xhat[j], d = C(dy[j]), g = grad(j);
          sum_g += g;
          sum_gx += g * xh;
          dw[j] += d * xh;
          db[j] += d;
        }
      } else {
#pragma omp simd reduction(+ : sum_g, sum_gx)
        for (int64_t j = 0; j < n; ++j) {
          const C xh = xhat[j], g = grad(j);
          sum_g += g;
          sum_gx += g * xh;
        }
      }
      if (!dxs) return;
      T* dx = dxs + r * n;
      const C mean_g = sum_g * inv_n, mean_gx = sum_gx * inv_n;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) dx[j] = T(rs * (grad(j) - mean_g - xhat[j] * mean_gx));
    };
    // A 16-bit x-hat is read back into f32 a row at a time, where the row fits the buffer (Note [16-bit
    // x-hat in runs]): the same values as converting each one where it is read.
    [[maybe_unused]] alignas(64) float row_xhat[kConvertInRuns<S, C> ? kRowBuffer : 1];
    [[maybe_unused]] alignas(64) float row_dy[kDyInRuns ? kRowBuffer : 1];
    auto with_dy = [&](int64_t r, const auto& xhat) {
      if constexpr (kDyInRuns) {
        if (n <= kRowBuffer) {
          cpu::to_f32(dys + r * n, row_dy, n);
          return row(r, xhat, static_cast<const float*>(row_dy));
        }
      }
      row(r, xhat, dys + r * n);
    };
    for (int64_t r = c * per_chunk, r_end = std::min(rows, (c + 1) * per_chunk); r < r_end; ++r) {
      if constexpr (kFromX) {
        with_dy(r, XhatFromX<T, C>{xs + r * n, means[r], rstds[r]});
      } else if constexpr (kConvertInRuns<S, C>) {
        if (n <= kRowBuffer) {
          cpu::to_f32(xs + r * n, row_xhat, n);
          with_dy(r, XhatSaved<float, C>{row_xhat});
        } else {
          with_dy(r, XhatSaved<S, C>{xs + r * n});
        }
      } else {
        with_dy(r, XhatSaved<S, C>{xs + r * n});
      }
    }
  };
  parallel_for(0, chunks, grain, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      if (w)
        chunk_rows.template operator()<true>(c);
      else
        chunk_rows.template operator()<false>(c);
    }
  });
  if (!param_grads) return;
  // The chunks' partial sums, added in chunk order.
  C* dw = static_cast<C*>(a.dweight);
  C* db = static_cast<C*>(a.dbias);
  for (int k = 0; k < 2; ++k) {
    C* out = k == 0 ? dw : db;
    if (!out) continue;
    std::fill(out, out + n, C(0));
    for (int64_t c = 0; c < chunks; ++c) {
      const C* part = ws + c * 2 * n + k * n;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) out[j] += part[j];
    }
  }
}

// The x-hat and rounded forms for x of T: the kernel for the saved x-hat's dtype.
enum class XhatForm { kForward, kBackward, kRounded, kAffine };
template <typename T, XhatForm kForm>
void layer_norm_xhat_cpu(const LayerNormArgs& a) {
  visit_floating_dtype(a.xhat_dtype, "layer_norm x-hat", [&](auto s) {
    using S = decltype(s);
    if constexpr (kForm == XhatForm::kForward)
      layer_norm_forward_cpu<T, S>(a);
    else if constexpr (kForm == XhatForm::kBackward) {
      // dy in x-hat's 16-bit dtype under an f32 x (d x-hat under autocast), or in the table's.
      if constexpr (std::is_same_v<T, float> && kSixteenBit<S>) {
        if (a.dy_dtype == dtype_v<S>) return layer_norm_backward_cpu<T, S, S>(a);
      }
      FRUGAL_CHECK_DTYPE(!a.dy_dtype || *a.dy_dtype == dtype_v<T>,
                         "layer_norm_backward_xhat: no CPU kernel for a ", dtype_name(*a.dy_dtype),
                         " gradient of ", dtype_name(dtype_v<T>), " x with a ", dtype_name(dtype_v<S>),
                         " x-hat");
      layer_norm_backward_cpu<T, S>(a);
    } else if constexpr (kForm == XhatForm::kRounded)
      layer_norm_forward_cpu<T, S, true>(a);
    else
      layer_norm_affine_cpu<T, S>(a);
  });
}

const bool kRegistered = [] {
  cpu::for_types<float, double, Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_layer_norm.set(DeviceType::CPU, dtype_v<T>, layer_norm_forward_cpu<T>);
    op_layer_norm_backward.set(DeviceType::CPU, dtype_v<T>, layer_norm_backward_cpu<T>);
    op_layer_norm_xhat.set(DeviceType::CPU, dtype_v<T>, layer_norm_xhat_cpu<T, XhatForm::kForward>);
    op_layer_norm_backward_xhat.set(DeviceType::CPU, dtype_v<T>, layer_norm_xhat_cpu<T, XhatForm::kBackward>);
    op_layer_norm_rounded.set(DeviceType::CPU, dtype_v<T>, layer_norm_xhat_cpu<T, XhatForm::kRounded>);
    op_layer_norm_affine.set(DeviceType::CPU, dtype_v<T>, layer_norm_xhat_cpu<T, XhatForm::kAffine>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
