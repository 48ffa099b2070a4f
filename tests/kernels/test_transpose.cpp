// The cache-blocked 2-D transposing copy (op_transpose2d) against its definition, out[c, r] = in[r, c], for
// shapes around the tile size, a row stride wider than the rows, every dtype, and enough rows for several
// threads.
#include "core/op_table.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

TEST(Transpose2d, MatchesDefinition) {
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::I64, DType::U8})
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
      EXPECT_EQ(out.to_vector<double>(), in.t().contiguous().to_vector<double>())
          << dtype_name(t) << " " << rows << " x " << cols << " stride " << cols + pad;
    }
}

}  // namespace
}  // namespace frugal
