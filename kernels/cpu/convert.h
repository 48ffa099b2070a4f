// Conversions of contiguous runs between f32 and the 16-bit floats, for the kernels that widen 16-bit
// operands into f32 blocks (GEMM, convolution), the elementwise kernels' buffers and the cast op; vectorised
// where the build allows. Bit-exact with core/half.h's scalar conversions: round to nearest even, overflow to
// inf, subnormals kept, NaN stays NaN.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/half.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define FRUGAL_BF16_SIMD 1
#endif

namespace frugal::cpu {

// 8 or 16 bf16 values to f32: exact, the bf16 bits are the f32's upper half (zero-extend, shift).
#if defined(__AVX2__)
inline __m256 bf16x8_to_f32(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif
#if defined(__AVX512F__)
inline __m512 bf16x16_to_f32(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

#if FRUGAL_BF16_SIMD
// The lanes of v that VCVTNEPS2BF16 would round unlike core/half.h: nonzero f32 subnormals, which it
// flushes and the scalar conversion rounds. 0 < |bits| < the smallest normal, as |bits| - 1 < 0x7fffff
// unsigned.
inline __mmask16 bf16_flushes(__m512 v) {
  const __m512i a = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff));
  return _mm512_cmplt_epu32_mask(_mm512_sub_epi32(a, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fffff));
}
// 16 floats to bf16 by VCVTNEPS2BF16: core/half.h's rounding where bf16_flushes(v) is 0.
inline __m256i f32x16_to_bf16(__m512 v) {
  const __m256bh b = _mm512_cvtneps_pbh(v);
  __m256i r;
  std::memcpy(&r, &b, sizeof(r));
  return r;
}
#endif

void to_f32(const Half* in, float* out, int64_t n);
void to_f32(const BFloat16* in, float* out, int64_t n);
void from_f32(const float* in, Half* out, int64_t n);
void from_f32(const float* in, BFloat16* out, int64_t n);

// The instruction sets the conversions above use: "avx512bf16+f16c", ..., or "portable".
const char* conversion_isa();
// core/half.h's scalar conversions over runs: what the ones above must match bit for bit.
void to_f32_portable(const Half* in, float* out, int64_t n);
void to_f32_portable(const BFloat16* in, float* out, int64_t n);
void from_f32_portable(const float* in, Half* out, int64_t n);
void from_f32_portable(const float* in, BFloat16* out, int64_t n);

}  // namespace frugal::cpu
