// The u8 activation codes of nn::quant (cpu::quantize_u8, core/quant_kernels.h), one value or eight at a
// time, for the kernels that make them: the input quantisation (kernels/cpu/quant.cpp) and the pool that
// writes a convolution's pooled output as the next layer's codes (kernels/cpu/pool.cpp); the output value of
// an int8 product's s32 sum; and the int8 GEMM's few rows (kernels/cpu/quant_few_rows.cpp). Internal to
// kernels/cpu.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/op_table_copy.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace frugal::cpu {

// Rounds half to even (as std::nearbyint in the default rounding mode) by adding and removing 1.5 * 2^23,
// exact for |v| < 2^22 (callers clamp first); unlike std::nearbyint, a library call, it vectorises.
inline float round_even(float v) {
  constexpr float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;
}

// One code: clamped to [lo, hi] = [-zp, qmax - zp] before rounding: the bounds are integers and rounding is
// monotonic, so this is clamp(round(x * inv) + zp, 0, qmax) with the clamp done once, in floats, and
// round_even exact. (Clamping after the rounding instead made GCC select bytewise: 2.6x slower.) The
// comparisons are maxps's and minps's, so a loop of this vectorises; a NaN takes the lower bound (code 0).
inline uint8_t quantize_one(float x, float inv, float lo, float hi, int32_t zp) {
  float v = x * inv;
  v = v > lo ? v : lo;
  v = v < hi ? v : hi;
  return uint8_t(int32_t(round_even(v)) + zp);
}

#if defined(__AVX2__)
// quantize_one of 8 values, their codes in the low 8 bytes.
struct Quantize8 {
  Quantize8(float inv, int32_t zp, int32_t qmax)
      : inv(_mm256_set1_ps(inv)),
        lo(_mm256_set1_ps(float(-zp))),
        hi(_mm256_set1_ps(float(qmax - zp))),
        zp(_mm256_set1_epi32(zp)) {}
  __m128i operator()(__m256 x) const {
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    __m256 v =
        _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(x, inv), lo), hi);  // v > lo ? v : lo; v < hi ? v : hi
    v = _mm256_sub_ps(_mm256_add_ps(v, magic), magic);
    const __m256i k = _mm256_add_epi32(_mm256_cvttps_epi32(v), zp);  // in [0, qmax]: no pack saturates
    const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(k), _mm256_extracti128_si256(k, 1));
    return _mm_packus_epi16(words, words);
  }
  __m256 inv, lo, hi;
  __m256i zp;
};
#endif

// Note [an int8 output value]: float(s) x scale (+ bias) as one fused multiply-add with the bias, written
// out: left to the compiler, whether the product and the sum fuse depends on its contraction rules (GCC's
// -ffp-contract=fast, its default in C++, fuses across statements; clang's default does not) and on the
// loop around them, so two kernels of the same formula could round apart. Every CPU path (the reference,
// oneDNN's output pass, the few rows', the convolution's output_value: kernels/cpu/quant.cpp and
// quant_few_rows.cpp) and the GPU's (kernels/cuda/quant.cu) take it so.
inline float int8_output_value(int32_t s, float scale, const float* bias, int64_t j) {
  return bias ? std::fma(float(s), scale, bias[j]) : float(s) * scale;
}

// Whether int8_linear takes the dot products of Note [int8 on a few rows] (kernels/cpu/quant_few_rows.cpp)
// for x (m, k) by w (n, k): only where the build has AVX-512 VNNI. int8_few_rows_linear is int8_linear's
// result for those shapes (x not transposed, no precomputed sums), bit for bit.
bool int8_few_rows(int64_t m, int64_t k, int64_t n);
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
void int8_few_rows_linear(const uint8_t* x, int32_t zp, const int8_t* w, const float* scale,
                          const float* bias, float* out, int64_t m, int64_t k, int64_t n, bool relu);
#endif

// One image's u8 codes [rows, cols] (dense) to out [cols, rows], by op_transpose2d's CPU kernel.
inline void transpose_codes(const uint8_t* in, uint8_t* out, int64_t rows, int64_t cols) {
  TransposeArgs t;
  t.in = in;
  t.out = out;
  t.rows = rows;
  t.cols = cols;
  t.in_stride = cols;
  op_transpose2d.get(kCPU, DType::U8)(t);
}

}  // namespace frugal::cpu
