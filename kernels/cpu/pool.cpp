// CPU pooling kernels (max and average, forward and backward) as plain loops, threads over planes. They are
// simple enough to be their own reference; the tests check them against loops written from PyTorch's
// definition. f16/bf16 compute in f32: the forward's sums, and the backward's gradient planes, which add up
// overlapping windows in f32 and round each element once.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include <omp.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "core/op_table_conv.h"
#include "core/parallel.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/register.h"
#include "kernels/cpu/transpose_block.h"
#include "kernels/cpu/workspace.h"

namespace frugal {
namespace {

using cpu::for_types;

// Planes per thread chunk: about parallel_grain() window elements of work each.
int64_t plane_grain(const PoolArgs& a) { return items_per_grain(a.oh * a.ow * a.kh * a.kw); }

// The first in-range tap of a window starting at `start` (possibly in the padding), stepping by dilation.
int64_t first_tap(int64_t start, int64_t dilation) {
  while (start < 0) start += dilation;
  return start;
}

// The 2x2 window of stride 2 without padding or dilation (the CNNs' usual pooling, W2's): the same taps in
// the same order and the same rule as the general loop below, without branches: f32 with AVX-512 a row at
// a time (below), other dtypes in a loop GCC vectorises for rows of 16 windows or more (W2's rows of 14 and
// 7 would mostly run its scalar remainder). The general loop's per-tap branches and NaN tests took 2.4 ms a
// call on W2's first pool (profiler, 2 threads).
#ifdef __AVX512F__
// One row of n windows of f32, from input rows p0 and p1, with AVX-512: 16 windows a step, the last step
// masked, so rows of 14 or 7 (W2's) run as one step each. The same rule as the portable loop below; base is
// the flat index of the row's first tap, w the input's width.
void max_pool2d_2x2_row_avx512(const float* p0, const float* p1, float* yr, int64_t* ir, int64_t n,
                               int64_t base, int64_t w) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t j = 0; j < n; j += 16) {
    const int64_t m = std::min<int64_t>(16, n - j), f = 2 * m;  // windows, and floats of each row
    const __mmask16 ma = f >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << f) - 1);
    const __mmask16 mb = f > 16 ? __mmask16((1u << (f - 16)) - 1) : __mmask16(0);
    const __mmask16 out = m == 16 ? __mmask16(0xFFFF) : __mmask16((1u << m) - 1);
    const __m512 a0 = _mm512_maskz_loadu_ps(ma, p0 + 2 * j), a1 = _mm512_maskz_loadu_ps(mb, p0 + 2 * j + 16);
    const __m512 b0 = _mm512_maskz_loadu_ps(ma, p1 + 2 * j), b1 = _mm512_maskz_loadu_ps(mb, p1 + 2 * j + 16);
    const __m512 t[4] = {_mm512_permutex2var_ps(a0, even, a1), _mm512_permutex2var_ps(a0, odd, a1),
                         _mm512_permutex2var_ps(b0, even, b1), _mm512_permutex2var_ps(b0, odd, b1)};
    __m512 best = t[0];
    __m512i k = _mm512_setzero_si512();
    for (int i = 1; i < 4; ++i) {
      // Strictly greater wins, so ties keep the first tap; a NaN wins, and a later NaN replaces it.
      const __mmask16 take =
          _mm512_cmp_ps_mask(t[i], best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(t[i], t[i], _CMP_UNORD_Q);
      best = _mm512_mask_mov_ps(best, take, t[i]);
      k = _mm512_mask_mov_epi32(k, take, _mm512_set1_epi32(i));
    }
    _mm512_mask_storeu_ps(yr + j, out, best);
    if (!ir) continue;
    // index = base + 2 (j + lane) + (k & 1), plus w where the tap is on the second row (k >= 2); in 64 bits,
    // 8 lanes a half.
    const __m512i off =
        _mm512_add_epi32(_mm512_slli_epi32(lane, 1), _mm512_and_si512(k, _mm512_set1_epi32(1)));
    const __mmask16 second = _mm512_cmpge_epi32_mask(k, _mm512_set1_epi32(2));
    const __m512i start = _mm512_set1_epi64(base + 2 * j), wv = _mm512_set1_epi64(w);
    for (int half = 0; half < 2; ++half) {
      const __m256i o = half ? _mm512_extracti64x4_epi64(off, 1) : _mm512_castsi512_si256(off);
      __m512i idx = _mm512_add_epi64(start, _mm512_cvtepi32_epi64(o));
      idx = _mm512_mask_add_epi64(idx, __mmask8(half ? second >> 8 : second & 0xFF), idx, wv);
      const __mmask8 mh = __mmask8(half ? out >> 8 : out & 0xFF);
      _mm512_mask_storeu_epi64(ir + j + 8 * half, mh, idx);
    }
  }
}
#endif

#if !defined(__AVX512F__) && defined(__AVX2__)
// The same row with AVX2: 8 windows a step, the last step's loads and stores masked (W2's rows of 14 and 7
// windows: two steps and one). Each row's 16 floats are split into the windows' even and odd taps by a
// shuffle and a lane permute. The portable loop ran rows this short mostly in its scalar remainder: W2's
// f32 forward at a batch of 256 spent 17% of its time there on a Zen 3.
void max_pool2d_2x2_row_avx2(const float* p0, const float* p1, float* yr, int64_t* ir, int64_t n,
                             int64_t base, int64_t w) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  // The even and odd taps of 16 floats (lo, then hi): 8 windows' first and second columns.
  auto split = [](__m256 lo, __m256 hi, __m256& even, __m256& odd) {
    even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xD8));
    odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xDD)), 0xD8));
  };
  for (int64_t j = 0; j < n; j += 8) {
    const int64_t m = std::min<int64_t>(8, n - j), f = 2 * m;  // windows, and floats of each row
    __m256 a0, a1, b0, b1;
    if (m == 8) {
      a0 = _mm256_loadu_ps(p0 + 2 * j), a1 = _mm256_loadu_ps(p0 + 2 * j + 8);
      b0 = _mm256_loadu_ps(p1 + 2 * j), b1 = _mm256_loadu_ps(p1 + 2 * j + 8);
    } else {
      const __m256i lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(f)), lane);
      const __m256i hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(f) - 8), lane);
      a0 = _mm256_maskload_ps(p0 + 2 * j, lo), a1 = _mm256_maskload_ps(p0 + 2 * j + 8, hi);
      b0 = _mm256_maskload_ps(p1 + 2 * j, lo), b1 = _mm256_maskload_ps(p1 + 2 * j + 8, hi);
    }
    __m256 t[4];
    split(a0, a1, t[0], t[1]);
    split(b0, b1, t[2], t[3]);
    __m256 best = t[0];
    __m256 k = _mm256_setzero_ps();  // the winning tap, as int32 bits
    for (int i = 1; i < 4; ++i) {
      // Strictly greater wins, so ties keep the first tap; a NaN wins, and a later NaN replaces it.
      const __m256 take =
          _mm256_or_ps(_mm256_cmp_ps(t[i], best, _CMP_GT_OQ), _mm256_cmp_ps(t[i], t[i], _CMP_UNORD_Q));
      best = _mm256_blendv_ps(best, t[i], take);
      k = _mm256_blendv_ps(k, _mm256_castsi256_ps(_mm256_set1_epi32(i)), take);
    }
    const __m256i out = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(m)), lane);
    if (m == 8)
      _mm256_storeu_ps(yr + j, best);
    else
      _mm256_maskstore_ps(yr + j, out, best);
    if (!ir) continue;
    // index = base + 2 (j + lane) + (k & 1), plus w where the tap is on the second row (k >= 2); in 64 bits,
    // 4 lanes a half.
    const __m256i ki = _mm256_castps_si256(k);
    const __m256i off =
        _mm256_add_epi32(_mm256_slli_epi32(lane, 1), _mm256_and_si256(ki, _mm256_set1_epi32(1)));
    const __m256i second = _mm256_cmpgt_epi32(ki, _mm256_set1_epi32(1));
    const __m256i start = _mm256_set1_epi64x(base + 2 * j), wv = _mm256_set1_epi64x(w);
    for (int half = 0; half < 2; ++half) {
      const __m128i o = half ? _mm256_extracti128_si256(off, 1) : _mm256_castsi256_si128(off);
      const __m128i s2 = half ? _mm256_extracti128_si256(second, 1) : _mm256_castsi256_si128(second);
      const __m128i oh = half ? _mm256_extracti128_si256(out, 1) : _mm256_castsi256_si128(out);
      const __m256i idx = _mm256_add_epi64(_mm256_add_epi64(start, _mm256_cvtepi32_epi64(o)),
                                           _mm256_and_si256(_mm256_cvtepi32_epi64(s2), wv));
      _mm256_maskstore_epi64(reinterpret_cast<long long*>(ir + j + 4 * half), _mm256_cvtepi32_epi64(oh), idx);
    }
  }
}
#endif

template <typename T>
void max_pool2d_2x2_plane(const PoolArgs& a, const T* x, T* y, int64_t* idx) {
  using A = acc_t<T>;
  constexpr int64_t kChunk = 256;
  int32_t tap[kChunk];  // the winning tap of each window: 0..3 in row-major order
  for (int64_t oh = 0; oh < a.oh; ++oh) {
    const T* r0 = x + 2 * oh * a.w;
    const T* r1 = r0 + a.w;
#ifdef __AVX512F__
    if constexpr (std::is_same_v<T, float>) {
      max_pool2d_2x2_row_avx512(r0, r1, y + oh * a.ow, idx ? idx + oh * a.ow : nullptr, a.ow, 2 * oh * a.w,
                                a.w);
      continue;
    }
#elif defined(__AVX2__)
    if constexpr (std::is_same_v<T, float>) {
      max_pool2d_2x2_row_avx2(r0, r1, y + oh * a.ow, idx ? idx + oh * a.ow : nullptr, a.ow, 2 * oh * a.w,
                              a.w);
      continue;
    }
#endif
    for (int64_t c0 = 0; c0 < a.ow; c0 += kChunk) {
      const int64_t n = std::min(kChunk, a.ow - c0);
      const T* p0 = r0 + 2 * c0;
      const T* p1 = r1 + 2 * c0;
      T* yr = y + oh * a.ow + c0;
      // Strictly greater wins, so ties keep the first tap; a NaN wins, and a later NaN replaces it. In one
      // loop of one lane width (the int64 index is made in a second loop), which GCC vectorises.
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const A t0 = A(p0[2 * j]), t1 = A(p0[2 * j + 1]), t2 = A(p1[2 * j]), t3 = A(p1[2 * j + 1]);
        A best = t0;
        int32_t k = 0;
        bool take = (t1 > best) | (t1 != t1);
        best = take ? t1 : best;
        k = take ? 1 : k;
        take = (t2 > best) | (t2 != t2);
        best = take ? t2 : best;
        k = take ? 2 : k;
        take = (t3 > best) | (t3 != t3);
        best = take ? t3 : best;
        k = take ? 3 : k;
        yr[j] = T(best);
        tap[j] = k;
      }
      if (!idx) continue;
      int64_t* ir = idx + oh * a.ow + c0;
      const int64_t base = 2 * oh * a.w + 2 * c0;
      for (int64_t j = 0; j < n; ++j) ir[j] = base + 2 * j + (tap[j] & 1) + (tap[j] >> 1) * a.w;
    }
  }
}

template <typename T>
void max_pool2d_forward_cpu(const PoolArgs& a) {
  using A = acc_t<T>;
  const bool two_by_two = a.kh == 2 && a.kw == 2 && a.stride_h == 2 && a.stride_w == 2 && a.pad_h == 0 &&
                          a.pad_w == 0 && a.dil_h == 1 && a.dil_w == 1 && 2 * a.oh <= a.h && 2 * a.ow <= a.w;
  if (two_by_two) {
    parallel_for(0, a.planes, plane_grain(a), [&](int64_t pb, int64_t pe) {
      for (int64_t p = pb; p < pe; ++p)
        max_pool2d_2x2_plane<T>(a, static_cast<const T*>(a.x) + p * a.h * a.w,
                                static_cast<T*>(a.y) + p * a.oh * a.ow,
                                a.indices ? a.indices + p * a.oh * a.ow : nullptr);
    });
    return;
  }
  parallel_for(0, a.planes, plane_grain(a), [&](int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p) {
      const T* x = static_cast<const T*>(a.x) + p * a.h * a.w;
      T* y = static_cast<T*>(a.y) + p * a.oh * a.ow;
      int64_t* idx = a.indices ? a.indices + p * a.oh * a.ow : nullptr;
      for (int64_t oh = 0; oh < a.oh; ++oh) {
        const int64_t h0 = oh * a.stride_h - a.pad_h;
        const int64_t h1 = std::min(h0 + (a.kh - 1) * a.dil_h + 1, a.h), hs = first_tap(h0, a.dil_h);
        for (int64_t ow = 0; ow < a.ow; ++ow) {
          const int64_t w0 = ow * a.stride_w - a.pad_w;
          const int64_t w1 = std::min(w0 + (a.kw - 1) * a.dil_w + 1, a.w), ws = first_tap(w0, a.dil_w);
          // As PyTorch: strictly greater wins, so ties keep the first; a NaN wins and propagates. A window
          // with no tap in the input (possible with dilation) is -inf at index -1 (Note [a window with no
          // tap]).
          A best = -std::numeric_limits<A>::infinity();
          int64_t best_at = hs < h1 && ws < w1 ? hs * a.w + ws : -1;
          for (int64_t ih = hs; ih < h1; ih += a.dil_h)
            for (int64_t iw = ws; iw < w1; iw += a.dil_w) {
              const A v = A(x[ih * a.w + iw]);
              if (v > best || std::isnan(v)) {
                best = v;
                best_at = ih * a.w + iw;
              }
            }
          y[oh * a.ow + ow] = T(best);
          if (idx) idx[oh * a.ow + ow] = best_at;
        }
      }
    }
  });
}

// Note [a window with no tap]: with dilation, a window can start in the padding and step over the whole
// input (x [1, 1, 1, 1], kernel 2, padding 1, dilation 2: taps at -1 and 1). Its maximum is -inf and its
// index -1, which the backward skips: it passes no gradient. (PyTorch's CPU kernel gives such a window the
// index where its first tap would be, which can lie past the plane's end; frugal's did too, and its
// backward added the gradient there.)
//
// Backward: plane p's input gradient, summed in A into dx [h, w] (zeroed by the caller). An index outside
// [-1, h w) (the op's caller gave it) is skipped and reported through a.bad_index.
template <typename T, typename A>
void max_pool2d_backward_plane(const PoolArgs& a, int64_t p, A* dx) {
  const T* dy = static_cast<const T*>(a.dy) + p * a.oh * a.ow;
  const int64_t* idx = a.indices_in + p * a.oh * a.ow;
  const uint64_t hw = uint64_t(a.h * a.w);
  for (int64_t i = 0; i < a.oh * a.ow; ++i) {
    const int64_t j = idx[i];
    if (uint64_t(j) < hw)
      dx[j] += A(dy[i]);
    else if (j != -1 && a.bad_index)
      a.bad_index->store(j, std::memory_order_relaxed);
  }
}

// A window's rows [h0, h1) clipped to the input, and its divisor. As PyTorch: the full window is clipped to
// the padded input first (its size is the divisor with count_include_pad), then to the input itself.
struct AvgWindow {
  int64_t h0, h1, w0, w1, divisor;
  AvgWindow(const PoolArgs& a, int64_t oh, int64_t ow) {
    h0 = oh * a.stride_h - a.pad_h;
    w0 = ow * a.stride_w - a.pad_w;
    h1 = std::min(h0 + a.kh, a.h + a.pad_h);
    w1 = std::min(w0 + a.kw, a.w + a.pad_w);
    const int64_t padded = (h1 - h0) * (w1 - w0);
    h0 = std::max<int64_t>(h0, 0);
    w0 = std::max<int64_t>(w0, 0);
    h1 = std::min(h1, a.h);
    w1 = std::min(w1, a.w);
    divisor = a.count_include_pad ? padded : (h1 - h0) * (w1 - w0);
  }
};

template <typename T>
void avg_pool2d_forward_cpu(const PoolArgs& a) {
  using A = acc_t<T>;
  parallel_for(0, a.planes, plane_grain(a), [&](int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p) {
      const T* x = static_cast<const T*>(a.x) + p * a.h * a.w;
      T* y = static_cast<T*>(a.y) + p * a.oh * a.ow;
      for (int64_t oh = 0; oh < a.oh; ++oh)
        for (int64_t ow = 0; ow < a.ow; ++ow) {
          const AvgWindow win(a, oh, ow);
          A s = 0;
          for (int64_t ih = win.h0; ih < win.h1; ++ih)
            for (int64_t iw = win.w0; iw < win.w1; ++iw) s += A(x[ih * a.w + iw]);
          y[oh * a.ow + ow] = win.divisor > 0 ? T(s / A(win.divisor)) : T(0);
        }
    }
  });
}

template <typename T, typename A>
void avg_pool2d_backward_plane(const PoolArgs& a, int64_t p, A* dx) {
  const T* dy = static_cast<const T*>(a.dy) + p * a.oh * a.ow;
  for (int64_t oh = 0; oh < a.oh; ++oh)
    for (int64_t ow = 0; ow < a.ow; ++ow) {
      const AvgWindow win(a, oh, ow);
      if (win.divisor <= 0) continue;
      const A g = A(dy[oh * a.ow + ow]) / A(win.divisor);
      for (int64_t ih = win.h0; ih < win.h1; ++ih)
        for (int64_t iw = win.w0; iw < win.w1; ++iw) dx[ih * a.w + iw] += g;
    }
}

// 16-bit gradients accumulate per thread in an f32 plane.
int pool2d_backward_threads(const PoolArgs& a) {
  const int64_t chunks = (a.planes + plane_grain(a) - 1) / plane_grain(a);
  return omp_in_parallel() ? 1 : int(std::clamp<int64_t>(chunks, 1, detail::pool_threads()));
}
int64_t pool2d_backward_widened_bytes(const PoolArgs& a) {
  return pool2d_backward_threads(a) * a.h * a.w * int64_t(sizeof(float));
}
// The meta kernel: the working memory of the 16-bit backward (core/op_table.h).
void pool2d_backward_widened_meta(const PoolArgs& a) {
  const Tensor buf = cpu::meta_workspace(pool2d_backward_widened_bytes(a));
}

// Runs Plane over every plane: straight into dx for f32/f64; for f16/bf16 into a per-thread f32 plane that is
// rounded into dx once it is complete.
template <typename T, void (*Plane)(const PoolArgs&, int64_t, acc_t<T>*)>
void pool2d_backward_cpu(const PoolArgs& a) {
  const int64_t hw = a.h * a.w;
  if constexpr (std::is_same_v<acc_t<T>, T>) {
    parallel_for(0, a.planes, plane_grain(a), [&](int64_t pb, int64_t pe) {
      for (int64_t p = pb; p < pe; ++p) {
        T* dx = static_cast<T*>(a.dx) + p * hw;
        std::fill_n(dx, hw, T(0));
        Plane(a, p, dx);
      }
    });
  } else {
    Tensor buf = cpu::workspace(pool2d_backward_widened_bytes(a));
    const int nt = pool2d_backward_threads(a);
#pragma omp parallel num_threads(nt)
    {
      float* acc = static_cast<float*>(buf.raw_data()) + omp_get_thread_num() * hw;
      for (int64_t p = omp_get_thread_num(); p < a.planes; p += omp_get_num_threads()) {
        std::fill_n(acc, hw, 0.0f);
        Plane(a, p, acc);
        cpu::from_f32(acc, static_cast<T*>(a.dx) + p * hw, hw);
      }
    }
  }
}

// The largest of channel j's four taps of a 2 x 2 window, under max_pool2d's rule in the NCHW kernel's order:
// strictly greater wins (ties keep the first), a NaN wins and a later NaN replaces it. kRelu: of the taps
// under relu's rule first (v < 0 ? 0 : v), as max_pool2d(relu(x)) (Note [conv2d_relu keeps a NaN], conv.cpp).
template <bool kRelu>
inline float window_max(const float* const taps[4], int64_t j) {
  auto tap = [&](int i) {
    const float v = taps[i][j];
    return kRelu && v < 0 ? 0.0f : v;
  };
  float m = tap(0);
  for (int i = 1; i < 4; ++i) {
    const float v = tap(i);
    if (v > m || v != v) m = v;
  }
  return m;
}
#if defined(__AVX2__)
// window_max of channels j..j+7.
template <bool kRelu>
inline __m256 window_max8(const float* const taps[4], int64_t j) {
  // vmaxps(0, v) returns v unless 0 > v: relu's rule, a NaN and a -0 kept.
  auto tap = [&](int i) {
    const __m256 v = _mm256_loadu_ps(taps[i] + j);
    return kRelu ? _mm256_max_ps(_mm256_setzero_ps(), v) : v;
  };
  __m256 m = tap(0);
  for (int i = 1; i < 4; ++i) {
    const __m256 v = tap(i);
    m = _mm256_blendv_ps(m, v,
                         _mm256_or_ps(_mm256_cmp_ps(v, m, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  }
  return m;
}
#endif

template <bool kRelu>
void max_pool2x2_blocked_to_nchw_impl(const float* x, float* y, int64_t blocks, int64_t oh, int64_t ow,
                                      int64_t block) {
  const int64_t ph_count = oh / 2, pw_count = ow / 2, pp = ph_count * pw_count;
  if (blocks <= 0 || pp == 0) return;
  // A task is a run of at most kPixels pooled pixels of one block (in row-major order, across its rows):
  // their windows' maxima, pixel-major, in `pooled` (on the stack), then written out channel by channel, each
  // channel's run contiguous in y. Runs across rows rather than single rows: W2's rows of 14 and 7 pooled
  // pixels left most of each row to the element-by-element remainder of the 8 x 8 transposes.
  constexpr int64_t kPixels = 256;
  const int64_t runs = (pp + kPixels - 1) / kPixels;  // tasks a block
  const int64_t grain = items_per_grain(4 * std::min(pp, kPixels) * block);
  parallel_for(0, blocks * runs, grain, [&](int64_t tb, int64_t te) {
    alignas(64) float pooled[kPixels * 16];
    for (int64_t t = tb; t < te; ++t) {
      const int64_t b = t / runs, p0 = t % runs * kPixels, pixels = std::min(kPixels, pp - p0);
      for (int64_t k = 0, ph = p0 / pw_count, pw = p0 % pw_count; k < pixels; ++k) {
        const float* r0 = x + ((b * oh + 2 * ph) * ow + 2 * pw) * block;
        const float* r1 = r0 + ow * block;
        const float* taps[4] = {r0, r0 + block, r1, r1 + block};
        float* best = pooled + k * block;
        int64_t j = 0;
#if defined(__AVX2__)
        for (; j + 8 <= block; j += 8) _mm256_store_ps(best + j, window_max8<kRelu>(taps, j));
#endif
        for (; j < block; ++j) best[j] = window_max<kRelu>(taps, j);
        if (++pw == pw_count) pw = 0, ++ph;
      }
      // Pixel-major [pixels][block] to the block's channels: 8 x 8 tiles transposed in registers, the rest
      // element by element.
      float* out = y + b * block * pp + p0;  // channel j's run at out + j * pp
      int64_t q = 0;
#if FRUGAL_TRANSPOSE_AVX
      if (block % 8 == 0)
        for (; q + 8 <= pixels; q += 8)
          for (int64_t j = 0; j < block; j += 8) {
            __m256 r[8];
            cpu::transpose8x8_load(pooled + q * block + j, block, r);
            for (int i = 0; i < 8; ++i) _mm256_storeu_ps(out + (j + i) * pp + q, r[i]);
          }
#endif
      for (int64_t j = 0; j < block; ++j)
        for (int64_t k = q; k < pixels; ++k) out[j * pp + k] = pooled[k * block + j];
    }
  });
}

template <bool kRelu>
void max_pool2x2_blocked_to_nhwc_u8_impl(const float* x, uint8_t* y, int64_t images, int64_t channels,
                                         int64_t oh, int64_t ow, int64_t block, float inv_scale,
                                         int32_t zero_point, int32_t qmax) {
  const int64_t ph_count = oh / 2, pw_count = ow / 2, blocks = channels / block;
  if (images <= 0 || ph_count * pw_count == 0) return;
  const float lo = float(-zero_point), hi = float(qmax - zero_point);
  // A task is one pooled row of one image: every block's windows along it, each pixel's codes together.
  const int64_t grain = items_per_grain(4 * pw_count * channels);
  parallel_for(0, images * ph_count, grain, [&](int64_t tb, int64_t te) {
#if defined(__AVX2__)
    const cpu::Quantize8 quantize8(inv_scale, zero_point, qmax);
#endif
    for (int64_t t = tb; t < te; ++t) {
      const int64_t img = t / ph_count, ph = t % ph_count;
      uint8_t* row = y + t * pw_count * channels;
      for (int64_t b = 0; b < blocks; ++b) {
        const float* r0 = x + (((img * blocks + b) * oh + 2 * ph) * ow) * block;
        const float* r1 = r0 + ow * block;
        for (int64_t pw = 0; pw < pw_count; ++pw) {
          const float* taps[4] = {r0 + 2 * pw * block, r0 + (2 * pw + 1) * block, r1 + 2 * pw * block,
                                  r1 + (2 * pw + 1) * block};
          uint8_t* out = row + pw * channels + b * block;
          int64_t j = 0;
#if defined(__AVX2__)
          for (; j + 8 <= block; j += 8)
            _mm_storel_epi64(reinterpret_cast<__m128i*>(out + j), quantize8(window_max8<kRelu>(taps, j)));
#endif
          for (; j < block; ++j)
            out[j] = cpu::quantize_one(window_max<kRelu>(taps, j), inv_scale, lo, hi, zero_point);
        }
      }
    }
  });
}

}  // namespace

void cpu::max_pool2x2_blocked_to_nchw(const float* x, float* y, int64_t blocks, int64_t oh, int64_t ow,
                                      int64_t block, bool relu) {
  FRUGAL_ASSERT(block > 0 && block <= 16, "max_pool2x2_blocked_to_nchw: blocks of ", block, " channels");
  if (relu)
    max_pool2x2_blocked_to_nchw_impl<true>(x, y, blocks, oh, ow, block);
  else
    max_pool2x2_blocked_to_nchw_impl<false>(x, y, blocks, oh, ow, block);
}

void cpu::max_pool2x2_blocked_to_nhwc_u8(const float* x, uint8_t* y, int64_t images, int64_t channels,
                                         int64_t oh, int64_t ow, int64_t block, bool relu, float inv_scale,
                                         int32_t zero_point, int32_t qmax) {
  FRUGAL_ASSERT(block > 0 && block <= 16 && channels % block == 0,
                "max_pool2x2_blocked_to_nhwc_u8: ", channels, " channels in blocks of ", block);
  if (relu)
    max_pool2x2_blocked_to_nhwc_u8_impl<true>(x, y, images, channels, oh, ow, block, inv_scale, zero_point,
                                              qmax);
  else
    max_pool2x2_blocked_to_nhwc_u8_impl<false>(x, y, images, channels, oh, ow, block, inv_scale, zero_point,
                                               qmax);
}

namespace {

const bool kRegistered = [] {
  for_types<float, double, Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_max_pool2d.set(DeviceType::CPU, dtype_v<T>, max_pool2d_forward_cpu<T>);
    op_avg_pool2d.set(DeviceType::CPU, dtype_v<T>, avg_pool2d_forward_cpu<T>);
  });
  for_types<float, double, Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_max_pool2d_backward.set(DeviceType::CPU, dtype_v<T>,
                               pool2d_backward_cpu<T, max_pool2d_backward_plane<T, acc_t<T>>>);
    op_avg_pool2d_backward.set(DeviceType::CPU, dtype_v<T>,
                               pool2d_backward_cpu<T, avg_pool2d_backward_plane<T, acc_t<T>>>);
  });
  for (DType t : {DType::F16, DType::BF16}) {
    op_max_pool2d_backward.set(DeviceType::Meta, t, pool2d_backward_widened_meta);
    op_avg_pool2d_backward.set(DeviceType::Meta, t, pool2d_backward_widened_meta);
  }
  return true;
}();

}  // namespace
}  // namespace frugal
