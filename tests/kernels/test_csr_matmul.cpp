// The CSR product of nn::SparseLinear (op_csr_matmul, Note [a sparse layer's product] in
// kernels/cpu/sparse.cpp) against a naive f64 loop: one row (its own path), batches across the 8-row vectors
// and 32-row tiles, rows and columns across the 8 x 8 transposes' edges, empty rows, one nonzero, a bias or
// none, f32 and f64, on one thread and on two (W's rows split when there are fewer tiles than threads); its
// working memory goes back to the arena, and the dry run takes the same bytes.
#include <random>

#include "core/estimate.h"
#include "core/op_table_sparse.h"
#include "core/parallel.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_close;
using testing::uniform;

struct Csr {
  std::vector<double> values;
  std::vector<int32_t> cols, offsets{0};
};

// A random CSR of density `density`, with row 1 empty and row 2 holding one nonzero where there are rows.
Csr random_csr(int64_t rows, int64_t cols, double density, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> value(-1, 1), pick(0, 1);
  Csr m;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const bool keep = r == 1 ? false : r == 2 ? c == cols / 2 : pick(gen) < density;
      if (keep) {
        m.values.push_back(value(gen));
        m.cols.push_back(int32_t(c));
      }
    }
    m.offsets.push_back(int32_t(m.values.size()));
  }
  return m;
}

struct Case {
  int64_t batch, rows, cols;
  double density;
  bool bias;
};

void check(const Case& c, DType dtype, uint32_t seed) {
  const Csr m = random_csr(c.rows, c.cols, c.density, seed);
  const auto nnz = int64_t(m.values.size());
  const Tensor values = tensor<double>(m.values, {nnz}).to(dtype);
  const Tensor x = uniform({c.batch, c.cols}, -1, 1, dtype, seed + 1);
  const Tensor bias = uniform({c.rows}, -1, 1, dtype, seed + 2);
  Tensor out = full({c.batch, c.rows}, std::nan(""), dtype);
  CsrMatmulArgs a;
  a.values = values.raw_data();
  a.col_indices = m.cols.data();
  a.row_offsets = m.offsets.data();
  a.x = x.raw_data();
  a.bias = c.bias ? bias.raw_data() : nullptr;
  a.out = out.raw_data();
  a.rows = c.rows, a.cols = c.cols, a.nnz = nnz, a.batch = c.batch;
  const int64_t before = memory::stats(kCPU).allocated.current;
  op_csr_matmul.get(kCPU, dtype)(a);
  EXPECT_EQ(memory::stats(kCPU).allocated.current, before) << "the working memory went back";

  const std::vector<double> x64 = x.to_vector<double>(), b64 = bias.to_vector<double>(),
                            v64 = values.to_vector<double>();
  std::vector<double> expected(size_t(c.batch * c.rows));
  for (int64_t j = 0; j < c.batch; ++j)
    for (int64_t r = 0; r < c.rows; ++r) {
      double s = c.bias ? b64[size_t(r)] : 0.0;
      for (int32_t k = m.offsets[size_t(r)]; k < m.offsets[size_t(r) + 1]; ++k)
        s += v64[size_t(k)] * x64[size_t(j * c.cols + m.cols[size_t(k)])];
      expected[size_t(j * c.rows + r)] = s;
    }
  const double eps = dtype == DType::F32 ? 1e-6 : 1e-14;
  expect_close(out, expected, {eps * double(c.cols), eps * 10},
               "batch " + std::to_string(c.batch) + " rows " + std::to_string(c.rows) + " cols " +
                   std::to_string(c.cols) + " " + dtype_name(dtype));
}

const Case kCases[] = {
    {1, 5, 7, 0.5, true},
    {3, 9, 8, 0.4, false},
    {8, 8, 9, 0.3, true},
    {13, 17, 33, 0.2, true},
    {31, 24, 16, 0.6, false},
    {32, 16, 40, 0.1, true},
    {33, 40, 19, 0.3, true},
    {70, 3, 100, 0.5, false},
    {100, 64, 64, 0.1, true},
    {256, 130, 200, 0.05, true},
    {40, 1, 1, 1.0, true},
    // One row (Note [a sparse layer on one row]): rows of nonzeros past a vector and not a whole one, and
    // enough rows to split over two threads.
    {1, 40, 100, 0.5, true},
    {1, 600, 300, 0.2, false},
    {1, 3, 17, 1.0, true},
};

TEST(CsrMatmul, EqualsTheNaiveProductAtEveryShape) {
  const int threads = num_threads();
  for (int t : {1, 2}) {
    set_num_threads(t);
    uint32_t seed = 10;
    for (const Case& c : kCases)
      for (DType dtype : {DType::F32, DType::F64}) check(c, dtype, seed += 3);
  }
  set_num_threads(threads);
}

// Large enough to run on several threads, with fewer 32-row tiles (2) than... rows split into parts.
TEST(CsrMatmul, SplitsRowsWhenTheBatchIsSmall) {
  const int threads = num_threads();
  for (int t : {2, 3, 5}) {
    set_num_threads(t);
    check({40, 300, 900, 0.3, true}, DType::F32, 77);
    check({5, 301, 900, 0.5, false}, DType::F32, 78);
  }
  set_num_threads(threads);
}

TEST(CsrMatmul, TheDryRunTakesTheKernelsWorkingMemory) {
  const int64_t batch = 100, rows = 64, cols = 300;
  const Csr m = random_csr(rows, cols, 0.2, 5);
  const auto nnz = int64_t(m.values.size());
  CsrMatmulArgs a;
  a.col_indices = m.cols.data();
  a.row_offsets = m.offsets.data();
  a.rows = rows, a.cols = cols, a.nnz = nnz, a.batch = batch;
  const Tensor values = tensor<double>(m.values, {nnz}).to(DType::F32);
  const Tensor x = uniform({batch, cols}, -1, 1, DType::F32, 6);
  Tensor out = empty({batch, rows});
  a.values = values.raw_data();
  a.x = x.raw_data();
  a.out = out.raw_data();
  memory::reset_peak(kCPU);
  const int64_t before = memory::stats(kCPU).allocated.current;
  op_csr_matmul.get(kCPU, DType::F32)(a);
  const int64_t working = memory::stats(kCPU).allocated.peak - before;
  EXPECT_GT(working, 0) << "the tiles come from the arena";
  int64_t base = 0;
  const memory::Estimate e = memory::estimate([&](Device d) {
    base = memory::stats(d).allocated.current;
    memory::reset_peak(d);
    op_csr_matmul.get(d, DType::F32)(a);
  });
  EXPECT_EQ(e.peak_allocated - base, working);
}

}  // namespace
}  // namespace frugal
