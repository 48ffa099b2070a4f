// CPU kernel of the 2-D transposing copy (op_transpose2d, core/op_table.h): tiles of 32 x 32 elements, each
// read row by row and written column by column while both fit in L1, tile rows split across threads. Inside a
// tile, 4-byte elements go in 8 x 8 blocks and bytes in 16 x 16 blocks transposed in registers
// (kernels/cpu/transpose_block.h), the rest element by element. The reference is the element-by-element
// definition (tests/kernels/test_transpose.cpp).
#include <algorithm>

#include "core/op_table_copy.h"
#include "core/parallel.h"
#include "kernels/cpu/register.h"
#include "kernels/cpu/transpose_block.h"

namespace frugal {
namespace {

constexpr int64_t kTile = 32;

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

// One tile: rows [r0, r1) and columns [c0, c1) of in, whole blocks in registers, the edges one by one.
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

// in: [rows, cols] with rows in_stride apart; out: [cols, rows]
template <typename T>
void transpose2d_cpu(const TransposeArgs& a) {
  const T* in = static_cast<const T*>(a.in);
  T* out = static_cast<T*>(a.out);
  const int64_t rows = a.rows, cols = a.cols;
  const int64_t tiles = (rows + kTile - 1) / kTile;
  parallel_for(0, tiles, items_per_grain(kTile * cols), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t r0 = t * kTile, r1 = std::min(rows, r0 + kTile);
      for (int64_t c0 = 0; c0 < cols; c0 += kTile)
        transpose_tile(in, a.in_stride, out, rows, r0, r1, c0, std::min(cols, c0 + kTile));
    }
  });
}

const bool kRegistered = [] {
  cpu::for_types<float, double, Half, BFloat16, int64_t, int32_t, uint8_t, bool>([](auto t) {
    using T = decltype(t);
    op_transpose2d.set(DeviceType::CPU, dtype_v<T>, transpose2d_cpu<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
