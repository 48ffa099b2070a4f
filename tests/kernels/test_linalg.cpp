// matmul against the naive f64 GEMM (every shape rule, batch broadcasting, transposed and strided operands,
// each dtype, both f32 paths), and softmax / log-softmax against a direct f64 formula.
#include <cmath>

#include "core/op_table_linalg.h"
#include "kernels/cpu/reference.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::tol_for;
using testing::uniform;

// Naive matmul with NumPy semantics, straight from the definition, in f64.
std::vector<double> reference_matmul(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = a_in.dim() == 1 ? a_in.unsqueeze(0) : a_in;
  const Tensor b = b_in.dim() == 1 ? b_in.unsqueeze(1) : b_in;
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const Shape batch =
      broadcast_shapes(Shape(std::vector<int64_t>(a.shape().begin(), a.shape().end() - 2)),
                       Shape(std::vector<int64_t>(b.shape().begin(), b.shape().end() - 2)), "ref");
  Shape a_full = batch, b_full = batch;
  a_full.push_back(m);
  a_full.push_back(k);
  b_full.push_back(k);
  b_full.push_back(n);
  const auto av = a.expand(a_full).to_vector<double>(), bv = b.expand(b_full).to_vector<double>();
  std::vector<double> out;
  for (int64_t p = 0; p < batch.numel(); ++p)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t q = 0; q < k; ++q)
          s += av[size_t(p * m * k + i * k + q)] * bv[size_t(p * k * n + q * n + j)];
        out.push_back(s);
      }
  return out;
}

// GEMM tolerance: the error grows with the inner size k.
testing::Tol gemm_tol(DType t, int64_t k) {
  const double kk = double(std::max<int64_t>(k, 1));
  if (t == DType::F64) return {1e-12 * kk, 1e-10};
  if (t == DType::F32) return {2e-6 * kk, 1e-4};
  return tol_for(t).atol * 4 < 1 ? testing::Tol{tol_for(t).atol * 2 * std::sqrt(kk), tol_for(t).rtol * 2}
                                 : tol_for(t);
}

TEST(Matmul, ShapeRules) {
  struct Case {
    Shape a, b, out;
  };
  const Case cases[] = {
      {{5}, {5}, {}},                           // dot
      {{3, 5}, {5}, {3}},                       // matrix-vector
      {{5}, {5, 4}, {4}},                       // vector-matrix
      {{3, 5}, {5, 4}, {3, 4}},                 // matrix
      {{2, 3, 5}, {5, 4}, {2, 3, 4}},           // batch with a broadcast matrix
      {{3, 5}, {2, 5, 4}, {2, 3, 4}},           // broadcast on the left
      {{2, 1, 3, 5}, {4, 5, 6}, {2, 4, 3, 6}},  // batch dims broadcast both ways
      {{2, 3, 5}, {5}, {2, 3}},                 // batch matrix-vector
      {{5}, {2, 5, 4}, {2, 4}},                 // vector-batch matrix
      {{1, 64}, {64, 1}, {1, 1}},
      {{0, 5}, {5, 4}, {0, 4}},  // empty
      {{3, 0}, {0, 4}, {3, 4}},  // k = 0: zeros
  };
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16})
    for (const auto& c : cases) {
      const Tensor a = uniform(c.a, -1, 1, t, 21), b = uniform(c.b, -1, 1, t, 22);
      const Tensor y = matmul(a, b);
      EXPECT_EQ(y.shape(), c.out) << c.a << " @ " << c.b;
      EXPECT_EQ(y.dtype(), t);
      expect_close(y, reference_matmul(a, b), gemm_tol(t, c.a.back()),
                   std::string(dtype_name(t)) + " " + c.a.str() + " @ " + c.b.str());
    }
}

TEST(Matmul, TransposedAndStridedOperands) {
  const Tensor a = uniform({40, 30}, -1, 1, DType::F32, 23), b = uniform({50, 40}, -1, 1, DType::F32, 24);
  // a.t() and b.t() are column-major views: passed to the GEMM without a copy; a slice with step 2 needs one.
  expect_close(matmul(a.t(), b.t()), reference_matmul(a.t(), b.t()), gemm_tol(DType::F32, 40), "aT bT");
  const Tensor s = uniform({30, 100}, -1, 1, DType::F32, 25).slice(1, 0, 100, 2);  // [30, 50], col stride 2
  expect_close(matmul(a, s), reference_matmul(a, s), gemm_tol(DType::F32, 30), "strided b");
  const Tensor batched = uniform({4, 30, 40}, -1, 1, DType::F32, 26).transpose(1, 2);  // [4, 40, 30]
  expect_close(matmul(batched, a.t()), reference_matmul(batched, a.t()), gemm_tol(DType::F32, 30),
               "batched T");
  const Tensor perm =
      uniform({30, 4, 40}, -1, 1, DType::F32, 27).permute({1, 2, 0});  // batch stride not uniform
  expect_close(matmul(perm, s), reference_matmul(perm, s), gemm_tol(DType::F32, 30), "permuted batch");
}

TEST(Matmul, OneDnnAndEigenAgreeWithReferenceKernel) {
  for (auto [m, n, k] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {17, 33, 65}, {128, 96, 200}, {3, 300, 2}}) {
    const Tensor a = uniform({m, k}, -1, 1, DType::F32, 28), b = uniform({k, n}, -1, 1, DType::F32, 29);
    GemmArgs g;
    g.m = m;
    g.n = n;
    g.k = k;
    g.a = a.raw_data();
    g.b = b.raw_data();
    g.a_row = k;
    g.b_row = n;
    g.c_row = n;
    Tensor fast = matmul(a, b), eig = zeros({m, n}), ref = zeros({m, n});
    g.c = eig.raw_data();
    gemm_f32_eigen_cpu(g);
    g.c = ref.raw_data();
    reference::gemm<float>(g);
    expect_close(fast, ref.to_vector<double>(), gemm_tol(DType::F32, k), "registered vs reference");
    expect_close(eig, ref.to_vector<double>(), gemm_tol(DType::F32, k), "eigen vs reference");
  }
}

TEST(Matmul, LargeSquare) {
  const Tensor a = uniform({256, 256}, -1, 1, DType::F32, 30), b = uniform({256, 256}, -1, 1, DType::F32, 31);
  expect_close(matmul(a, b), reference_matmul(a, b), gemm_tol(DType::F32, 256), "256^3");
}

// Note [B's rows 2 KiB apart] (kernels/cpu/gemm.cpp): a B not transposed whose rows are a multiple of 2 KiB
// apart, under a short C, is multiplied in panels of its rows copied to a workspace. Each form such a product
// takes (a last panel shorter than the others, A transposed, alpha and beta, a batch, panels of fewer rows
// for a wide B, B a view of the first columns of a wider matrix) against the naive GEMM, with the workspace
// gemm_f32_panel_bytes names and no other; then linear_backward's d x on W4's micro-batch of 256 rows,
// measured and dry-run alike.
TEST(Matmul, PanelsOfBAgreeWithReference) {
  struct Case {
    int64_t batch, m, n, k;
    bool a_transposed;
    float alpha, beta;
    int64_t b_row = 0;  // B's row stride: n when 0, else B is the first n columns of a [k, b_row] matrix
  };
  bool any_panels = false;
  uint64_t seed = 70;
  for (const Case c : {Case{1, 64, 512, 300, false, 1, 0}, Case{1, 100, 1024, 600, true, 0.5f, 2},
                       Case{2, 80, 512, 257, false, 1, 1}, Case{1, 64, 4096, 130, false, -1, 0},
                       Case{1, 96, 512, 300, false, 1, 0, 1024}}) {
    const std::string label = detail::str_cat("batch ", c.batch, ", m ", c.m, ", n ", c.n, ", k ", c.k);
    const Tensor a = c.a_transposed ? uniform({c.batch, c.k, c.m}, -1, 1, DType::F32, ++seed)
                                    : uniform({c.batch, c.m, c.k}, -1, 1, DType::F32, ++seed);
    const int64_t b_row = c.b_row > 0 ? c.b_row : c.n;
    const Tensor b = uniform({c.batch, c.k, b_row}, -1, 1, DType::F32, ++seed);
    const Tensor out = uniform({c.batch, c.m, c.n}, -1, 1, DType::F32, ++seed), expected = out.clone();
    GemmArgs g{.batch = c.batch,
               .m = c.m,
               .n = c.n,
               .k = c.k,
               .a = a.raw_data(),
               .b = b.raw_data(),
               .c = out.raw_data(),
               .a_batch = c.m * c.k,
               .a_row = c.a_transposed ? 1 : c.k,
               .a_col = c.a_transposed ? c.m : 1,
               .b_batch = c.k * b_row,
               .b_row = b_row,
               .c_batch = c.m * c.n,
               .c_row = c.n,
               .alpha = c.alpha,
               .beta = c.beta};
    const int64_t panels = gemm_f32_panel_bytes(g);
    any_panels = any_panels || panels > 0;
    memory::empty_cache(kCPU);  // a cached block may be larger than the request (a large one by up to 1 MiB)
    memory::reset_peak(kCPU);
    const int64_t before = memory::stats(kCPU).allocated.current;
    op_gemm.get(kCPU, DType::F32)(g);
    EXPECT_EQ(memory::stats(kCPU).allocated.peak - before, (panels + 511) / 512 * 512) << label;
    g.c = expected.raw_data();
    reference::gemm<float>(g);
    expect_close(out, expected.to_vector<double>(), gemm_tol(DType::F32, c.k), label);
  }
  const int64_t m = 256, d = 1024;
  const Tensor dy = uniform({m, d}, -1, 1, DType::F32, ++seed),
               w = uniform({d, d}, -1, 1, DType::F32, ++seed);
  const GemmArgs dx_gemm{.m = m, .n = d, .k = d, .a_row = d, .b_row = d, .c_row = d};
  const int64_t panels = (gemm_f32_panel_bytes(dx_gemm) + 511) / 512 * 512, dx_bytes = m * d * 4;
  memory::empty_cache(kCPU);
  memory::reset_peak(kCPU);
  const int64_t before = memory::stats(kCPU).allocated.current;
  const Tensor dx = ops::linear_backward(dy, Tensor(), w, true, false, false).dx;
  EXPECT_EQ(memory::stats(kCPU).allocated.peak - before, dx_bytes + panels) << "d x of 256 rows";
  Tensor oracle = zeros({m, d});
  GemmArgs eigen = dx_gemm;
  eigen.a = dy.raw_data();
  eigen.b = w.raw_data();
  eigen.c = oracle.raw_data();
  gemm_f32_eigen_cpu(eigen);
  expect_close(dx, oracle.to_vector<double>(), gemm_tol(DType::F32, d), "d x of 256 rows, against Eigen");
  int64_t base = 0;
  const memory::Estimate e = memory::estimate([&](Device dev) {
    const Tensor dym = empty({m, d}, TensorOptions().device(dev)),
                 wm = empty({d, d}, TensorOptions().device(dev));
    base = memory::stats(dev).allocated.current;
    memory::reset_peak(dev);
    const Tensor dxm = ops::linear_backward(dym, Tensor(), wm, true, false, false).dx;
  });
  EXPECT_EQ(e.peak_allocated - base, dx_bytes + panels) << "the dry run of d x";
  if (!any_panels || panels == 0)
    GTEST_SKIP() << "no product took B's panels here (oneDNN's AVX-512 checker): only the plain path ran";
}

TEST(Matmul, BadInputs) {
  expect_error<ShapeError>(
      [] {
        matmul(ones({2, 3}), ones({2, 3}));
      },
      {"matmul", "[2, 3]", "inner sizes 3 and 2"});
  expect_error<ShapeError>([] { matmul(ones({2, 3, 4}), ones({3, 4, 5})); }, {"matmul", "[2]", "[3]"});
  expect_error<DTypeError>([] { matmul(ones({2, 2}), ones({2, 2}, DType::F64)); }, {"matmul", "f32", "f64"});
  expect_error<DTypeError>(
      [] {
        matmul(arange(4).reshape({2, 2}), arange(4).reshape({2, 2}));
      },
      {"matmul", "i64"});
  expect_error<Error>([] { matmul(scalar_tensor(1), ones({2})); }, {"matmul", "at least 1 dim"});
}

std::vector<double> reference_softmax(const Tensor& x, int dim, bool log) {
  const Tensor xt = x.transpose(dim, -1).contiguous();
  const auto v = xt.to_vector<double>();
  const int64_t cols = xt.size(-1);
  std::vector<double> r(v.size());
  for (size_t row = 0; row < v.size() / size_t(cols); ++row) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < cols; ++j) m = std::max(m, v[row * size_t(cols) + size_t(j)]);
    for (int64_t j = 0; j < cols; ++j) s += std::exp(v[row * size_t(cols) + size_t(j)] - m);
    for (int64_t j = 0; j < cols; ++j) {
      const double e = v[row * size_t(cols) + size_t(j)] - m;
      r[row * size_t(cols) + size_t(j)] = log ? e - std::log(s) : std::exp(e) / s;
    }
  }
  // Back to x's layout: r is in xt's (dim swapped with the last) order.
  const Tensor back = tensor<double>(r, xt.shape()).transpose(dim, -1);
  return back.to_vector<double>();
}

TEST(Softmax, EveryDimAndDtype) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16})
    for (int d = 0; d < 3; ++d)
      for (bool log : {false, true}) {
        const Tensor x = uniform({4, 5, 300}, -8, 8, t, 32);
        const Tensor y = log ? log_softmax(x, d) : softmax(x, d);
        EXPECT_EQ(y.shape(), x.shape());
        const testing::Tol tol = t == DType::F32 ? testing::Tol{1e-6, 1e-5} : tol_for(t);
        expect_close(
            y, reference_softmax(x, d, log), tol,
            std::string(log ? "log_softmax " : "softmax ") + dtype_name(t) + " dim " + std::to_string(d));
      }
}

TEST(Softmax, StableForLargeValuesAndStrided) {
  const Tensor x = tensor<float>({1000.f, 1001.f, 1002.f});
  expect_close(softmax(x, 0), reference_softmax(x, 0, false), {1e-6, 1e-5}, "large");
  EXPECT_FALSE(std::isnan(log_softmax(tensor<float>({-1e30f, 0.f}), 0).to_vector<float>()[1]));
  const Tensor s = uniform({30, 20}, -3, 3).t();
  expect_close(softmax(s, -1), reference_softmax(s, 1, false), {1e-6, 1e-5}, "strided");
  const auto row = softmax(uniform({7, 11}, -3, 3), 1).sum({1}).to_vector<double>();
  for (double r : row) EXPECT_NEAR(r, 1.0, 1e-5);
}

TEST(Softmax, BadInputs) {
  expect_error<DTypeError>([] { softmax(arange(3), 0); }, {"softmax", "i64"});
  expect_error<IndexError>([] { log_softmax(ones({2, 3}), 2); }, {"log_softmax", "dim 2"});
}

}  // namespace
}  // namespace frugal
