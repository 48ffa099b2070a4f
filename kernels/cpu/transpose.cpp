// CPU kernel of the 2-D transposing copy (op_transpose2d, core/op_table.h): tiles of 32 x 32 elements, each
// read row by row and written column by column while both fit in L1, tile rows split across threads. The
// reference is the element-by-element definition (tests/kernels/test_index.cpp).
#include <algorithm>

#include "core/op_table_copy.h"
#include "core/parallel.h"
#include "kernels/cpu/register.h"

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
  parallel_for(0, tiles, std::max<int64_t>(1, kGrain / std::max<int64_t>(kTile * cols, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t t = b; t < e; ++t) {
                   const int64_t r0 = t * kTile, r1 = std::min(rows, r0 + kTile);
                   for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
                     const int64_t c1 = std::min(cols, c0 + kTile);
                     for (int64_t c = c0; c < c1; ++c)
                       for (int64_t r = r0; r < r1; ++r) out[c * rows + r] = in[r * a.in_stride + c];
                   }
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
