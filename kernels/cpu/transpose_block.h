// Square blocks transposed in registers, for the transposing copy (kernels/cpu/transpose.cpp), the int8
// convolution's pixel-major to NCHW pass (kernels/cpu/quant.cpp) and the attention's K and V
// (kernels/cpu/self_attention.cpp): 8 x 8 elements of 4 bytes with AVX, 16 x 16 bytes with SSE2. Element by
// element, one load and one store each, a 1-byte transpose took 0.7 ns an element on Zen 4 (W2's int8
// convolution spent a quarter of its time there); these move whole rows. transpose_tile: a rectangle of
// any element type, whole blocks in registers and the edges one by one, on the calling thread.
//
//   if constexpr (kBlock4) { __m256 r[8]; transpose8x8_load(in, in_stride, r); ...r[j] is column j... }
//   cpu::transpose_tile(k, in_stride, kt, t, 0, t, 0, hd);  // kt [hd, t] = k [t, hd]^T
#pragma once

#include <cstdint>

#if defined(__AVX__)
#include <immintrin.h>
#define FRUGAL_TRANSPOSE_AVX 1
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#define FRUGAL_TRANSPOSE_SSE2 1
#endif

namespace frugal::cpu {

#if FRUGAL_TRANSPOSE_AVX
// r[j] = column j of the 8 x 8 block of 4-byte elements at `in` (rows `stride` elements apart), i.e.
// r[j][i] = in[i * stride + j]. Only shuffles: the bits of every element (ints, NaNs) come through as they
// are.
inline void transpose8x8_load(const float* in, int64_t stride, __m256 r[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(in + i * stride);
  for (int i = 0; i < 4; ++i) {  // pairs of rows, interleaved
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 4h..4h+3: columns {0, 4}, {1, 5}, {2, 6}, {3, 7} in the two lanes
    s[4 * h + 0] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
    s[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xee);
    s[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    s[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xee);
  }
  for (int j = 0; j < 4; ++j) {  // the low lanes make columns 0..3, the high ones 4..7
    r[j] = _mm256_permute2f128_ps(s[j], s[4 + j], 0x20);
    r[4 + j] = _mm256_permute2f128_ps(s[j], s[4 + j], 0x31);
  }
}
#endif

#if FRUGAL_TRANSPOSE_SSE2
// out[j * out_stride + i] = in[i * in_stride + j], i, j < 16, for bytes: four rounds of unpacks, each
// doubling the width of what is interleaved (bytes of two rows, then words of four, dwords of eight, qwords
// of sixteen).
inline void transpose16x16_bytes(const uint8_t* in, int64_t in_stride, uint8_t* out, int64_t out_stride) {
  __m128i r[16], a[16], b[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i * in_stride));
  // a[2i]: columns 0..7 of rows 2i, 2i + 1 as words; a[2i + 1]: columns 8..15.
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
  }
  // b[4k + g]: columns 4g..4g+3 of rows 4k..4k+3 as dwords.
  for (int k = 0; k < 4; ++k)
    for (int h = 0; h < 2; ++h) {
      b[4 * k + 2 * h] = _mm_unpacklo_epi16(a[4 * k + h], a[4 * k + 2 + h]);
      b[4 * k + 2 * h + 1] = _mm_unpackhi_epi16(a[4 * k + h], a[4 * k + 2 + h]);
    }
  // a[8o + p]: columns 2p, 2p + 1 of rows 8o..8o+7 as qwords.
  for (int o = 0; o < 2; ++o)
    for (int g = 0; g < 4; ++g) {
      a[8 * o + 2 * g] = _mm_unpacklo_epi32(b[8 * o + g], b[8 * o + 4 + g]);
      a[8 * o + 2 * g + 1] = _mm_unpackhi_epi32(b[8 * o + g], b[8 * o + 4 + g]);
    }
  for (int p = 0; p < 8; ++p) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * p * out_stride),
                     _mm_unpacklo_epi64(a[p], a[8 + p]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + (2 * p + 1) * out_stride),
                     _mm_unpackhi_epi64(a[p], a[8 + p]));
  }
}
#endif

// The side of the blocks a T moves in registers, or 1 (element by element).
template <typename T>
constexpr int64_t block_side() {
#if FRUGAL_TRANSPOSE_AVX
  if (sizeof(T) == 4) return 8;
#endif
#if FRUGAL_TRANSPOSE_SSE2
  if (sizeof(T) == 1) return 16;
#endif
  return 1;
}

// out[c * out_stride + r] = in[r * in_stride + c] for one block of block_side<T>() elements a side.
template <typename T>
inline void transpose_block(const T* in, int64_t in_stride, T* out, int64_t out_stride) {
#if FRUGAL_TRANSPOSE_AVX
  if constexpr (sizeof(T) == 4) {
    __m256 r[8];
    cpu::transpose8x8_load(reinterpret_cast<const float*>(in), in_stride, r);
    for (int j = 0; j < 8; ++j) _mm256_storeu_ps(reinterpret_cast<float*>(out + j * out_stride), r[j]);
    return;
  }
#endif
#if FRUGAL_TRANSPOSE_SSE2
  if constexpr (sizeof(T) == 1) {
    cpu::transpose16x16_bytes(reinterpret_cast<const uint8_t*>(in), in_stride,
                              reinterpret_cast<uint8_t*>(out), out_stride);
    return;
  }
#endif
  (void)in, (void)in_stride, (void)out, (void)out_stride;
}

// out[c * rows + r] = in[r * in_stride + c] for rows [r0, r1) and columns [c0, c1) of in (out: [cols, rows]),
// whole blocks in registers, the edges one by one.
template <typename T>
void transpose_tile(const T* in, int64_t in_stride, T* out, int64_t rows, int64_t r0, int64_t r1, int64_t c0,
                    int64_t c1) {
  constexpr int64_t B = block_side<T>();
  const int64_t rb = B > 1 ? r0 + (r1 - r0) / B * B : r0, cb = B > 1 ? c0 + (c1 - c0) / B * B : c0;
  for (int64_t r = r0; r < rb; r += B)
    for (int64_t c = c0; c < cb; c += B)
      transpose_block(in + r * in_stride + c, in_stride, out + c * rows + r, rows);
  for (int64_t c = cb; c < c1; ++c)  // the columns right of the blocks, every row
    for (int64_t r = r0; r < r1; ++r) out[c * rows + r] = in[r * in_stride + c];
  for (int64_t c = c0; c < cb; ++c)  // the rows below the blocks
    for (int64_t r = rb; r < r1; ++r) out[c * rows + r] = in[r * in_stride + c];
}

}  // namespace frugal::cpu
