// The float8 codes' blocks of the CPU Adam8bit kernel (op_adam8bit_step with args.float8; Note [the float8
// codes], kernels/float8_code.h): a portable form for every dtype and a vector one for f32, AVX2 (Note
// [float8 moments with AVX2]) or AVX-512 (Note [float8 moments with AVX-512]) by what the build targets, run
// by kernels/cpu/optim8bit.cpp's loop over the blocks; and the block encoder the codes' tests check
// (float8_code_encode_block_cpu).
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/dtype.h"
#include "kernels/cpu/optim8bit.h"
#include "kernels/cpu/reference.h"
#include "kernels/dynamic_code.h"
#include "kernels/float8_code.h"

namespace frugal::optim8bit {

template <typename T, typename C>
void float8_block_portable(T* p, const T* g, uint8_t* c1, float* absmax1, uint8_t* c2, float* absmax2,
                           const math::Adam8bitHyper<C>& h, C* m, C* v, int64_t len) {
  const float8_code::BlockFactors<C> old = float8_code::factors_of<C>(*absmax1, *absmax2);
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) {
    m[i] = C(float8_code::decode_signed(c1[i])) * old.exp_avg;
    const C root = C(float8_code::decode_unsigned(c2[i])) * old.root;
    v[i] = root * root;
  }
  update_block(p, g, m, v, h, len);
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) v[i] = math::sqrt_(v[i]);
  *absmax1 = float(finite_max(m, len));
  *absmax2 = float(finite_max(v, len));
  const float8_code::BlockFactors<C> now = float8_code::factors_of<C>(*absmax1, *absmax2);
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) {
    c1[i] = float8_code::encode_signed(float(m[i] * now.inv_exp_avg));
    c2[i] = float8_code::encode_unsigned(float(v[i] * now.inv_root));
  }
}

template void float8_block_portable(float*, const float*, uint8_t*, float*, uint8_t*, float*,
                                    const math::Adam8bitHyper<float>&, float*, float*, int64_t);
template void float8_block_portable(double*, const double*, uint8_t*, float*, uint8_t*, float*,
                                    const math::Adam8bitHyper<double>&, double*, double*, int64_t);
template void float8_block_portable(Half*, const Half*, uint8_t*, float*, uint8_t*, float*,
                                    const math::Adam8bitHyper<float>&, float*, float*, int64_t);
template void float8_block_portable(BFloat16*, const BFloat16*, uint8_t*, float*, uint8_t*, float*,
                                    const math::Adam8bitHyper<float>&, float*, float*, int64_t);

// Note [encoding normal codes]: where every value of a vector, of both codes, is at least 2^-14 (a normal
// code's) and not NaN, the vector blocks encode by the integer rounding alone: no subnormals' add and blend,
// no masks for NaN and for the unsigned code's q <= 0, and the unsigned code's clamp left to the saturating
// narrowing to bytes (AVX-512's vpmovusdb, AVX2's packus), inf and values beyond the top included. That is
// nearly every vector of a real block: a moment under 2^-14 of its block's largest is rare. Other vectors (a
// zero moment, where a gradient is 0; NaN) take the general path, with the same codes. Measured on a Zen 4
// (bench_optim8bit, W3's parameters, medians of 5, 3-4 rounds alternated with the library before;
// 2026-12-06): AVX-512, one thread 504-520 -> 436-450 us (f32 Adam's kernel 332-345: 1.31-1.35x its time,
// was 1.5x), two threads 285-354 -> 241-255 (f32 Adam's 205-215: 1.16-1.21x); the AVX2 block on the same
// machine 602-619 -> 529-597 and 339-383 -> 307-329. Measured and dropped on the same machine: the encoding
// interleaved with the next block's pass 1, as the dynamic code's is, 16 to 128 elements of each at a time
// (no faster: 438-570 against 436-507 in the same rounds); the decoders' multiply by 2^112 folded into the
// block's scales (one multiply fewer a code, within noise).

#if FRUGAL_FLOAT8_AVX2
namespace avx2 {
namespace {

// Note [float8 moments with AVX2]: the float8 codes (kernels/float8_code.h) in vectors of 8, with no table
// and no gather, and with the scalar functions' results:
// - Decoding: a code's bits shifted into an f32's exponent and mantissa are its value x 2^-112, the codes
//   below 2^M (float8's subnormals) landing on f32's subnormals; one multiply by 2^112 finishes it, exactly.
//   That needs the CPU to read subnormal inputs as they are: with MXCSR's DAZ set (not by frugal; by a
//   caller), the kernel decodes as float8_code does, in seven operations instead of one
//   (decode8_magnitude_exact).
//   The signed code is sign-extended first, so its sign bit lands on the f32's.
// - Encoding: as float8_code::encode_magnitude, the f32's bits plus a rounding increment (ties to even)
//   less the exponent offset, shifted down; below 2^-14 an add of 2^(9 - M), which rounds; a blend.
// - A block's scales: the largest |exp_avg| and root; a NaN lane drops out of _mm256_max_ps (it returns its
//   second operand), an inf gets in, and then the block's finite maximum is taken again from the buffer.
// The f32 block takes two passes as the dynamic code's (Note [Adam8bit with AVX2]); pass 1 stores the new
// roots, which the update computes anyway, for pass 2 to encode. On the Zen 3 this was measured on (one
// thread, W3's parameters), pass 1 alone took 0.59 ns an element (before the update took bitsandbytes'
// form, one division fewer) and pass 2 alone 0.42; f32 Adam's whole kernel 0.53. Measured and dropped:
// - pass 2 of one block interleaved with pass 1 of the next, 32 elements of each at a time (as the
//   dynamic code's AVX-512 blocks are), so that the encoding's integer work runs while pass 1 waits for its
//   divider: about 1.15x slower (930 against 812 us), with the buffers skewed against 4 KiB aliasing and
//   the encoder inlined;
// - an encoder with a tenth fewer instructions, rounding with one float add (a + 2^(max(e, -14) + 23 - M)
//   has the codes' spacing as its ulp, subnormals included), NaN and inf clamped by max/min, the sign and
//   the signed code's clamp applied to the packed bytes: the same 0.42 ns an element.

inline __m256i load8_unsigned(const uint8_t* codes) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
}
inline __m256i load8_signed(const uint8_t* codes) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
}

// float8_code::decode_signed / decode_unsigned of 8 codes (Note [float8 moments with AVX2]), through f32's
// subnormals (kSubnormals) or as float8_code's scalar functions.
// float8_code::decode_magnitude<F> of 8 magnitudes k <= F::kLargest, as the scalar function computes it.
template <typename F>
inline __m256 decode8_magnitude_exact(__m256i k) {
  const __m256i subnormal = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(F::kFirstNormal)), k);
  const __m256i biased =
      _mm256_add_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(int(F::kOffset))),
                       _mm256_and_si256(subnormal, _mm256_set1_epi32(int(F::kFirstNormal))));
  return _mm256_sub_ps(_mm256_castsi256_ps(_mm256_slli_epi32(biased, F::kShift)),
                       _mm256_and_ps(_mm256_castsi256_ps(subnormal), _mm256_set1_ps(F::kSmallestNormal)));
}
template <bool kSubnormals>
inline __m256 decode8_signed(const uint8_t* codes) {
  using F = float8_code::Signed;
  const __m256i k = load8_signed(codes);  // the sign bit in bits 7 to 31
  if constexpr (kSubnormals) {
    const __m256i bits =
        _mm256_and_si256(_mm256_slli_epi32(k, F::kShift), _mm256_set1_epi32(int(0x87ffffffu)));
    return _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(0x1p112f));
  }
  const __m256 a = decode8_magnitude_exact<F>(_mm256_and_si256(k, _mm256_set1_epi32(0x7f)));
  return _mm256_or_ps(a, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(k, 31), 31)));
}
template <bool kSubnormals>
inline __m256 decode8_unsigned(const uint8_t* codes) {
  using F = float8_code::Unsigned;
  const __m256i k = load8_unsigned(codes);
  if constexpr (kSubnormals)
    return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(k, F::kShift)), _mm256_set1_ps(0x1p112f));
  return decode8_magnitude_exact<F>(k);
}

// The codes of 8 magnitudes >= 2^-14 (not NaN) from their bits b, before the clamp to F::kLargest: the
// bits rounded to F's mantissa (ties to even), less the exponent offset.
template <typename F>
inline __m256i encode8_normal(__m256i b) {
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, F::kShift), _mm256_set1_epi32(1));
  const __m256i increment = _mm256_set1_epi32(int((1u << (F::kShift - 1)) - 1 - (F::kOffset << F::kShift)));
  return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, odd), increment), F::kShift);
}

// encode_magnitude<F> of 8 magnitudes a >= 0 (a NaN lane gives some code: the callers mask it).
template <typename F>
inline __m256i encode8_magnitude(__m256 a) {
  // Below 2^-14 encode8_normal wraps, and the blend drops it.
  const __m256i normal = encode8_normal<F>(_mm256_castps_si256(a));
  const __m256 magic = _mm256_set1_ps(F::kMagic);
  const __m256i small =
      _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(a, magic)), _mm256_castps_si256(magic));
  const __m256 is_small = _mm256_cmp_ps(a, _mm256_set1_ps(F::kSmallestNormal), _CMP_LT_OQ);
  const __m256i k = _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(normal), _mm256_castsi256_ps(small), is_small));
  return _mm256_min_epu32(k, _mm256_set1_epi32(int(F::kLargest)));
}

// float8_code::encode_signed / encode_unsigned of 8 values, as int32 lanes.
inline __m256i encode8_signed(__m256 q) {
  const __m256 sign = _mm256_and_ps(q, _mm256_set1_ps(-0.0f));
  const __m256i k = encode8_magnitude<float8_code::Signed>(_mm256_xor_ps(q, sign));
  const __m256i ordered = _mm256_castps_si256(_mm256_cmp_ps(q, q, _CMP_ORD_Q));
  return _mm256_and_si256(_mm256_or_si256(k, _mm256_srli_epi32(_mm256_castps_si256(sign), 24)), ordered);
}
inline __m256i encode8_unsigned(__m256 q) {
  const __m256i positive = _mm256_castps_si256(_mm256_cmp_ps(q, _mm256_setzero_ps(), _CMP_GT_OQ));
  return _mm256_and_si256(encode8_magnitude<float8_code::Unsigned>(q), positive);
}

// codes1[i] = encode_signed(m[i] x inv1), codes2[i] = encode_unsigned(root[i] x inv2), i < len: 32 at a
// time, the rest one by one.
void float8_encode_block(const float* m, float inv1, uint8_t* codes1, const float* root, float inv2,
                         uint8_t* codes2, int64_t len) {
  using S = float8_code::Signed;
  using U = float8_code::Unsigned;
  const __m256 scale1 = _mm256_set1_ps(inv1), scale2 = _mm256_set1_ps(inv2);
  const __m256 smallest_normal = _mm256_set1_ps(S::kSmallestNormal);
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  int64_t i = 0;
  for (; i + 32 <= len; i += 32) {
    __m256 q1[4], q2[4];
    __m256 normal = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (int j = 0; j < 4; ++j) {
      q1[j] = _mm256_mul_ps(_mm256_loadu_ps(m + i + 8 * j), scale1);
      q2[j] = _mm256_mul_ps(_mm256_loadu_ps(root + i + 8 * j), scale2);
      const __m256 a1 = _mm256_and_ps(q1[j], _mm256_castsi256_ps(magnitude));
      normal = _mm256_and_ps(normal, _mm256_and_ps(_mm256_cmp_ps(a1, smallest_normal, _CMP_GE_OQ),
                                                   _mm256_cmp_ps(q2[j], smallest_normal, _CMP_GE_OQ)));
    }
    __m256i k1[4], k2[4];
    if (_mm256_movemask_ps(normal) == 0xff) {  // Note [encoding normal codes]
      for (int j = 0; j < 4; ++j) {
        const __m256i b1 = _mm256_castps_si256(q1[j]);
        const __m256i a1 = _mm256_min_epu32(encode8_normal<S>(_mm256_and_si256(b1, magnitude)),
                                            _mm256_set1_epi32(int(S::kLargest)));
        k1[j] = _mm256_or_si256(a1, _mm256_and_si256(_mm256_srli_epi32(b1, 24), _mm256_set1_epi32(0x80)));
        k2[j] = encode8_normal<U>(_mm256_castps_si256(q2[j]));  // above 255: packus saturates
      }
    } else {
      for (int j = 0; j < 4; ++j) {
        k1[j] = encode8_signed(q1[j]);
        k2[j] = encode8_unsigned(q2[j]);
      }
    }
    pack32(k1, codes1 + i);
    pack32(k2, codes2 + i);
  }
  for (; i < len; ++i) {
    codes1[i] = float8_code::encode_signed(m[i] * inv1);
    codes2[i] = float8_code::encode_unsigned(root[i] * inv2);
  }
}

// The largest |x[i]|: the vector's maximum when finite, else the block's finite maximum from x.
inline float finite_max_of(__m256 max, const float* x, int64_t len) {
  const float r = max_of(max);
  return r <= std::numeric_limits<float>::max() ? r : finite_max(x, len);
}

}  // namespace

template <bool kCoupled, bool kDecoupled, bool kSubnormals>
void float8_block(float* p, const float* g, uint8_t* c1, float* absmax1, uint8_t* c2, float* absmax2,
                  const math::Adam8bitHyper<float>& h, float* m, float* root, int64_t len) {
  const float8_code::BlockFactors<float> old = float8_code::factors_of<float>(*absmax1, *absmax2);
  const __m256 scale1 = _mm256_set1_ps(old.exp_avg), scale2 = _mm256_set1_ps(old.root);
  const Hyper8 h8(h);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 max1 = _mm256_setzero_ps(), max2 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m256 r = _mm256_mul_ps(decode8_unsigned<kSubnormals>(c2 + i), scale2);
    const Step8 e = step8<kCoupled, kDecoupled>(h8, _mm256_loadu_ps(p + i), _mm256_loadu_ps(g + i),
                                                _mm256_mul_ps(decode8_signed<kSubnormals>(c1 + i), scale1),
                                                _mm256_mul_ps(r, r));
    _mm256_storeu_ps(p + i, e.p);
    _mm256_storeu_ps(m + i, e.m);
    _mm256_storeu_ps(root + i, e.root);
    max1 = _mm256_max_ps(_mm256_andnot_ps(sign, e.m), max1);
    max2 = _mm256_max_ps(e.root, max2);
  }
  for (; i < len; ++i) {
    const float r = float8_code::decode_unsigned(c2[i]) * old.root;
    const math::Adam8bitElement<float> e =
        math::adam8bit_step(p[i], g[i], float8_code::decode_signed(c1[i]) * old.exp_avg, r * r, h);
    p[i] = e.p;
    m[i] = e.m;
    root[i] = math::sqrt_(e.v);
    max1 = _mm256_max_ps(_mm256_set1_ps(std::fabs(e.m)), max1);
    max2 = _mm256_max_ps(_mm256_set1_ps(root[i]), max2);
  }
  *absmax1 = finite_max_of(max1, m, len);
  *absmax2 = finite_max_of(max2, root, len);
  const float8_code::BlockFactors<float> now = float8_code::factors_of<float>(*absmax1, *absmax2);
  float8_encode_block(m, now.inv_exp_avg, c1, root, now.inv_root, c2, len);
}

// The forms the loop calls: coupled or decoupled weight decay (or none), with or without subnormals.
using Float8Block = void(float*, const float*, uint8_t*, float*, uint8_t*, float*,
                         const math::Adam8bitHyper<float>&, float*, float*, int64_t);
template Float8Block float8_block<false, false, false>;
template Float8Block float8_block<false, false, true>;
template Float8Block float8_block<true, false, false>;
template Float8Block float8_block<true, false, true>;
template Float8Block float8_block<false, true, false>;
template Float8Block float8_block<false, true, true>;

}  // namespace avx2
#endif

#if FRUGAL_FLOAT8_AVX512
namespace float8_avx512 {
namespace {

using Float8Block = void(float*, const float*, uint8_t*, float*, uint8_t*, float*,
                         const math::Adam8bitHyper<float>&, float*, float*, int64_t);

// Note [float8 moments with AVX-512]: the AVX2 block (Note [float8 moments with AVX2]; built instead of this
// one where the build targets no AVX-512) in vectors of 16, the
// same operations lane for lane, with masks where AVX2 blends and compares into vectors, and the codes stored
// by one truncating vpmovdb where AVX2 packs and permutes. A Zen 4 runs a 512-bit operation in two halves,
// so what it gains is instructions: on W3's parameters (bench_optim8bit, medians of 5, 3 to 4 rounds
// alternated with the AVX2 block; 2026-12-06) one thread took 512-522 us against 598-613 (f32 Adam's kernel
// 333-346: 1.5x its time against 1.8x), two threads 288-327 against 332-426 (f32 Adam 202-214); since, with
// Note [encoding normal codes], 1.31-1.35x and 1.16-1.21x. Pass 1 waits on its division and square root
// (half its samples in perf land on the instruction after vdivps); pass 2 takes 0.6 of its time. Measured
// and dropped: 64 codes stored by two rounds of packus and one vpermd instead of four vpmovdb (no faster).

// float8_code::decode_magnitude<F> of 16 magnitudes k <= F::kLargest, as the scalar function computes it.
template <typename F>
inline __m512 decode16_magnitude_exact(__m512i k) {
  const __mmask16 subnormal = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(int(F::kFirstNormal)), k);
  const __m512i base = _mm512_add_epi32(k, _mm512_set1_epi32(int(F::kOffset)));
  const __m512i biased =
      _mm512_mask_add_epi32(base, subnormal, base, _mm512_set1_epi32(int(F::kFirstNormal)));
  const __m512 value = _mm512_castsi512_ps(_mm512_slli_epi32(biased, F::kShift));
  return _mm512_mask_sub_ps(value, subnormal, value, _mm512_set1_ps(F::kSmallestNormal));
}
template <bool kSubnormals>
inline __m512 decode16_signed(const uint8_t* codes) {
  using F = float8_code::Signed;
  const __m512i k = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  if constexpr (kSubnormals) {
    const __m512i bits =
        _mm512_and_si512(_mm512_slli_epi32(k, F::kShift), _mm512_set1_epi32(int(0x87ffffffu)));
    return _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(0x1p112f));
  }
  const __m512 a = decode16_magnitude_exact<F>(_mm512_and_si512(k, _mm512_set1_epi32(0x7f)));
  return _mm512_castsi512_ps(
      _mm512_or_si512(_mm512_castps_si512(a), _mm512_slli_epi32(_mm512_srli_epi32(k, 31), 31)));
}
template <bool kSubnormals>
inline __m512 decode16_unsigned(const uint8_t* codes) {
  using F = float8_code::Unsigned;
  const __m512i k = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  if constexpr (kSubnormals)
    return _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(k, F::kShift)), _mm512_set1_ps(0x1p112f));
  return decode16_magnitude_exact<F>(k);
}

// The codes of 16 magnitudes >= 2^-14 (not NaN) from their bits b, before the clamp to F::kLargest: the
// bits rounded to F's mantissa (ties to even), less the exponent offset.
template <typename F>
inline __m512i encode16_normal(__m512i b) {
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, F::kShift), _mm512_set1_epi32(1));
  const __m512i increment = _mm512_set1_epi32(int((1u << (F::kShift - 1)) - 1 - (F::kOffset << F::kShift)));
  return _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, odd), increment), F::kShift);
}

// encode_magnitude<F> of 16 magnitudes a >= 0 (a NaN lane gives some code: the callers mask it).
template <typename F>
inline __m512i encode16_magnitude(__m512 a) {
  // Below 2^-14 encode16_normal wraps, and the blend drops it.
  const __m512i normal = encode16_normal<F>(_mm512_castps_si512(a));
  const __m512 magic = _mm512_set1_ps(F::kMagic);
  const __m512i small =
      _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(a, magic)), _mm512_castps_si512(magic));
  const __mmask16 is_small = _mm512_cmp_ps_mask(a, _mm512_set1_ps(F::kSmallestNormal), _CMP_LT_OQ);
  return _mm512_min_epu32(_mm512_mask_blend_epi32(is_small, normal, small),
                          _mm512_set1_epi32(int(F::kLargest)));
}

// float8_code::encode_signed / encode_unsigned of 16 values, as int32 lanes.
inline __m512i encode16_signed(__m512 q) {
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(q), _mm512_set1_epi32(int(0x80000000u)));
  const __m512i k = encode16_magnitude<float8_code::Signed>(
      _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(q), sign)));
  return _mm512_maskz_or_epi32(_mm512_cmp_ps_mask(q, q, _CMP_ORD_Q), k, _mm512_srli_epi32(sign, 24));
}
inline __m512i encode16_unsigned(__m512 q) {
  return _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(q, _mm512_setzero_ps(), _CMP_GT_OQ),
                                encode16_magnitude<float8_code::Unsigned>(q));
}

// The low bytes of 16 int32 codes (each in [0, 255]) to out[0 .. 16).
inline void store16(__m512i k, uint8_t* out) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(k));
}

// codes1[0 .. 16) = encode_signed(q1), codes2[0 .. 16) = encode_unsigned(q2).
inline void encode16(__m512 q1, __m512 q2, uint8_t* codes1, uint8_t* codes2) {
  using S = float8_code::Signed;
  using U = float8_code::Unsigned;
  const __m512 smallest_normal = _mm512_set1_ps(S::kSmallestNormal);
  const __m512i b1 = _mm512_castps_si512(q1);
  const __m512i a1 = _mm512_and_si512(b1, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 normal1 = _mm512_cmp_ps_mask(_mm512_castsi512_ps(a1), smallest_normal, _CMP_GE_OQ);
  if (_mm512_mask_cmp_ps_mask(normal1, q2, smallest_normal, _CMP_GE_OQ) == 0xffff) {
    const __m512i k1 = _mm512_min_epu32(encode16_normal<S>(a1), _mm512_set1_epi32(int(S::kLargest)));
    store16(_mm512_ternarylogic_epi32(k1, _mm512_srli_epi32(b1, 24), _mm512_set1_epi32(0x80), 0xf8), codes1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes2),
                     _mm512_cvtusepi32_epi8(encode16_normal<U>(_mm512_castps_si512(q2))));
  } else {
    store16(encode16_signed(q1), codes1);
    store16(encode16_unsigned(q2), codes2);
  }
}

}  // namespace

void float8_encode_block(const float* m, float inv1, uint8_t* codes1, const float* root, float inv2,
                         uint8_t* codes2, int64_t len) {
  const __m512 scale1 = _mm512_set1_ps(inv1), scale2 = _mm512_set1_ps(inv2);
  int64_t i = 0;
  for (; i + 16 <= len; i += 16)
    encode16(_mm512_mul_ps(_mm512_loadu_ps(m + i), scale1), _mm512_mul_ps(_mm512_loadu_ps(root + i), scale2),
             codes1 + i, codes2 + i);
  for (; i < len; ++i) {
    codes1[i] = float8_code::encode_signed(m[i] * inv1);
    codes2[i] = float8_code::encode_unsigned(root[i] * inv2);
  }
}

template <bool kCoupled, bool kDecoupled, bool kSubnormals>
void float8_block(float* p, const float* g, uint8_t* c1, float* absmax1, uint8_t* c2, float* absmax2,
                  const math::Adam8bitHyper<float>& h, float* m, float* root, int64_t len) {
  const float8_code::BlockFactors<float> old = float8_code::factors_of<float>(*absmax1, *absmax2);
  const __m512 scale1 = _mm512_set1_ps(old.exp_avg), scale2 = _mm512_set1_ps(old.root);
  const __m512 beta1 = _mm512_set1_ps(h.beta1), beta2 = _mm512_set1_ps(h.beta2),
               one_minus_beta1 = _mm512_set1_ps(h.one_minus_beta1),
               one_minus_beta2 = _mm512_set1_ps(h.one_minus_beta2), eps = _mm512_set1_ps(h.eps),
               weight_decay = _mm512_set1_ps(h.weight_decay), shrink = _mm512_set1_ps(h.shrink),
               minus_step_size = _mm512_set1_ps(-h.step_size);
  // A NaN moment drops out of the maxima (vmaxps returns its second operand), an inf gets in, and then the
  // block's finite maximum is taken again from the buffer, as the AVX2 block does.
  __m512 max1 = _mm512_setzero_ps(), max2 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= len; i += 16) {
    const __m512 r = _mm512_mul_ps(decode16_unsigned<kSubnormals>(c2 + i), scale2);
    const __m512 m_old = _mm512_mul_ps(decode16_signed<kSubnormals>(c1 + i), scale1);
    const __m512 v_old = _mm512_mul_ps(r, r);
    __m512 pi = _mm512_loadu_ps(p + i), gi = _mm512_loadu_ps(g + i);
    // math::adam8bit_step, operation for operation (its fmas explicit, IEEE sqrt and division).
    if constexpr (kCoupled) gi = _mm512_fmadd_ps(weight_decay, pi, gi);
    if constexpr (kDecoupled) pi = _mm512_mul_ps(pi, shrink);
    const __m512 mi = _mm512_fmadd_ps(beta1, m_old, _mm512_mul_ps(one_minus_beta1, gi));
    const __m512 vi = _mm512_fmadd_ps(beta2, v_old, _mm512_mul_ps(one_minus_beta2, _mm512_mul_ps(gi, gi)));
    const __m512 ri = _mm512_sqrt_ps(vi);
    _mm512_storeu_ps(p + i, _mm512_fmadd_ps(minus_step_size, _mm512_div_ps(mi, _mm512_add_ps(ri, eps)), pi));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(root + i, ri);
    max1 = _mm512_max_ps(_mm512_abs_ps(mi), max1);
    max2 = _mm512_max_ps(ri, max2);
  }
  float r1 = _mm512_reduce_max_ps(max1), r2 = _mm512_reduce_max_ps(max2);
  for (; i < len; ++i) {
    const float r = float8_code::decode_unsigned(c2[i]) * old.root;
    const math::Adam8bitElement<float> e =
        math::adam8bit_step(p[i], g[i], float8_code::decode_signed(c1[i]) * old.exp_avg, r * r, h);
    p[i] = e.p;
    m[i] = e.m;
    root[i] = math::sqrt_(e.v);
    r1 = std::fabs(e.m) > r1 ? std::fabs(e.m) : r1;  // as vmaxps: a NaN drops out
    r2 = root[i] > r2 ? root[i] : r2;
  }
  *absmax1 = r1 <= std::numeric_limits<float>::max() ? r1 : finite_max(m, len);
  *absmax2 = r2 <= std::numeric_limits<float>::max() ? r2 : finite_max(root, len);
  const float8_code::BlockFactors<float> now = float8_code::factors_of<float>(*absmax1, *absmax2);
  float8_encode_block(m, now.inv_exp_avg, c1, root, now.inv_root, c2, len);
}

template Float8Block float8_block<false, false, false>;
template Float8Block float8_block<false, false, true>;
template Float8Block float8_block<true, false, false>;
template Float8Block float8_block<true, false, true>;
template Float8Block float8_block<false, true, false>;
template Float8Block float8_block<false, true, true>;

}  // namespace float8_avx512
#endif

}  // namespace frugal::optim8bit

namespace frugal {

void float8_code_encode_block_cpu(const float* m, uint8_t* codes1, const float* root, uint8_t* codes2,
                                  int64_t n) {
#if FRUGAL_FLOAT8_AVX512
  optim8bit::float8_avx512::float8_encode_block(m, 1.0f, codes1, root, 1.0f, codes2, n);
#elif FRUGAL_FLOAT8_AVX2
  optim8bit::avx2::float8_encode_block(m, 1.0f, codes1, root, 1.0f, codes2, n);
#else
  for (int64_t i = 0; i < n; ++i) {
    codes1[i] = float8_code::encode_signed(m[i]);
    codes2[i] = float8_code::encode_unsigned(root[i]);
  }
#endif
}

}  // namespace frugal
