// The fused linear + ReLU op (frugal::linear_relu, behind F::linear_relu and nn::Sequential's Linear, ReLU
// pairs) against its composite relu(F::linear_composite): outputs and gradients in f32 (oneDNN's fused GEMM
// where built with it) and f64 (the composition), non-contiguous inputs and weights, leading dims, no bias;
// its backward op bit-identical to the unfused ops (relu_backward, sum, linear_backward); finite differences
// in f64; Sequential's fusion, with recompute segments bit-identical to without; bad inputs.
#include "core/op_table_linalg.h"
#include "nn/containers.h"
#include "nn/layers.h"
#include "tests/autograd/gradcheck_helpers.h"
#include "tests/nn/linear_case.h"
#include "tests/nn/sequential_grads.h"

namespace frugal {
namespace {

namespace F = nn::functional;
using testing::expect_close;
using testing::expect_error;
using testing::uniform;

void expect_same(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined()) return;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  size_t differ = 0;
  for (size_t i = 0; i < x.size(); ++i) differ += x[i] != y[i];
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << x.size() << " elements differ";
}

const std::vector<testing::LinearCase> kCases = {
    {{5, 7}, 3, true, false, false},
    {{5, 7}, 3, false, false, false},
    {{2, 3, 4}, 6, true, false, false},
    {{7}, 4, true, false, false},
    {{6, 5}, 4, true, true, false},
    {{6, 5}, 4, true, false, true},
    {{300, 64}, 96, true, false, false},
    {{1, 9}, 1, true, false, false},
    {{3, 1}, 5, false, false, false},
    {{256, 130}, 600, true, false, false},  // the bias gradient summed in row chunks
};

TEST(LinearRelu, MatchesComposite) {
  testing::expect_matches_composite(
      kCases, [](const Tensor& x, const Tensor& w, const Tensor& b) { return F::linear_relu(x, w, b); },
      [](const Tensor& x, const Tensor& w, const Tensor& b) { return relu(F::linear_composite(x, w, b)); });
}

// The forward kernel against the op it fuses at W4's layer size (oneDNN's matmul against dnnl_sgemm: the
// products may round differently, so within f32 rounding).
TEST(LinearRelu, ForwardKernelMatchesLinearThenRelu) {
  for (bool bias : {true, false}) {
    const Tensor x = uniform({1024, 1024}, -1, 1, DType::F32, 11),
                 w = uniform({1024, 1024}, -0.05, 0.05, DType::F32, 12);
    const Tensor b = bias ? uniform({1024}, -0.5, 0.5, DType::F32, 13) : Tensor();
    const Tensor y = ops::linear_relu(x, w, b), ref = ops::relu(ops::linear(x, w, b));
    expect_close(y, ref.to_vector<double>(), testing::Tol{1e-5, 1e-5}, bias ? "1024^3 bias" : "1024^3");
  }
}

// The fused linear kernel (op_linear, f32 and bf16 where oneDNN is built in) against x w^T + b computed in
// f64 from the same inputs: with and without the bias and the ReLU, shapes down to one row, one column and
// one input, and W1's and W4's layers. bf16 rounds y once (relative 2^-8), its products summed in f32. f32's
// few rows (Note [a layer's forward on a few rows] in kernels/cpu/linear.cpp): one, a pair, an odd number, 8;
// k below, at and past a vector's lanes, n not a whole block of columns, W1's and W4's layers.
TEST(LinearRelu, FusedLinearKernelMatchesAnF64Reference) {
  const int64_t shapes[][3] = {{5, 7, 3},          {1, 9, 1},       {4, 1, 6},  {1, 1, 1},  {128, 784, 256},
                               {1024, 1024, 1024}, {2, 16, 4},      {2, 33, 5}, {1, 17, 9}, {1, 784, 256},
                               {2, 256, 10},       {2, 1024, 1024}, {3, 40, 7}};
  for (const auto& sh : shapes)
    for (DType t : {DType::F32, DType::BF16})
      for (bool bias : {true, false})
        for (bool relu : {true, false}) {
          const int64_t m = sh[0], k = sh[1], n = sh[2];
          const Tensor x = uniform({m, k}, -1, 1, t, 31), w = uniform({n, k}, -0.1, 0.1, t, 32);
          const Tensor b = bias ? uniform({n}, -0.5, 0.5, t, 33) : Tensor();
          const Tensor y = relu ? ops::linear_relu(x, w, b) : ops::linear(x, w, b);
          ASSERT_EQ(y.shape(), (Shape{m, n}));
          ASSERT_EQ(y.dtype(), t);
          const auto xv = x.to_vector<double>(), wv = w.to_vector<double>();
          const auto bv = bias ? b.to_vector<double>() : std::vector<double>(size_t(n), 0.0);
          std::vector<double> ref(size_t(m * n));
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double acc = bv[size_t(j)];
              for (int64_t p = 0; p < k; ++p) acc += xv[size_t(i * k + p)] * wv[size_t(j * k + p)];
              ref[size_t(i * n + j)] = relu ? std::max(acc, 0.0) : acc;
            }
          std::ostringstream what;
          what << m << "x" << k << "x" << n << " " << dtype_name(t) << (bias ? " bias" : "")
               << (relu ? " relu" : "");
          const double tol = t == DType::BF16 ? 1.0 / 128 : 1e-5;
          expect_close(y, ref, testing::Tol{tol, tol}, what.str());
        }
}

// The backward op's one pass gives exactly what the unfused ops give from the same y.
TEST(LinearRelu, BackwardOpIsBitIdenticalToTheUnfusedOps) {
  const Shape shapes[][2] = {{{5, 7}, {3, 7}},       {{300, 64}, {96, 64}},    {{1024, 256}, {1024, 256}},
                             {{64, 40}, {1100, 40}}, {{256, 130}, {600, 130}}, {{2048, 16}, {512, 16}}};
  for (const auto& s : shapes)
    for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
      const Tensor x = uniform(s[0], -1, 1, t, 21), w = uniform(s[1], -1, 1, t, 22);
      // About half the outputs zero, as after a ReLU; some exactly-zero gradients too.
      const Tensor y = ops::relu(uniform({s[0][0], s[1][0]}, -1, 1, t, 23));
      const Tensor g = ops::relu(uniform(y.shape(), -0.3, 1, t, 24));
      const ops::LinearGrads fused = ops::linear_relu_backward(g, x, w, y, true, true, true);
      const Tensor gz = ops::relu_backward(g, y);
      const ops::LinearGrads ref = ops::linear_backward(gz, x, w, true, true, false);
      std::ostringstream what;
      what << s[0] << " x " << s[1] << " " << dtype_name(t);
      expect_same(fused.dx, ref.dx, what.str() + " dx");
      expect_same(fused.dweight, ref.dweight, what.str() + " dweight");
      expect_same(fused.dbias, ops::sum(gz, {0}), what.str() + " dbias");
    }
}

TEST(LinearRelu, BackwardOpWithoutSomeGradients) {
  const Tensor x = uniform({6, 5}, -1, 1), w = uniform({4, 5}, -1, 1), y = ops::relu(uniform({6, 4}, -1, 1));
  const Tensor g = uniform({6, 4}, -1, 1);
  const ops::LinearGrads only_x = ops::linear_relu_backward(g, Tensor(), w, y, true, false, false);
  EXPECT_TRUE(only_x.dx.defined());
  EXPECT_FALSE(only_x.dweight.defined());
  EXPECT_FALSE(only_x.dbias.defined());
  expect_same(only_x.dx, ops::linear_backward(ops::relu_backward(g, y), Tensor(), w, true, false, false).dx,
              "dx only");
  const ops::LinearGrads only_b =
      ops::linear_relu_backward(g.t().contiguous().t(), x, w, y, false, false, true);
  expect_same(only_b.dbias, ops::sum(ops::relu_backward(g, y), {0}), "dbias only, strided gradient");
}

// The backward writes d z over d y only where d y is the engine's alone: a gradient the caller passed in, or
// one retained by retain_grad(), keeps its values; the gradients are the same either way.
TEST(LinearRelu, OverwritesOnlyTheEnginesOwnGradient) {
  const Tensor x = uniform({8, 6}, -1, 1, DType::F32, 41).requires_grad_();
  const Tensor w = uniform({5, 6}, -1, 1, DType::F32, 42).requires_grad_();
  const Tensor b = uniform({5}, -0.2, 0.2, DType::F32, 43).requires_grad_();
  const Tensor g = uniform({8, 5}, -1, 1, DType::F32, 44), g_copy = g.clone();
  F::linear_relu(x, w, b).backward(g);
  expect_same(g, g_copy, "the caller's gradient");
  const std::vector<Tensor> passed = {x.grad(), w.grad(), b.grad()};
  for (const Tensor& p : {x, w, b}) p.zero_grad();
  // The same upstream gradient, made by the engine (mul's backward) and so the rule's own.
  Tensor y = F::linear_relu(x, w, b);
  y.retain_grad();
  sum(mul(y, g)).backward();
  expect_same(y.grad(), g_copy, "the retained gradient");
  const std::vector<Tensor> own = {x.grad(), w.grad(), b.grad()};
  for (size_t i = 0; i < own.size(); ++i) expect_same(own[i], passed[i], "gradient " + std::to_string(i));
}

TEST(LinearRelu, RunsTheFusedOpWhereItApplies) {
  const Tensor x = uniform({4, 3}, -1, 1).requires_grad_(), w = uniform({2, 3}, -1, 1).requires_grad_();
  EXPECT_EQ(F::linear_relu(x, w).grad_fn_name(), std::string("linear_relu"));
  // Mixed dtypes take the composite, whose matmul names them.
  expect_error<DTypeError>([&] { F::linear_relu(x, w.detach().to(DType::F64)); }, {"matmul", "f32", "f64"});
#ifdef FRUGAL_HAVE_ONEDNN
  EXPECT_TRUE(op_linear.has(kCPU, DType::F32));
  EXPECT_TRUE(op_linear.has(kCPU, DType::BF16));
#endif
  EXPECT_TRUE(op_relu_backward_bias.has(kCPU, DType::F32));
}

TEST(LinearRelu, Gradcheck) {
  // signed_leaf keeps the pre-activations away from ReLU's kink only by chance; these seeds stay clear.
  for (testing::Layout layout : testing::kLayouts)
    testing::expect_grads_ok(
        [](const std::vector<Tensor>& in) { return F::linear_relu(in[0], in[1], in[2]); },
        {testing::leaf({4, 5}, -1, 1, 5, layout), testing::leaf({3, 5}, -1, 1, 6, layout),
         testing::leaf({3}, -1, 1, 7)},
        std::string("linear_relu ") + testing::layout_name(layout));
  testing::expect_grads_ok([](const std::vector<Tensor>& in) { return F::linear_relu(in[0], in[1]); },
                           {testing::leaf({2, 3, 4}, -1, 1, 8), testing::leaf({2, 4}, -1, 1, 9)},
                           "linear_relu 3-d no bias");
}

// Sequential runs a Linear, ReLU pair as one op (not a ReLU of another class, nor a pair split by a recompute
// segment), with the values of the modules run one by one; recompute segments change no gradient bit.
struct OtherReLU : nn::ReLUImpl {};

nn::Sequential make_net(bool other_relu) {
  manual_seed(3);
  nn::Sequential net;
  for (int i = 0; i < 4; ++i) {
    net->push_back(nn::Linear(24, 24));
    if (other_relu)
      net->push_back(std::make_shared<OtherReLU>());
    else
      net->push_back(nn::ReLU());
  }
  net->push_back(nn::Linear(24, 5));
  return net;
}

TEST(LinearRelu, SequentialFusesLinearReluPairs) {
  const Tensor x = uniform({16, 24}, -1, 1, DType::F32, 30);
  auto fused = make_net(false), plain = make_net(true);
  nn::Sequential pair{nn::Linear(24, 24), nn::ReLU()};
  EXPECT_EQ(std::string(pair->forward(x).grad_fn_name()), "linear_relu");
  nn::Sequential other{nn::Linear(24, 24), std::make_shared<OtherReLU>()};
  EXPECT_EQ(std::string(other->forward(x).grad_fn_name()), "relu");
  const auto g_fused = testing::expect_nets_agree(*fused, *plain, x, testing::Tol{1e-5, 1e-5});
  // Segments of 3 modules split some pairs (Linear | ReLU): those run unfused, still the same gradients.
  for (int k : {2, 3, 4}) {
    auto rec = make_net(false);
    rec->recompute_every(k);
    const auto g_rec = testing::sequential_grads(*rec, x);
    for (size_t i = 0; i < g_fused.size(); ++i) {
      if (k % 2 == 0)
        expect_same(g_rec[i], g_fused[i],
                    "recompute_every(" + std::to_string(k) + ") parameter " + std::to_string(i));
      else
        expect_close(g_rec[i], g_fused[i].to_vector<double>(), testing::Tol{1e-5, 1e-5},
                     "recompute_every(" + std::to_string(k) + ") parameter " + std::to_string(i));
    }
  }
}

// Note [linear_relu keeps a NaN]: a NaN in x or in the weight comes out of linear_relu as it comes out of
// relu(linear(...)), bit for bit (the same primitive, then relu's rule), on every path: the few rows',
// oneDNN's in f32 and bf16; and out of nn::Sequential's Linear, ReLU pair, which runs it. oneDNN's ReLU
// post-op took such a NaN to 0.
TEST(LinearRelu, ANanComesThroughAsRelusDoes) {
  // How many NaNs a holds, expecting b to hold the same values and NaNs.
  auto same_bits = [](const Tensor& a, const Tensor& b, const std::string& what) -> size_t {
    EXPECT_EQ(a.shape(), b.shape()) << what;
    if (a.shape() != b.shape()) return 0;
    const auto x = a.to_vector<double>(), y = b.to_vector<double>();
    size_t differ = 0, nans = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      differ += std::isnan(x[i]) != std::isnan(y[i]) || (!std::isnan(x[i]) && x[i] != y[i]);
      nans += std::isnan(x[i]);
    }
    EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << x.size() << " elements differ";
    return nans;
  };
  NoGradGuard ng;
  const int64_t shapes[][3] = {{1, 9, 4}, {2, 33, 5}, {8, 40, 7}, {128, 784, 256}, {5, 7, 3}};
  for (const auto& sh : shapes)
    for (DType t : {DType::F32, DType::BF16})
      for (bool bias : {true, false}) {
        const int64_t m = sh[0], k = sh[1], n = sh[2];
        std::vector<double> xv = uniform({m, k}, -1, 1, DType::F64, 41).to_vector<double>();
        std::vector<double> wv = uniform({n, k}, -0.1, 0.1, DType::F64, 42).to_vector<double>();
        xv[size_t((m - 1) * k)] = std::nan("");  // the last row
        wv[size_t(k - 1)] = std::nan("");        // the first column
        const Tensor x = tensor(xv, {m, k}).to(t), w = tensor(wv, {n, k}).to(t);
        const Tensor b = bias ? uniform({n}, -0.5, 0.5, t, 43) : Tensor();
        std::ostringstream what;
        what << m << "x" << k << "x" << n << " " << dtype_name(t) << (bias ? " bias" : "");
        const size_t nans = same_bits(ops::linear_relu(x, w, b), ops::relu(ops::linear(x, w, b)), what.str());
        EXPECT_EQ(nans, size_t(m + n - 1)) << what.str() << ": the last row and the first column";
      }
  // Sequential's pair against the modules run one by one.
  nn::Linear linear(24, 24);
  nn::Sequential pair{linear, nn::ReLU()};
  std::vector<double> xv = uniform({16, 24}, -1, 1, DType::F64, 44).to_vector<double>();
  xv[5 * 24 + 3] = std::nan("");
  const Tensor x = tensor(xv, {16, 24}).to(DType::F32);
  EXPECT_EQ(same_bits(pair->forward(x), ops::relu(linear->forward(x)), "Sequential's Linear, ReLU"), 24u);
}

TEST(LinearRelu, BadInputs) {
  const Tensor x = uniform({4, 3}, -1, 1), w = uniform({2, 3}, -1, 1);
  expect_error<ShapeError>(
      [&] {
        ops::linear_relu(x, uniform({2, 4}, -1, 1));
      },
      {"linear_relu", "[4, 3]", "[2, 4]"});
  expect_error<ShapeError>([&] { ops::linear_relu(x, w, uniform({3}, -1, 1)); },
                           {"linear_relu", "bias", "[2]"});
  expect_error<DTypeError>([&] { ops::linear_relu(x, w.to(DType::F64)); }, {"linear_relu", "f32", "f64"});
  expect_error<DTypeError>([&] { ops::linear_relu(x.to(DType::I64), w.to(DType::I64)); },
                           {"linear_relu", "i64"});
  expect_error<ShapeError>(
      [&] {
        F::linear_relu(x, uniform({2, 4}, -1, 1));
      },
      {"linear", "[4, 3]", "[2, 4]"});
  const Tensor y = uniform({4, 2}, 0, 1), g = uniform({4, 2}, -1, 1);
  expect_error<ShapeError>(
      [&] {
        ops::linear_relu_backward(g, x, w, uniform({4, 3}, 0, 1), true, true, true);
      },
      {"linear_relu_backward", "[4, 3]", "[4, 2]"});
  expect_error<DTypeError>([&] { ops::linear_relu_backward(g, x, w, y.to(DType::F64), true, true, true); },
                           {"linear_relu_backward", "f32", "f64"});
  expect_error<Error>([&] { ops::linear_relu_backward(g, x, w, Tensor(), true, true, true); },
                      {"linear_relu_backward", "output"});
  // Nothing was written into the inputs.
  expect_close(x, uniform({4, 3}, -1, 1).to_vector<double>(), testing::Tol{0, 0}, "x untouched");
}

}  // namespace
}  // namespace frugal
