// The cache-blocked 2-D transposing copy (op_transpose2d) against its definition, out[c, r] = in[r, c], for
// shapes around the tile size, a row stride wider than the rows, every dtype, and enough rows for several
// threads; and copy_/contiguous of transposed views, which take that kernel.
#include "core/op_table_copy.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

// out[c, r] = in[r, c] element by element, from a row-major [rows, cols] listing.
std::vector<double> transposed(const std::vector<double>& in, int64_t rows, int64_t cols) {
  std::vector<double> out(in.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
  return out;
}

TEST(Transpose2d, MatchesDefinition) {
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::I64, DType::I32, DType::U8})
    for (auto [rows, cols, pad] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {1, 1, 0}, {3, 5, 0}, {32, 32, 0}, {33, 65, 3}, {512, 128, 0}, {1000, 37, 11}}) {
      const Tensor base = testing::uniform({rows, cols + pad}, 0, 100, DType::F64, 5).to(t);
      const Tensor in = base.narrow(1, 0, cols);
      Tensor out = empty({cols, rows}, t);
      TransposeArgs a;
      a.in = in.raw_data();
      a.out = out.raw_data();
      a.rows = rows;
      a.cols = cols;
      a.in_stride = cols + pad;
      op_transpose2d.get(kCPU, t)(a);
      EXPECT_EQ(out.to_vector<double>(), transposed(in.to_vector<double>(), rows, cols))
          << dtype_name(t) << " " << rows << " x " << cols << " stride " << cols + pad;
    }
}

// contiguous() of a transposed (and narrowed) matrix, and copy_ of one into a contiguous tensor of the same
// or another dtype (the generic converting copy) or into a strided destination.
TEST(Transpose2d, CopiesOfTransposedViews) {
  for (DType t : {DType::F32, DType::BF16, DType::I64})
    for (auto [rows, cols, pad] :
         std::vector<std::tuple<int64_t, int64_t, int64_t>>{{2, 3, 0}, {40, 33, 5}, {300, 70, 1}}) {
      const Tensor base = testing::uniform({rows, cols + pad}, 0, 100, DType::F64, 7).to(t);
      const Tensor in = base.narrow(1, 0, cols);
      const std::vector<double> expected = transposed(in.to_vector<double>(), rows, cols);
      EXPECT_EQ(in.t().contiguous().to_vector<double>(), expected) << dtype_name(t) << " " << rows;
      Tensor same = empty({cols, rows}, t), wider = empty({cols, rows}, DType::F64);
      ops::copy_(same, in.t());
      ops::copy_(wider, in.t());
      EXPECT_EQ(same.to_vector<double>(), expected);
      EXPECT_EQ(wider.to_vector<double>(), expected);
      Tensor strided_base = zeros({cols, rows + 2}, t);
      Tensor strided = strided_base.narrow(1, 1, rows);
      ops::copy_(strided, in.t());
      EXPECT_EQ(strided.to_vector<double>(), expected);
      EXPECT_EQ(strided_base.narrow(1, 0, 1).to_vector<double>(), std::vector<double>(cols, 0.0));
    }
}

}  // namespace
}  // namespace frugal
