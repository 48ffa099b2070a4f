// A head's small products on VDPBF16PS, for the fused attention's bf16 heads
// (kernels/cpu/self_attention.cpp): a register-blocked product of bf16 operands summed in f32, and the
// packings that put each operand's pairs side by side. Also the causal bounds of a head's products (Range),
// which its f32 products share.
//
//   cpu::bf16dot::pack_pairs(k, in, t, hd, kp);                           // K^T's pairs
//   cpu::bf16dot::gemm(t, t, hd, q, in, 2, kp, t, s, t, range);           // S = Q K^T, f32
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/half.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/transpose_block.h"
#include "kernels/cpu/vec.h"

// The products of bf16 heads on VDPBF16PS; stride / 2 in pack_pairs needs the 8 x 8 transposes of
// transpose_block.h.
#if FRUGAL_BF16_SIMD && defined(__AVX512BW__) && FRUGAL_TRANSPOSE_AVX
#define FRUGAL_ATTENTION_BF16_DOT 1
#endif

namespace frugal::cpu {

// The bounds of a causal product C = A B of one head (row i of C): the defaults give the whole product.
struct Range {
  bool lower_k = false;  // c <= i: k ends after row i (A lower triangular)
  bool upper_k = false;  // c >= i: k starts at row i (A upper triangular)
  bool lower_n = false;  // j <= i: columns end after row i (C's lower triangle wanted)
};

#if FRUGAL_ATTENTION_BF16_DOT
// Note [the attention's products in bf16]: with bf16 operands and a CPU with AVX512_BF16, a head's seven
// products (S = Q K^T, in the forward and again in the stats forms' backward; Y = P V; dV = P^T dY,
// dP = dY V^T, dQ = dS K, dK = dS^T Q) run on VDPBF16PS: 32 products of bf16 pairs summed into 16 f32
// lanes per instruction, twice the f32 FMA's rate. The f32 path converted q, k, v, dy to f32 and ran
// everything in f32; here:
// - q, k, v and dy are read where they lie in the packed rows, as bf16. Only the softmax and dS = s P (dP -
//   rowsum(dP P)) stay in f32, on the f32 S and dP the products return.
// - P and dS are rounded to bf16 to be multiplied (as PyTorch's bf16 attention does; the composite rounds
//   them too): one relative rounding of 2^-9 per entry, within the bf16 tolerance the results are tested
//   to. Every form (probs, low probs, stats) rounds the same P, so their y and gradients stay equal.
// - An operand's pairs along the summed dimension must sit side by side. A row-major operand has them
//   (q, dy, the rounded P and dS: their element (r, c) at r * row + c); K^T and V^T as the right operand are
//   K's and V's rows read as 32-bit pairs and transposed (pack_pairs); every other operand is interleaved,
//   rows 2p and 2p + 1 zipped into pair row p (interleave_rows), and a transposed left operand (P^T, dS^T)
//   is P's or dS's interleaving read with its pair and row strides exchanged.
// - VDPBF16PS treats bf16 subnormal inputs as 0 and flushes subnormal sums: products below 2^-126 are
//   lost, far under what bf16 data can resolve here.
// Odd head sizes take the f32 path (q's and dy's pairs would run past a row). Tested
// (tests/nn/test_self_attention.cpp): y against a naive forward in double that rounds P the same way, the
// gradients against the f32 kernels', every form against the composite. W3's attention (bf16, 2 threads):
// forward 510 -> 280-300 us, backward 875 -> 560-590 us.
namespace bf16dot {

inline __m512bh as_bh(__m512i x) {
  __m512bh r;
  std::memcpy(&r, &x, sizeof(r));
  return r;
}

inline uint32_t load_pair(const uint16_t* p) {
  uint32_t r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}

// v's lanes in m to c: as floats, or rounded to bf16 (Out = uint16_t). VDPBF16PS flushes subnormal sums,
// so v holds none, and VCVTNEPS2BF16 rounds it as core/half.h does (cpu::f32x16_to_bf16).
template <typename Out>
inline void store_lanes(Out* c, __mmask16 m, __m512 v) {
  if constexpr (std::is_same_v<Out, float>)
    _mm512_mask_storeu_ps(c, m, v);
  else
    _mm256_mask_storeu_epi16(c, m, cpu::f32x16_to_bf16(v));
}

// An MR x 32 block of C (rows crs apart; nr <= 32 columns stored; f32, or bf16 bits rounded from the f32
// sums) = A B over pairs [p0, p1): A's element (r, 2p + h) at a[r * a_row + p * a_pair + h], B's pair row p
// at b + p * brs (u32).
template <int MR, typename Out>
inline void block(int64_t nr, int64_t p0, int64_t p1, const uint16_t* a, int64_t a_row, int64_t a_pair,
                  const uint32_t* b, int64_t brs, Out* c, int64_t crs) {
  const __mmask16 m0 = first_lanes(nr), m1 = first_lanes(nr - 16);
  __m512 lo[MR], hi[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  for (int64_t p = p0; p < p1; ++p) {
    const __m512bh b0 = as_bh(_mm512_maskz_loadu_epi32(m0, b + p * brs));
    const __m512bh b1 = as_bh(_mm512_maskz_loadu_epi32(m1, b + p * brs + 16));
    const uint16_t* ap = a + p * a_pair;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512bh av = as_bh(_mm512_set1_epi32(int32_t(load_pair(ap + r * a_row))));
      lo[r] = _mm512_dpbf16_ps(lo[r], av, b0);
      hi[r] = _mm512_dpbf16_ps(hi[r], av, b1);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    store_lanes(c + r * crs, m0, lo[r]);
    store_lanes(c + r * crs + 16, m1, hi[r]);
  }
}

// block<mr> for mr = 1..8, by mr - 1.
template <typename Out>
using BlockFn = void (*)(int64_t, int64_t, int64_t, const uint16_t*, int64_t, int64_t, const uint32_t*,
                         int64_t, Out*, int64_t);
template <typename Out>
inline constexpr BlockFn<Out> kBlocks[8] = {block<1, Out>, block<2, Out>, block<3, Out>, block<4, Out>,
                                            block<5, Out>, block<6, Out>, block<7, Out>, block<8, Out>};

// C [m, n] = A [m, k] B [k, n] with A as block()'s and B interleaved (u32 [ceil(k / 2), n], rows brs
// apart); C f32, or bf16 (Out = uint16_t: the head's results, written in place). `range` skips what a
// causal mask zeroes, as small_gemm's. With lower_k an odd k1 takes the pair (k1 - 1, k1): A's element k1
// of those rows is 0 (past the diagonal), and B has the row.
template <typename Out>
inline void gemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_row, int64_t a_pair,
                 const uint32_t* b, int64_t brs, Out* c, int64_t crs, Range range = {}) {
  constexpr int64_t MR = 8, NR = 32;
  for (int64_t i = 0; i < m; i += MR) {
    const int64_t mr = std::min(MR, m - i), last = i + mr - 1;
    const int64_t k0 = range.upper_k ? std::min(i, k) : 0, k1 = range.lower_k ? std::min(last + 1, k) : k;
    const int64_t p0 = k0 / 2, p1 = (k1 + 1) / 2;  // i is even: k0 starts a pair
    const int64_t n1 = range.lower_n ? std::min((last + NR) / NR * NR, n) : n;
    for (int64_t j = 0; j < n1; j += NR)
      kBlocks<Out>[mr - 1](std::min(NR, n1 - j), p0, p1, a + i * a_row, a_row, a_pair, b + j, brs,
                           c + i * crs + j, crs);
  }
}

// The pair rows of src [rows, cols] (bf16 bits, rows `stride` apart): dst[p * cols + j] = src[2p][j] |
// src[2p + 1][j] << 16, p < ceil(rows / 2), the second of an odd last row's pair 0.
inline void interleave_rows(const uint16_t* src, int64_t stride, int64_t rows, int64_t cols, uint32_t* dst) {
  // zip[2q] = q, zip[2q + 1] = 32 + q: element q of the first row, then of the second.
  alignas(64) static const std::array<uint16_t, 32> zip = [] {
    std::array<uint16_t, 32> z{};
    for (int q = 0; q < 16; ++q) z[size_t(2 * q)] = uint16_t(q), z[size_t(2 * q + 1)] = uint16_t(32 + q);
    return z;
  }();
  const __m512i order = _mm512_load_si512(zip.data());
  for (int64_t p = 0; 2 * p < rows; ++p) {
    const uint16_t* r0 = src + 2 * p * stride;
    const uint16_t* r1 = r0 + stride;
    const bool second = 2 * p + 1 < rows;
    for (int64_t j = 0; j < cols; j += 16) {
      const __mmask16 k = first_lanes(cols - j);
      const __m512i x = _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(k, r0 + j));
      const __m512i y =
          _mm512_castsi256_si512(second ? _mm256_maskz_loadu_epi16(k, r1 + j) : _mm256_setzero_si256());
      _mm512_mask_storeu_epi32(dst + p * cols + j, k, _mm512_permutex2var_epi16(x, order, y));
    }
  }
}

// rows x cols of f32 src (rows `stride` apart) rounded to bf16 rows of dst (rows dst_stride apart), as
// core/half.h rounds (cpu::from_f32); a pad column (dst_stride > cols) is set to 0.
inline void round_rows(const float* src, int64_t stride, int64_t rows, int64_t cols, uint16_t* dst,
                       int64_t dst_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    cpu::from_f32(src + r * stride, reinterpret_cast<BFloat16*>(dst + r * dst_stride), cols);
    if (dst_stride > cols) dst[r * dst_stride + cols] = 0;
  }
}

// interleave_rows of f32 src [rows, cols] (rows `stride` apart) rounded to bf16 as round_rows does.
inline void interleave_rows_f32(const float* src, int64_t stride, int64_t rows, int64_t cols, uint32_t* dst) {
  for (int64_t p = 0; 2 * p < rows; ++p) {
    const float* r0 = src + 2 * p * stride;
    const float* r1 = r0 + stride;
    const bool second = 2 * p + 1 < rows;
    uint32_t* out = dst + p * cols;
    int64_t j = 0;
    for (; j + 16 <= cols; j += 16) {
      const __m512 x = _mm512_loadu_ps(r0 + j), y = second ? _mm512_loadu_ps(r1 + j) : _mm512_setzero_ps();
      if (cpu::bf16_flushes(x) | cpu::bf16_flushes(y)) break;  // subnormals: the scalar rounding below
      const __m512i lo = _mm512_cvtepu16_epi32(cpu::f32x16_to_bf16(x));
      const __m512i hi = _mm512_cvtepu16_epi32(cpu::f32x16_to_bf16(y));
      _mm512_storeu_si512(out + j, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
    for (; j < cols; ++j)
      out[j] = uint32_t(BFloat16(r0[j]).bits) | (second ? uint32_t(BFloat16(r1[j]).bits) << 16 : 0u);
  }
}

// K's (or V's) rows [t, hd] (rows `stride` apart, hd even) as the right operand of a product with K^T:
// dst[p * t + j] = the pair (K[j][2p], K[j][2p + 1]), p < hd / 2: the 32-bit pairs transposed, 8 x 8 at a
// time.
inline void pack_pairs(const uint16_t* src, int64_t stride, int64_t t, int64_t hd, uint32_t* dst) {
  const int64_t pairs = hd / 2;
  int64_t j = 0;
  for (; j + 8 <= t; j += 8) {
    int64_t p = 0;
    for (; p + 8 <= pairs; p += 8) {
      // 8 rows of 8 pairs, rows stride / 2 pairs apart (stride is even: the packed rows' 3 d), as floats
      // (the transpose only moves bits).
      __m256 c[8];
      cpu::transpose8x8_load(reinterpret_cast<const float*>(src + j * stride + 2 * p), stride / 2, c);
      for (int q = 0; q < 8; ++q) _mm256_storeu_ps(reinterpret_cast<float*>(dst + (p + q) * t + j), c[q]);
    }
    for (; p < pairs; ++p)
      for (int i = 0; i < 8; ++i) dst[p * t + j + i] = load_pair(src + (j + i) * stride + 2 * p);
  }
  for (; j < t; ++j)
    for (int64_t p = 0; p < pairs; ++p) dst[p * t + j] = load_pair(src + j * stride + 2 * p);
}

}  // namespace bf16dot
#endif

}  // namespace frugal::cpu
