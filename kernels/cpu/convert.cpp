// f32 <-> f16 / bf16 over contiguous runs (kernels/cpu/convert.h): AVX-512 BF16 and F16C instructions when
// the build targets them (not with FRUGAL_PORTABLE), core/half.h's scalar conversions otherwise and for the
// tails.
//
// The instructions differ from the scalar conversions on a few inputs, and a block holding one of those
// converts element by element instead, so both paths give the same bits:
//   VCVTNEPS2BF16 treats f32 subnormals as zero (the scalar path rounds them);
//   VCVTPH2PS quiets a signalling NaN (the scalar path keeps the payload as it is);
//   VCVTPS2PH keeps the top of a NaN's payload (the scalar path makes every NaN 0x7e00 with its sign).
#include "kernels/cpu/convert.h"

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__F16C__) && defined(__AVX2__)
#define FRUGAL_F16_SIMD 1
#endif
// Without AVX-512 BF16: bf16 in AVX2's integer lanes, the scalar conversions' operations 8 at a time.
#if defined(__AVX2__) && !defined(FRUGAL_BF16_SIMD)
#define FRUGAL_BF16_AVX2 1
#endif

namespace frugal::cpu {

namespace {

void to_f32_scalar(const Half* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = detail::half_to_float(in[i].bits);
}
void to_f32_scalar(const BFloat16* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = detail::bf16_to_float(in[i].bits);
}
void from_f32_scalar(const float* in, Half* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i].bits = detail::float_to_half(in[i]);
}
void from_f32_scalar(const float* in, BFloat16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i].bits = detail::float_to_bf16(in[i]);
}

#ifdef FRUGAL_BF16_AVX2
// 8 floats to bf16 in 32-bit lanes, as detail::float_to_bf16: a NaN keeps its upper half with the quiet bit
// set, anything else rounds to nearest even by adding 0x7fff and the kept part's lowest bit (a carry into
// the exponent makes the largest finite values inf, as in the scalar conversion).
inline __m256i f32x8_to_bf16_lanes(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i high = _mm256_srli_epi32(u, 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));  // both sides below 2^31
  const __m256i odd = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
  return _mm256_blendv_epi8(rounded, _mm256_or_si256(high, _mm256_set1_epi32(0x40)), nan);
}
#endif

}  // namespace

const char* conversion_isa() {
#if defined(FRUGAL_BF16_SIMD) && defined(FRUGAL_F16_SIMD)
  return "avx512bf16+f16c";
#elif defined(FRUGAL_BF16_SIMD)
  return "avx512bf16";
#elif defined(FRUGAL_BF16_AVX2) && defined(FRUGAL_F16_SIMD)
  return "avx2+f16c";
#elif defined(FRUGAL_BF16_AVX2)
  return "avx2";
#elif defined(FRUGAL_F16_SIMD)
  return "f16c";
#else
  return "portable";
#endif
}

void to_f32(const BFloat16* in, float* out, int64_t n) {
  int64_t i = 0;
#ifdef FRUGAL_BF16_SIMD
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, bf16x16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))));
#elif defined(FRUGAL_BF16_AVX2)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, bf16x8_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
#endif
  to_f32_scalar(in + i, out + i, n - i);
}

void from_f32(const float* in, BFloat16* out, int64_t n) {
  int64_t i = 0;
#ifdef FRUGAL_BF16_SIMD
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(in + i);
    if (bf16_flushes(v))
      from_f32_scalar(in + i, out + i, 16);
    else
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), f32x16_to_bf16(v));
  }
#elif defined(FRUGAL_BF16_AVX2)
  for (; i + 16 <= n; i += 16) {
    // packus keeps each 128-bit half apart: a0-3 b0-3 | a4-7 b4-7, put in order by one permute
    const __m256i a = f32x8_to_bf16_lanes(_mm256_loadu_ps(in + i));
    const __m256i b = f32x8_to_bf16_lanes(_mm256_loadu_ps(in + i + 8));
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
  }
#endif
  from_f32_scalar(in + i, out + i, n - i);
}

void to_f32(const Half* in, float* out, int64_t n) {
  int64_t i = 0;
#ifdef FRUGAL_F16_SIMD
  const __m128i abs_mask = _mm_set1_epi16(0x7fff), inf = _mm_set1_epi16(0x7c00);
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    if (_mm_movemask_epi8(_mm_cmpgt_epi16(_mm_and_si128(h, abs_mask), inf))) {  // a NaN
      to_f32_scalar(in + i, out + i, 8);
      continue;
    }
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
#endif
  to_f32_scalar(in + i, out + i, n - i);
}

void from_f32(const float* in, Half* out, int64_t n) {
  int64_t i = 0;
#ifdef FRUGAL_F16_SIMD
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(in + i);
    const __m256i a = _mm256_and_si256(_mm256_castps_si256(v), abs_mask);
    if (_mm256_movemask_epi8(_mm256_cmpgt_epi32(a, inf))) {  // a NaN
      from_f32_scalar(in + i, out + i, 8);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  from_f32_scalar(in + i, out + i, n - i);
}

void to_f32_portable(const Half* in, float* out, int64_t n) { to_f32_scalar(in, out, n); }
void to_f32_portable(const BFloat16* in, float* out, int64_t n) { to_f32_scalar(in, out, n); }
void from_f32_portable(const float* in, Half* out, int64_t n) { from_f32_scalar(in, out, n); }
void from_f32_portable(const float* in, BFloat16* out, int64_t n) { from_f32_scalar(in, out, n); }

}  // namespace frugal::cpu
