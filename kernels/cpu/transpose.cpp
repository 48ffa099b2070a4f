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
        cpu::transpose_tile(in, a.in_stride, out, rows, r0, r1, c0, std::min(cols, c0 + kTile));
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
