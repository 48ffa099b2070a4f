// The 16-bit GEMMs (bf16 through oneDNN's matmul, f16 and the bf16 fallback through widened f32 tiles)
// against the naive f64 GEMM: odd sizes across tile edges, transposed operands, batches through ops::matmul,
// alpha and beta, a layout oneDNN declines, non-finite values, and matmul's gradients in bf16; a few rows in
// registers (both layouts of B) and the workspace they do not take.
#include <cmath>

#include "core/estimate.h"
#include "core/op_table_linalg.h"
#include "kernels/cpu/reference.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_close;
using testing::Tol;
using testing::uniform;

// Accumulated in f32 and rounded once: within half an ulp of the 16-bit type (its unit roundoff) of the exact
// result, plus the f32 summation error. A kernel that rounded partial sums to 16 bits would miss this by far.
Tol once_rounded(DType t, int64_t k) {
  const double unit_roundoff = t == DType::BF16 ? 0x1p-8 : 0x1p-11;
  return {1e-6 * double(std::max<int64_t>(k, 1)), unit_roundoff};
}

// reference::gemm in f64 on f64 copies of the operands, laid out as in `g`.
std::vector<double> reference_result(const GemmArgs& g, const Tensor& a, const Tensor& b, const Tensor& c) {
  const Tensor a64 = a.to(DType::F64), b64 = b.to(DType::F64), c64 = c.to(DType::F64);
  GemmArgs r = g;
  r.a = a64.raw_data();
  r.b = b64.raw_data();
  r.c = c64.raw_data();
  reference::gemm<double>(r);
  return c64.to_vector<double>();
}

// The f64 reference of ops::matmul for operands that broadcast their batch dims: each batch entry through
// reference::gemm on contiguous f64 copies.
std::vector<double> reference_matmul(const Tensor& a, const Tensor& b) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  Shape batch = broadcast_shapes(Shape(std::vector<int64_t>(a.shape().begin(), a.shape().end() - 2)),
                                 Shape(std::vector<int64_t>(b.shape().begin(), b.shape().end() - 2)), "ref");
  Shape a_full = batch, b_full = batch, c_full = batch;
  a_full.push_back(m);
  a_full.push_back(k);
  b_full.push_back(k);
  b_full.push_back(n);
  c_full.push_back(m);
  c_full.push_back(n);
  const Tensor a64 = a.to(DType::F64).expand(a_full).contiguous();
  const Tensor b64 = b.to(DType::F64).expand(b_full).contiguous();
  Tensor c64 = zeros(c_full, DType::F64);
  GemmArgs g;
  g.batch = batch.numel();
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = a64.raw_data();
  g.b = b64.raw_data();
  g.c = c64.raw_data();
  g.a_batch = m * k;
  g.a_row = k;
  g.b_batch = k * n;
  g.b_row = n;
  g.c_batch = m * n;
  g.c_row = n;
  reference::gemm<double>(g);
  return c64.to_vector<double>();
}

// C [m, n] = A [m, k] B for B given by its columns, b [n, k] (a layer's weight read as its transpose), all
// contiguous.
GemmArgs layer_gemm(const Tensor& a, const Tensor& b, Tensor& c) {
  GemmArgs g;
  g.m = a.size(0);
  g.n = b.size(0);
  g.k = a.size(1);
  g.a = a.raw_data();
  g.a_row = g.k;
  g.b = b.raw_data();
  g.b_row = 1;
  g.b_col = g.k;
  g.c = c.raw_data();
  g.c_row = g.n;
  return g;
}

std::string describe(DType t, int64_t m, int64_t n, int64_t k, bool ta, bool tb) {
  return std::string(dtype_name(t)) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
         " k=" + std::to_string(k) + (ta ? " A^T" : "") + (tb ? " B^T" : "");
}

TEST(Matmul16, OddSizesAndTransposesAgainstReference) {
  // Sizes past the widened path's 256 x 256 x 512 tiles, vectors, and sizes of 1.
  const std::tuple<int64_t, int64_t, int64_t> sizes[] = {
      {1, 1, 1}, {1, 7, 3}, {5, 1, 9}, {3, 4, 1}, {17, 33, 65}, {64, 64, 64}, {31, 300, 7}, {300, 270, 600}};
  for (DType t : {DType::BF16, DType::F16})
    for (auto [m, n, k] : sizes)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const uint64_t seed = uint64_t(m * 7 + n * 11 + k * 13 + ta * 2 + tb);
          const Tensor a = ta ? uniform({k, m}, -1, 1, t, seed).t() : uniform({m, k}, -1, 1, t, seed);
          const Tensor b = tb ? uniform({n, k}, -1, 1, t, seed + 1).t() : uniform({k, n}, -1, 1, t, seed + 1);
          const Tensor y = matmul(a, b);
          ASSERT_EQ(y.dtype(), t);
          expect_close(y, reference_matmul(a, b), once_rounded(t, k), describe(t, m, n, k, ta, tb));
        }
}

TEST(Matmul16, BatchedThroughOpsMatmul) {
  for (DType t : {DType::BF16, DType::F16}) {
    const std::string name = dtype_name(t);
    const Tensor a = uniform({3, 17, 40}, -1, 1, t, 41), w = uniform({40, 9}, -1, 1, t, 42);
    expect_close(matmul(a, w), reference_matmul(a, w), once_rounded(t, 40), name + " batch @ matrix");
    // One left matrix for every batch entry: the batch stride is 0 (oneDNN's batch broadcast).
    const Tensor l = uniform({5, 8}, -1, 1, t, 43), r = uniform({4, 8, 6}, -1, 1, t, 44);
    expect_close(matmul(l, r), reference_matmul(l.unsqueeze(0), r), once_rounded(t, 8),
                 name + " matrix @ batch");
    const Tensor p = uniform({2, 1, 5, 8}, -1, 1, t, 45), q = uniform({3, 8, 6}, -1, 1, t, 46);
    expect_close(matmul(p, q), reference_matmul(p, q), once_rounded(t, 8), name + " broadcast both ways");
    // Transposed batch entries, and attention's heads: [T, H, D] seen as [H, T, D] (batch stride D).
    const Tensor at = uniform({4, 30, 20}, -1, 1, t, 47).transpose(1, 2);
    const Tensor bt = uniform({4, 25, 30}, -1, 1, t, 48).transpose(1, 2);
    expect_close(matmul(at, bt), reference_matmul(at, bt), once_rounded(t, 30), name + " transposed batch");
    const Tensor q_heads = uniform({12, 3, 16}, -1, 1, t, 49).permute({1, 0, 2});  // [3, 12, 16]
    const Tensor k_heads = uniform({12, 3, 16}, -1, 1, t, 50).permute({1, 2, 0});  // [3, 16, 12]
    expect_close(matmul(q_heads, k_heads), reference_matmul(q_heads, k_heads), once_rounded(t, 16),
                 name + " interleaved heads");
  }
}

// The kernels themselves on C = alpha A B + beta C: the registered ones and the widened paths.
TEST(Matmul16, AlphaBetaOnEveryKernel) {
  struct Kernel {
    DType t;
    GemmKernel* fn;
    const char* name;
  };
  const Kernel kernels[] = {{DType::BF16, op_gemm.get(kCPU, DType::BF16), "bf16 registered"},
                            {DType::BF16, gemm_bf16_widened_cpu, "bf16 widened"},
                            {DType::F16, op_gemm.get(kCPU, DType::F16), "f16 registered"},
                            {DType::F16, gemm_f16_widened_cpu, "f16 widened"}};
  for (const Kernel& kn : kernels)
    for (auto [alpha, beta] : {std::pair<float, float>{1, 0}, {0.5f, 0}, {1, 1}, {-2, 0.25f}})
      for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{7, 5, 3}, {260, 70, 530}}) {
        const Tensor a = uniform({m, k}, -1, 1, kn.t, 51), b = uniform({n, k}, -1, 1, kn.t, 52);  // b as B^T
        Tensor c = uniform({m, n}, -1, 1, kn.t, 53);
        GemmArgs g = layer_gemm(a, b, c);
        g.alpha = alpha;
        g.beta = beta;
        const auto expected = reference_result(g, a, b, c);
        kn.fn(g);
        expect_close(c, expected, once_rounded(kn.t, k),
                     std::string(kn.name) + " alpha=" + std::to_string(alpha) +
                         " beta=" + std::to_string(beta) + " m=" + std::to_string(m));
      }
}

// A few rows of A by B in both layouts of Note [few rows of 16-bit floats], on every widened kernel: B's
// columns contiguous (a layer's weight read as its transpose: dot products) and B's rows contiguous (B [k, n]
// as it lies: rows of C as sums of B's rows). Row and column counts across the register blocks' and panels'
// edges, k across a vector's lanes (and the copied tail), padded rows and columns (strides beyond k or n),
// alpha and beta, and batches whose entries start apart.
TEST(Matmul16, FewRowsInBothLayouts) {
  struct Kernel {
    DType t;
    GemmKernel* fn;
    const char* name;
  };
  const Kernel kernels[] = {{DType::BF16, gemm_bf16_widened_cpu, "bf16 widened"},
                            {DType::F16, gemm_f16_widened_cpu, "f16 widened"},
                            {DType::F16, op_gemm.get(kCPU, DType::F16), "f16 registered"}};
  // Past one task's columns (n 100), past the rows widened at once (k 600, 1030), whole and partial panels.
  const std::tuple<int64_t, int64_t, int64_t> sizes[] = {
      {1, 1, 1},    {1, 5, 8},     {2, 4, 9},     {3, 7, 17},    {5, 9, 16},  {16, 33, 7},
      {13, 4, 300}, {16, 64, 128}, {5, 100, 600}, {16, 7, 1030}, {6, 48, 20}, {9, 97, 33}};
  for (const Kernel& kn : kernels)
    for (auto [m, n, k] : sizes)
      for (auto [alpha, beta] : {std::pair<float, float>{1, 0}, {-2, 0.25f}})
        for (int64_t pad : {0, 3})
          for (bool columns : {true, false}) {
            const int64_t batch = pad ? 2 : 1, a_row = k + pad, c_row = n + pad;
            const int64_t b_lead = (columns ? k : n) + pad;  // b's rows: B's columns, or B's rows
            const uint64_t seed = uint64_t(m * 7 + n * 11 + k * 13 + pad);
            const Tensor a = uniform({batch, m, a_row}, -1, 1, kn.t, seed);
            const Tensor b = uniform({batch, columns ? n : k, b_lead}, -1, 1, kn.t, seed + 1);
            Tensor c = uniform({batch, m, c_row}, -1, 1, kn.t, seed + 2);
            const GemmArgs g{.batch = batch,
                             .m = m,
                             .n = n,
                             .k = k,
                             .a = a.raw_data(),
                             .b = b.raw_data(),
                             .c = c.raw_data(),
                             .a_batch = m * a_row,
                             .a_row = a_row,
                             .b_batch = (columns ? n : k) * b_lead,
                             .b_row = columns ? 1 : b_lead,
                             .b_col = columns ? b_lead : 1,
                             .c_batch = m * c_row,
                             .c_row = c_row,
                             .alpha = alpha,
                             .beta = beta};
            auto expected = reference_result(g, a, b, c);
            const auto before = c.to_vector<double>();
            kn.fn(g);
            const std::string what = std::string(kn.name) + " m=" + std::to_string(m) +
                                     " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                                     " pad=" + std::to_string(pad) + " alpha=" + std::to_string(alpha) +
                                     (columns ? " B's columns" : " B's rows");
            // The padding columns of C are left as they were; the reference computes them as well.
            const auto got = c.to_vector<double>();
            for (int64_t e = 0; e < batch * m; ++e)
              for (int64_t j = n; j < c_row; ++j) {
                ASSERT_EQ(got[size_t(e * c_row + j)], before[size_t(e * c_row + j)])
                    << what << " wrote padding";
                expected[size_t(e * c_row + j)] = before[size_t(e * c_row + j)];
              }
            expect_close(c, expected, once_rounded(kn.t, k), what);
          }
}

// A few rows take no memory beside C: a 16-bit layer's forward on a few rows needs no more than its output,
// where the f32 tiles took about the f32 weight's bytes (and f16's composed layer first copied the weight
// transposed), and the dry run says so as well; so does the other layout of B.
TEST(Matmul16, FewRowsTakeNoWorkspace) {
  const int64_t m = 16, k = 128, n = 256;
  for (DType t : {DType::BF16, DType::F16}) {
    const Tensor a = uniform({m, k}, -1, 1, t, 61), b = uniform({n, k}, -1, 1, t, 62);
    Tensor c = zeros({m, n}, t);
    const GemmArgs g = layer_gemm(a, b, c);
    memory::reset_peak(kCPU);
    const int64_t before = memory::stats(kCPU).allocated.current;
    GemmKernel* widened = t == DType::BF16 ? gemm_bf16_widened_cpu : gemm_f16_widened_cpu;
    widened(g);
    EXPECT_EQ(memory::stats(kCPU).allocated.peak, before) << dtype_name(t);
    // B's rows contiguous (B [k, n] as it lies, as d x = d y W), on 8 rows.
    const Tensor rows = uniform({8, k}, -1, 1, t, 66), bk = uniform({k, n}, -1, 1, t, 67);
    Tensor c8 = zeros({8, n}, t);
    const GemmArgs g8{.m = 8,
                      .n = n,
                      .k = k,
                      .a = rows.raw_data(),
                      .b = bk.raw_data(),
                      .c = c8.raw_data(),
                      .a_row = k,
                      .b_row = n,
                      .c_row = n};
    memory::reset_peak(kCPU);
    const int64_t before8 = memory::stats(kCPU).allocated.current;
    widened(g8);
    EXPECT_EQ(memory::stats(kCPU).allocated.peak, before8) << dtype_name(t) << ", B's rows";
    expect_close(c8, reference_matmul(rows, bk), once_rounded(t, k),
                 std::string(dtype_name(t)) + ", B's rows");
  }
  const Tensor x = uniform({m, k}, -1, 1, DType::F16, 63), w = uniform({n, k}, -1, 1, DType::F16, 64);
  const Tensor bias = uniform({n}, -1, 1, DType::F16, 65);
  InferenceMode im;
  memory::reset_peak(kCPU);
  const int64_t before = memory::stats(kCPU).allocated.current;
  const Tensor y = linear(x, w, bias);
  const int64_t output = m * n * 2;
  EXPECT_EQ(memory::stats(kCPU).allocated.peak - before, output) << "f16 linear";
  std::vector<double> expected = reference_matmul(x, w.t());
  const auto bias64 = bias.to_vector<double>();
  for (size_t e = 0; e < expected.size(); ++e) expected[e] += bias64[e % size_t(n)];
  expect_close(y, expected, once_rounded(DType::F16, k), "f16 linear");
  int64_t base = 0;
  const memory::Estimate e = memory::estimate([&](Device d) {
    const Tensor xm = empty({m, k}, TensorOptions(DType::F16).device(d));
    const Tensor wm = empty({n, k}, TensorOptions(DType::F16).device(d));
    const Tensor bm = empty({n}, TensorOptions(DType::F16).device(d));
    base = memory::stats(d).allocated.current;
    memory::reset_peak(d);
    const Tensor ym = linear(xm, wm, bm);
  });
  EXPECT_EQ(e.peak_allocated - base, output) << "the dry run of the f16 linear";
}

// Batch entries that overlap (each A a window one row further down one matrix): oneDNN refuses such a
// layout, and the bf16 kernel computes it through the widened path instead.
TEST(Matmul16, OverlappingBatchesFallBack) {
  for (DType t : {DType::BF16, DType::F16}) {
    const int64_t batch = 6, m = 10, k = 12, n = 5;
    const Tensor a = uniform({batch + m - 1, k}, -1, 1, t, 54), b = uniform({k, n}, -1, 1, t, 55);
    Tensor c = zeros({batch, m, n}, t);
    GemmArgs g;
    g.batch = batch;
    g.m = m;
    g.n = n;
    g.k = k;
    g.a = a.raw_data();
    g.a_batch = k;
    g.a_row = k;
    g.b = b.raw_data();
    g.b_row = n;
    g.c = c.raw_data();
    g.c_batch = m * n;
    g.c_row = n;
    const auto expected = reference_result(g, a, b, c);
    op_gemm.get(kCPU, t)(g);
    expect_close(c, expected, once_rounded(t, k), std::string(dtype_name(t)) + " overlapping batches");
  }
}

TEST(Matmul16, NonFiniteValuesPropagate) {
  for (DType t : {DType::BF16, DType::F16}) {
    Tensor a = uniform({4, 6}, -1, 1, DType::F32, 56);
    a.select(0, 1).fill_(NAN);
    a.select(0, 2).select(0, 3).fill_(INFINITY);
    const Tensor b = uniform({6, 3}, 0.5, 1, DType::F32, 57);  // positive, so the inf row stays +inf
    const auto y = matmul(a.to(t), b.to(t)).to_vector<double>();
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_TRUE(std::isnan(y[size_t(3 + j)])) << dtype_name(t) << " row of NaN, column " << j;
      EXPECT_EQ(y[size_t(6 + j)], INFINITY) << dtype_name(t) << " row with inf, column " << j;
      EXPECT_TRUE(std::isfinite(y[size_t(j)])) << dtype_name(t) << " finite row, column " << j;
    }
  }
}

// matmul's backward rule runs the same kernels on the gradients; bf16 gradients match the f32 ones computed
// from the same (bf16-representable) values at bf16's tolerance.
TEST(Matmul16, AutogradInBf16) {
  const Tensor x32 = uniform({2, 9, 24}, -1, 1, DType::BF16, 58).to(DType::F32);
  const Tensor w32 = uniform({24, 7}, -1, 1, DType::BF16, 59).to(DType::F32);
  const Tensor r32 = uniform({2, 9, 7}, -1, 1, DType::BF16, 60).to(DType::F32);
  auto grads = [&](DType t) {
    Tensor x = x32.to(t).detach().requires_grad_(), w = w32.to(t).detach().requires_grad_();
    const Tensor loss = sum(matmul(x, w) * r32.to(t));
    loss.backward();
    EXPECT_EQ(x.grad().dtype(), t);
    EXPECT_EQ(w.grad().dtype(), t);
    return std::pair<Tensor, Tensor>{x.grad(), w.grad()};
  };
  const auto [dx32, dw32] = grads(DType::F32);
  const auto [dx16, dw16] = grads(DType::BF16);
  expect_close(dx16, dx32.to_vector<double>(), once_rounded(DType::BF16, 7), "d_x");
  // d_w sums over the batch's 2 x 9 rows, and matmul's rule may sum the batch in bf16: allow a few roundings.
  expect_close(dw16, dw32.to_vector<double>(), {1e-2, 0x1p-7}, "d_w");
}

}  // namespace
}  // namespace frugal
