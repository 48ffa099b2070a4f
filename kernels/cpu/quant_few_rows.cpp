// QuantizedLinear's int8 GEMM on a few rows as VNNI dot products (Note [int8 on a few rows] below), taken by
// cpu::int8_linear (kernels/cpu/quant.cpp) for those shapes.
#include <algorithm>
#include <cstdint>

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

#include "core/parallel.h"
#include "kernels/cpu/quantize.h"

namespace frugal::cpu {

// Note [int8 on a few rows]
// QuantizedLinear on up to kInt8FewRows rows (a request or a few), with AVX-512 VNNI: as the f32 layer's
// (Note [a layer's forward on a few rows] in kernels/cpu/linear.cpp), oneDNN's int8 matmul spent most of its
// time around the arithmetic there. So the sums are dot products too: for a block of kInt8Cols rows of w and
// a pair of x's rows, one VPDPBUSD a 64-byte vector of each row of x and each row of w (u8 x s8, four
// products summed into each s32 lane), and one more with a vector of ones that sums the row of w itself for
// the zero point's term (with the first pair); the last, partial vector of k masked. Every sum is exact in
// s32 and each output value is linear()'s (Note [an int8 output value]), so the result is the oneDNN path's
// bit for bit. 2 threads of a Zen 4, medians of 2001, against oneDNN's kernel (x given transposed, which
// keeps to it): 784 -> 256 at 1, 2 and 4 rows 2.7, 5.2 and 9.9 us against 6.3, 9.6 and 11.9; 1024 -> 1024
// 10.4, 21 and 36 against 16, 36 and 42; at 6 rows and more oneDNN is as fast or faster (the row sums of w
// cost a second product at one row, but a pair of rows only halves the loads of w). No working memory: the
// meta twin takes none for these shapes.
namespace {
constexpr int64_t kInt8FewRows = 4, kInt8Cols = 4;
}  // namespace

bool int8_few_rows([[maybe_unused]] int64_t m, [[maybe_unused]] int64_t k, [[maybe_unused]] int64_t n) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  return m >= 1 && m <= kInt8FewRows && k >= 1 && n >= 1;
#else
  return false;
#endif
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
namespace {

inline int32_t sum_lanes_s32(__m512i v) {
  const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  const __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  const __m128i d = _mm_add_epi32(q, _mm_unpackhi_epi64(q, q));
  return _mm_cvtsi128_si32(_mm_add_epi32(d, _mm_shuffle_epi32(d, 1)));
}

// Rows [i0, i0 + R) of out at columns [j0, j0 + kInt8Cols) (a column past n repeats the last, computed and
// not stored); wsum: the block's row sums of w, computed when `sum_w` (the first pair of rows).
template <int R>
void int8_few_rows_block(const uint8_t* x, int32_t zp, const int8_t* w, const float* scale, const float* bias,
                         float* out, int64_t i0, int64_t j0, int64_t k, int64_t n, bool relu, bool sum_w,
                         int32_t* wsum) {
  const int8_t* wc[kInt8Cols];
  for (int64_t c = 0; c < kInt8Cols; ++c) wc[c] = w + std::min(j0 + c, n - 1) * k;
  const uint8_t* xr = x + i0 * k;
  __m512i acc[R][kInt8Cols], ws[kInt8Cols];
  for (int64_t c = 0; c < kInt8Cols; ++c) {
    ws[c] = _mm512_setzero_si512();
    for (int r = 0; r < R; ++r) acc[r][c] = _mm512_setzero_si512();
  }
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t p = 0; p < k; p += 64) {
    const __mmask64 lanes = k - p >= 64 ? ~__mmask64(0) : (__mmask64(1) << (k - p)) - 1;
    __m512i xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm512_maskz_loadu_epi8(lanes, xr + r * k + p);
    for (int64_t c = 0; c < kInt8Cols; ++c) {
      const __m512i wv = _mm512_maskz_loadu_epi8(lanes, wc[c] + p);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], xv[r], wv);
      if (sum_w) ws[c] = _mm512_dpbusd_epi32(ws[c], ones, wv);
    }
  }
  if (sum_w)
    for (int64_t c = 0; c < kInt8Cols; ++c) wsum[c] = sum_lanes_s32(ws[c]) * zp;
  for (int r = 0; r < R; ++r)
    for (int64_t c = 0; c < kInt8Cols && j0 + c < n; ++c) {
      const int64_t j = j0 + c;
      const float v = int8_output_value(sum_lanes_s32(acc[r][c]) - wsum[c], scale[j], bias, j);
      out[(i0 + r) * n + j] = relu && v < 0.0f ? 0.0f : v;
    }
}

}  // namespace

void int8_few_rows_linear(const uint8_t* x, int32_t zp, const int8_t* w, const float* scale,
                          const float* bias, float* out, int64_t m, int64_t k, int64_t n, bool relu) {
  const int64_t blocks = (n + kInt8Cols - 1) / kInt8Cols;
  const int64_t grain = std::max<int64_t>(1, detail::small_product_grain() / (m * k * kInt8Cols));
  parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int32_t wsum[kInt8Cols];
      for (int64_t i0 = 0; i0 < m; i0 += 2) {  // the block of w, in L1 after the first pair of rows
        if (m - i0 == 1)
          int8_few_rows_block<1>(x, zp, w, scale, bias, out, i0, b * kInt8Cols, k, n, relu, i0 == 0, wsum);
        else
          int8_few_rows_block<2>(x, zp, w, scale, bias, out, i0, b * kInt8Cols, k, n, relu, i0 == 0, wsum);
      }
    }
  });
}
#endif

}  // namespace frugal::cpu
