// What the CPU kernels of op_adam8bit_step share: kernels/cpu/optim8bit.cpp (the dynamic code, and the
// loop over the blocks that runs every kernel), optim8bit_dynamic_avx512.cpp (the dynamic code's AVX-512
// block), optim8bit_float8.cpp (the float8 codes' blocks) and optim8bit_reference.cpp (the naive reference
// they are tested against). Private to those files.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/dtype.h"
#include "core/op_table_optim.h"
#include "kernels/dynamic_code.h"

// The f32 kernel's vector paths, one of each code per build, where the build targets AVX2 at least. The
// dynamic code: AVX-512 with VBMI, else AVX2. The float8 codes: AVX-512 (F, BW), else AVX2.
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define FRUGAL_FLOAT8_AVX512 1
#else
#define FRUGAL_FLOAT8_AVX2 1
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VBMI__)
#define FRUGAL_ADAM8BIT_AVX512 1
#else
#define FRUGAL_ADAM8BIT_AVX2 1
#endif
#endif

namespace frugal::optim8bit {

// What a block's moments are multiplied by before rounding to the code: 1 / its scale, or 0 for a zero
// scale (every moment 0 or non-finite: each gets 0's code, x 0 being 0 or NaN). A multiply rather than a
// division per element; a product may then exceed 1 by a rounding, which rounds to the code's end.
template <typename C>
C inverse_scale(float absmax) {
  return absmax > 0 ? C(1) / C(absmax) : C(0);
}

// Note [quantising with buckets]: a float's bits, shifted right, are monotone in its value, so the bits
// above the lowest 23 - kMantissaBits (the exponent and kMantissaBits of mantissa) name a bucket of values.
// With 7 mantissa bits no bucket holds more than one threshold of either code (the table build checks it),
// so a value's code step is its bucket's first step plus one if it exceeds the one threshold that can lie in
// the bucket. Inside a bucket every value shares the bits above the lowest 16, so that comparison is one of
// the lowest 16 bits: a bucket's entry packs its first step (<< 16) and the threshold's lowest 16 bits, or
// 0xffff when no threshold lies inside (no value of the bucket exceeds it): one load, no search, and one
// gather for 8 values (Note [Adam8bit with AVX2], optim8bit.cpp). Everything below 2^kMinExponent is bucket 0
// (it lies below the first threshold of both codes, 1.6e-7), everything from 2 up (and inf, NaN) the last;
// neither holds a threshold, so their entries' 0xffff also holds for the values clamped into them. Exact: the
// same thresholds as dynamic_code::quantize, hence the same codes. The table takes 2 x 12 KB per code.
constexpr int kMantissaBits = 7;
constexpr int kLowBits =
    23 - kMantissaBits;  // the bits below a bucket's, 16: a threshold's part in its entry
constexpr int32_t kLowMask = (1 << kLowBits) - 1;
constexpr int kMinExponent = -23, kMaxExponent = 1;  // buckets cover [2^-23, 2^1)
constexpr int kBuckets = (kMaxExponent - kMinExponent) << kMantissaBits;
constexpr int32_t kFirstBucketBits = (127 + kMinExponent) << kMantissaBits;

struct FastCode {
  const dynamic_code::Code* code = nullptr;
  int32_t entry[2 * kBuckets];  // first step << 16 | threshold's low bits; side 0's buckets, then side 1's
};

inline int32_t bucket_of(uint32_t bits) {
  const int32_t b = int32_t(bits >> kLowBits) - kFirstBucketBits;
  return std::min(std::max(b, int32_t(0)), int32_t(kBuckets - 1));
}

// The two codes' bucket tables, made on first use (optim8bit.cpp).
const FastCode& fast_signed();
const FastCode& fast_unsigned();

// dynamic_code::quantize(*f.code, q), through the buckets (Note [quantising with buckets]). kSigned false:
// q >= 0 or NaN, as the second moment is (a negative q gets 0's code, the nearest entry).
template <bool kSigned>
inline uint8_t quantize_fast(const FastCode& f, float q) {
  const int32_t side = kSigned ? int32_t(q < 0) : 0;
  const float a = std::fabs(q);
  const uint32_t bits = std::bit_cast<uint32_t>(a);
  const int32_t e = f.entry[side * kBuckets + bucket_of(bits)];
  int32_t k = (e >> kLowBits) + int32_t((int32_t(bits) & kLowMask) > (e & kLowMask));
  // NaN (and, unsigned, a negative q) to 0's code; written without && so that the loop stays branch-free.
  const int32_t to_zero = int32_t(!(a == a)) | (kSigned ? 0 : int32_t(q < 0));
  k &= to_zero - 1;
  return uint8_t(f.code->zero + (1 - 2 * side) * k);
}

// The update of len elements: p, g (T); m, v (C) in: the dequantised moments, out: the new ones.
template <typename T, typename C>
void update_block(T* p, const T* g, C* m, C* v, const math::Adam8bitHyper<C> h, int64_t len) {
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) {
    const math::Adam8bitElement<C> e = math::adam8bit_step(C(p[i]), C(g[i]), m[i], v[i], h);
    p[i] = T(e.p);
    m[i] = e.m;
    v[i] = e.v;
  }
}

// The largest finite |x[i]|, i < len (0 if none).
template <typename C>
C finite_max(const C* x, int64_t len) {
  C r = 0;
#pragma omp simd reduction(max : r)
  for (int64_t i = 0; i < len; ++i) r = std::max(r, math::finite_abs(x[i]));
  return r;
}

// adam8bit_block_portable with the float8 codes (Note [the float8 codes], kernels/float8_code.h): the same
// four passes, the codes decoded and encoded by float8_code's scalar functions; v holds exp_avg_sq, then
// its roots, and *absmax2 is the largest finite root.
// Defined in optim8bit_float8.cpp for the four dtypes' (T, acc_t<T>).
template <typename T, typename C>
void float8_block_portable(T* p, const T* g, uint8_t* c1, float* absmax1, uint8_t* c2, float* absmax2,
                           const math::Adam8bitHyper<C>& h, C* m, C* v, int64_t len);

#if FRUGAL_FLOAT8_AVX2 || FRUGAL_ADAM8BIT_AVX2  // what the AVX2 blocks share
namespace avx2 {

// |x| when finite, else 0 (math::finite_abs; +0 for -0, which the largest |moment| cannot tell apart).
inline __m256 finite_abs(__m256 x) {
  const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  return _mm256_and_ps(a, _mm256_cmp_ps(a, _mm256_set1_ps(std::numeric_limits<float>::max()), _CMP_LE_OQ));
}

// The largest lane of x; its lanes are >= 0 and not NaN, so the order of the comparisons does not matter.
inline float max_of(__m256 x) {
  __m128 r = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  r = _mm_max_ps(r, _mm_movehl_ps(r, r));
  return _mm_cvtss_f32(_mm_max_ss(r, _mm_movehdup_ps(r)));
}

// The low bytes of four vectors of int32 codes (each in [0, 255]) to out[0 .. 32).
inline void pack32(const __m256i k[4], uint8_t* out) {
  // packus interleaves the 128-bit halves: the 32-bit groups of 4 codes come out as 0, 2, 4, 6, 1, 3, 5, 7.
  const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(k[0], k[1]), _mm256_packus_epi32(k[2], k[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// math::adam8bit_step on 8 lanes, operation for operation (Note [Adam8bit with AVX2], optim8bit.cpp): the
// hyperparameters broadcast, and one step giving the new parameter, moments, and root of exp_avg_sq (the
// denominator's).
struct Hyper8 {
  explicit Hyper8(const math::Adam8bitHyper<float>& h)
      : beta1(_mm256_set1_ps(h.beta1)),
        beta2(_mm256_set1_ps(h.beta2)),
        one_minus_beta1(_mm256_set1_ps(h.one_minus_beta1)),
        one_minus_beta2(_mm256_set1_ps(h.one_minus_beta2)),
        eps(_mm256_set1_ps(h.eps)),
        weight_decay(_mm256_set1_ps(h.weight_decay)),
        shrink(_mm256_set1_ps(h.shrink)),
        minus_step_size(_mm256_set1_ps(-h.step_size)) {}
  __m256 beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, shrink, minus_step_size;
};
struct Step8 {
  __m256 p, m, v, root;
};
template <bool kCoupled, bool kDecoupled>
inline Step8 step8(const Hyper8& h, __m256 p, __m256 g, __m256 m_old, __m256 v_old) {
  if constexpr (kCoupled) g = _mm256_fmadd_ps(h.weight_decay, p, g);
  if constexpr (kDecoupled) p = _mm256_mul_ps(p, h.shrink);
  const __m256 m = _mm256_fmadd_ps(h.beta1, m_old, _mm256_mul_ps(h.one_minus_beta1, g));
  const __m256 v = _mm256_fmadd_ps(h.beta2, v_old, _mm256_mul_ps(h.one_minus_beta2, _mm256_mul_ps(g, g)));
  const __m256 root = _mm256_sqrt_ps(v);
  const __m256 denom = _mm256_add_ps(root, h.eps);
  return {_mm256_fmadd_ps(h.minus_step_size, _mm256_div_ps(m, denom), p), m, v, root};
}

#if FRUGAL_FLOAT8_AVX2
// float8_block_portable for f32, in two passes (Note [float8 moments with AVX2]); root: scratch as m.
// Defined in optim8bit_float8.cpp for the flags optim8bit.cpp's loop passes.
template <bool kCoupled, bool kDecoupled, bool kSubnormals>
void float8_block(float* p, const float* g, uint8_t* c1, float* absmax1, uint8_t* c2, float* absmax2,
                  const math::Adam8bitHyper<float>& h, float* m, float* root, int64_t len);
#endif

}  // namespace avx2
#endif

#if FRUGAL_ADAM8BIT_AVX512
namespace avx512 {
// The dynamic code's f32 blocks [block_begin, block_end) of one parameter with AVX-512 and VBMI (Note
// [Adam8bit with AVX-512], optim8bit_dynamic_avx512.cpp); m, v: 2 x kAdam8bitMaxBlock each.
template <bool kCoupled, bool kDecoupled>
void adam8bit_blocks(const Adam8bitStepArgs& args, const math::Adam8bitHyper<float>& h, int64_t block_begin,
                     int64_t block_end, float* m_buffers, float* v_buffers);
// codes[i] = the code of x[i] x inv_scale, i < len: 64 at a time, the rest one by one.
template <bool kSigned>
void quantize_block(const FastCode& f, const float* x, float inv_scale, uint8_t* codes, int64_t len);
}  // namespace avx512
#endif

#if FRUGAL_FLOAT8_AVX512
namespace float8_avx512 {
// The float8 block in vectors of 16 (Note [float8 moments with AVX-512], optim8bit_float8.cpp), the AVX2
// one's algorithm and results bit for bit; and its encoder (float8_code_encode_block_cpu's).
template <bool kCoupled, bool kDecoupled, bool kSubnormals>
void float8_block(float* p, const float* g, uint8_t* c1, float* absmax1, uint8_t* c2, float* absmax2,
                  const math::Adam8bitHyper<float>& h, float* m, float* root, int64_t len);
void float8_encode_block(const float* m, float inv1, uint8_t* codes1, const float* root, float inv2,
                         uint8_t* codes2, int64_t len);
}  // namespace float8_avx512
#endif

}  // namespace frugal::optim8bit
