// Layers: forward against naive loops, gradients by finite differences (f64, contiguous and strided), default
// initialisation, batch-norm running statistics, dropout statistics and replay, and bad inputs.
#include <cmath>

#include "autograd/recompute.h"
#include "nn/layers.h"
#include "tests/autograd/gradcheck_helpers.h"

namespace frugal {
namespace {

namespace F = nn::functional;
using testing::expect_close;
using testing::expect_error;
using testing::expect_grads_ok;
using testing::Layout;
using testing::uniform;

TEST(Layers, LinearMatchesNaiveLoop) {
  nn::Linear fc(5, 3);
  EXPECT_EQ(fc->weight.shape(), (Shape{3, 5}));
  EXPECT_EQ(fc->bias.shape(), (Shape{3}));
  const Tensor x = uniform({2, 4, 5}, -1, 1, DType::F32, 2);  // leading dims fold into one GEMM
  const Tensor y = fc(x);
  ASSERT_EQ(y.shape(), (Shape{2, 4, 3}));
  const auto xv = x.to_vector<double>(), wv = fc->weight.to_vector<double>(),
             bv = fc->bias.to_vector<double>();
  std::vector<double> ref;
  for (int r = 0; r < 8; ++r)
    for (int o = 0; o < 3; ++o) {
      double s = bv[size_t(o)];
      for (int k = 0; k < 5; ++k) s += xv[size_t(r * 5 + k)] * wv[size_t(o * 5 + k)];
      ref.push_back(s);
    }
  expect_close(y, ref, testing::tol_for(DType::F32), "linear");
  nn::Linear nb(nn::LinearOptions(5, 3).bias(false));
  EXPECT_FALSE(nb->bias.defined());
  EXPECT_EQ(nb->named_parameters().size(), 1u);
}

TEST(Layers, LinearInitialisationBounds) {
  manual_seed(3);
  nn::Linear fc(400, 300);
  const double bound = 1.0 / std::sqrt(400.0);
  for (const Tensor& p : {fc->weight, fc->bias}) {
    EXPECT_LE(max(abs(p)).item<double>(), bound);
    EXPECT_GT(max(abs(p)).item<double>(), 0.95 * bound);  // it spans the whole range
  }
  // U(-b, b) has std b / sqrt(3).
  EXPECT_NEAR(std::sqrt(var(fc->weight).item<double>()), bound / std::sqrt(3.0), 0.01 * bound);
}

TEST(Layers, LinearGradcheck) {
  for (Layout layout : testing::kLayouts)
    expect_grads_ok([](const std::vector<Tensor>& in) { return F::linear(in[0], in[1], in[2]); },
                    {testing::leaf({2, 3, 4}, -1, 1, 1, layout), testing::leaf({5, 4}, -1, 1, 2, layout),
                     testing::leaf({5}, -1, 1, 3)},
                    std::string("linear ") + testing::layout_name(layout));
}

TEST(Layers, EmbeddingRowsPaddingAndDenseGradient) {
  manual_seed(4);
  nn::Embedding emb(nn::EmbeddingOptions(6, 3).padding_idx(-1));  // row 5
  EXPECT_EQ(*emb->options.padding_idx(), 5);
  EXPECT_EQ(sum(abs(emb->weight.select(0, 5))).item<double>(), 0.0);
  const Tensor idx = tensor(std::vector<int64_t>{1, 5, 1, 0, 2, 5}, {2, 3});
  const Tensor y = emb(idx);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 3}));
  const auto w = emb->weight.to_vector<double>();
  std::vector<double> ref;
  for (int64_t i : idx.to_vector<int64_t>())
    for (int j = 0; j < 3; ++j) ref.push_back(w[size_t(i * 3 + j)]);
  expect_close(y, ref, {0, 0}, "embedding rows");
  sum(y).backward();
  // Row 1 used twice, rows 0 and 2 once, row 5 (padding) never gets a gradient.
  std::vector<double> counts{1, 2, 1, 0, 0, 0};
  std::vector<double> expected;
  for (double c : counts) expected.insert(expected.end(), 3, c);
  expect_close(emb->weight.grad(), expected, {0, 0}, "embedding grad");
  EXPECT_EQ(emb->weight.grad().dtype(), DType::F32);
  // N(0, 1) initialisation.
  nn::Embedding big(1000, 100);
  EXPECT_NEAR(mean(big->weight).item<double>(), 0.0, 0.02);
  EXPECT_NEAR(var(big->weight).item<double>(), 1.0, 0.03);
}

TEST(Layers, EmbeddingDropoutFlattenGradcheck) {
  const Tensor idx = tensor(std::vector<int64_t>{3, 0, 3, 1, 4, 2}, {3, 2});
  for (Layout layout : testing::kLayouts) {
    const std::string l = testing::layout_name(layout);
    expect_grads_ok([&](const std::vector<Tensor>& in) { return F::embedding(idx, in[0]); },
                    {testing::leaf({5, 4}, -1, 1, 40, layout)}, "embedding " + l);
    // (padding_idx withholds the padding row's gradient on purpose, so it is checked by value above, not
    // here.) The mask must not change between gradcheck's calls: each call draws it from the same seed.
    expect_grads_ok(
        [](const std::vector<Tensor>& in) {
          manual_seed(42);
          return F::dropout(in[0], 0.4, true);
        },
        {testing::leaf({6, 5}, -1, 1, 42, layout)}, "dropout " + l);
    expect_grads_ok([](const std::vector<Tensor>& in) { return nn::Flatten()(in[0]); },
                    {testing::leaf({2, 3, 4}, -1, 1, 43, layout)}, "flatten " + l);
  }
}

TEST(Layers, DropoutStatisticsEvalAndRecompute) {
  manual_seed(5);
  nn::Dropout drop(0.3);
  const Tensor x = uniform({200, 500}, 0.5, 1.5, DType::F32, 6);
  const Tensor y = drop(x);
  const double zeros_frac = mean(eq(y, 0.0).to(DType::F64)).item<double>();
  EXPECT_NEAR(zeros_frac, 0.3, 0.01);
  // Kept elements are scaled by 1 / (1 - p).
  const Tensor kept = where(eq(y, 0.0), x / 0.7, y);
  expect_close(kept, (x / 0.7).to_vector<double>(), testing::tol_for(DType::F32), "dropout scale");
  drop->eval();
  EXPECT_TRUE(drop(x).is_same(x));
  EXPECT_TRUE(F::dropout(x, 0.0, true).is_same(x));
  EXPECT_EQ(sum(abs(F::dropout(x, 1.0, true))).item<double>(), 0.0);

  // Under recompute the segment's second run draws the same mask: the gradient is the mask of the first run.
  drop->train();
  const Tensor w = uniform({64, 32}, -1, 1, DType::F32, 7).requires_grad_();
  manual_seed(9);
  Tensor plain = drop(w * 2.0);
  sum(plain).backward();
  const auto g_plain = w.grad().to_vector<float>();
  w.zero_grad();
  manual_seed(9);
  Tensor rec = autograd::recompute([&](const std::vector<Tensor>& in) { return drop(in[0] * 2.0); }, {w});
  manual_seed(1234);  // the replay must not depend on the generator's state at backward time
  sum(rec).backward();
  EXPECT_EQ(w.grad().to_vector<float>(), g_plain);
  EXPECT_EQ(rec.to_vector<float>(), plain.to_vector<float>());
}

TEST(Layers, FlattenShapes) {
  const Tensor x = uniform({2, 3, 4, 5}, -1, 1);
  EXPECT_EQ(nn::Flatten()(x).shape(), (Shape{2, 60}));
  EXPECT_EQ(nn::Flatten(nn::FlattenOptions().start_dim(0).end_dim(1))(x).shape(), (Shape{6, 4, 5}));
  expect_close(nn::Flatten()(x), x.to_vector<double>(), {0, 0}, "flatten values");
  expect_error<IndexError>([&] { nn::Flatten(nn::FlattenOptions().start_dim(7))(x); }, {"7"});
}

TEST(Layers, LayerNormMatchesNaiveLoop) {
  nn::LayerNorm ln(nn::LayerNormOptions({3, 4}).eps(1e-3));
  EXPECT_EQ(ln->weight.to_vector<double>(), std::vector<double>(12, 1.0));
  EXPECT_EQ(ln->bias.to_vector<double>(), std::vector<double>(12, 0.0));
  {
    NoGradGuard g;
    ln->weight.copy_(uniform({3, 4}, 0.5, 1.5, DType::F32, 8));
    ln->bias.copy_(uniform({3, 4}, -1, 1, DType::F32, 9));
  }
  const Tensor x = uniform({2, 3, 4}, -2, 3, DType::F32, 10);
  const auto xv = x.to_vector<double>(), w = ln->weight.to_vector<double>(), b = ln->bias.to_vector<double>();
  std::vector<double> ref;
  for (int r = 0; r < 2; ++r) {
    double m = 0, v = 0;
    for (int j = 0; j < 12; ++j) m += xv[size_t(r * 12 + j)] / 12;
    for (int j = 0; j < 12; ++j) v += std::pow(xv[size_t(r * 12 + j)] - m, 2) / 12;
    for (int j = 0; j < 12; ++j)
      ref.push_back((xv[size_t(r * 12 + j)] - m) / std::sqrt(v + 1e-3) * w[size_t(j)] + b[size_t(j)]);
  }
  expect_close(ln(x), ref, {2e-5, 2e-5}, "layer_norm");
  // bf16 input computes in f32 and returns bf16.
  const Tensor yb = ln(x.to(DType::BF16));
  EXPECT_EQ(yb.dtype(), DType::BF16);
  expect_close(yb, ref, {0.05, 0.02}, "layer_norm bf16");
  nn::LayerNorm plain(nn::LayerNormOptions({4}).elementwise_affine(false));
  EXPECT_EQ(plain->num_parameters(), 0);
}

TEST(Layers, LayerNormGradcheck) {
  for (Layout layout : testing::kLayouts)
    expect_grads_ok(
        [](const std::vector<Tensor>& in) { return F::layer_norm(in[0], {4}, in[1], in[2], 1e-5); },
        {testing::leaf({3, 4}, -2, 2, 11, layout), testing::leaf({4}, 0.5, 1.5, 12),
         testing::leaf({4}, -1, 1, 13)},
        std::string("layer_norm ") + testing::layout_name(layout));
}

// Naive batch norm of x [N, C, H, W] with the given per-channel mean and variance.
std::vector<double> naive_bn(const std::vector<double>& x, const Shape& s, const std::vector<double>& m,
                             const std::vector<double>& v, const std::vector<double>& w,
                             const std::vector<double>& b, double eps) {
  std::vector<double> y(x.size());
  const int64_t hw = s[2] * s[3];
  for (int64_t i = 0; i < int64_t(x.size()); ++i) {
    const size_t c = size_t((i / hw) % s[1]);
    y[size_t(i)] = (x[size_t(i)] - m[c]) / std::sqrt(v[c] + eps) * w[c] + b[c];
  }
  return y;
}

// Per-channel mean and variance (biased or unbiased) of x [N, C, H, W].
void channel_stats(const std::vector<double>& x, const Shape& s, bool unbiased, std::vector<double>& m,
                   std::vector<double>& v) {
  const int64_t hw = s[2] * s[3], n = s[0] * hw;
  m.assign(size_t(s[1]), 0);
  v.assign(size_t(s[1]), 0);
  for (int64_t i = 0; i < int64_t(x.size()); ++i) m[size_t((i / hw) % s[1])] += x[size_t(i)] / double(n);
  for (int64_t i = 0; i < int64_t(x.size()); ++i) {
    const size_t c = size_t((i / hw) % s[1]);
    v[c] += std::pow(x[size_t(i)] - m[c], 2);
  }
  for (double& e : v) e /= double(unbiased ? n - 1 : n);
}

TEST(Layers, BatchNorm2dTrainingEvalAndRunningStats) {
  nn::BatchNorm2d bn(nn::BatchNorm2dOptions(3).momentum(0.2));
  EXPECT_EQ(bn->named_buffers().size(), 3u);
  {
    NoGradGuard g;
    bn->weight.copy_(uniform({3}, 0.5, 1.5, DType::F32, 14));
    bn->bias.copy_(uniform({3}, -1, 1, DType::F32, 15));
  }
  const Shape s{4, 3, 2, 5};
  std::vector<double> rm(3, 0.0), rv(3, 1.0);
  const auto w = bn->weight.to_vector<double>(), b = bn->bias.to_vector<double>();
  for (int step = 0; step < 3; ++step) {
    const Tensor x = uniform(s, -1 + step, 2 + 2 * step, DType::F32, 16 + uint64_t(step));
    const auto xv = x.to_vector<double>();
    std::vector<double> m, vb, vu;
    channel_stats(xv, s, false, m, vb);
    channel_stats(xv, s, true, m, vu);
    expect_close(bn(x), naive_bn(xv, s, m, vb, w, b, 1e-5), {2e-5, 2e-5},
                 "bn train step " + std::to_string(step));
    for (size_t c = 0; c < 3; ++c) {
      rm[c] = 0.8 * rm[c] + 0.2 * m[c];
      rv[c] = 0.8 * rv[c] + 0.2 * vu[c];
    }
  }
  expect_close(bn->running_mean, rm, {1e-6, 1e-5}, "running_mean");
  expect_close(bn->running_var, rv, {1e-6, 1e-5}, "running_var");
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 3);
  bn->eval();
  const Tensor x = uniform(s, -1, 1, DType::F32, 30);
  expect_close(bn(x), naive_bn(x.to_vector<double>(), s, rm, rv, w, b, 1e-5), {2e-5, 2e-5}, "bn eval");
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 3);  // eval does not count

  // momentum nullopt: the cumulative average of the batch means.
  nn::BatchNorm2d cma(nn::BatchNorm2dOptions(3).momentum(std::nullopt));
  std::vector<double> avg(3, 0.0);
  for (int step = 0; step < 2; ++step) {
    const Tensor xs = uniform(s, -1, 1 + step, DType::F32, 40 + uint64_t(step));
    std::vector<double> m, v;
    channel_stats(xs.to_vector<double>(), s, false, m, v);
    for (size_t c = 0; c < 3; ++c) avg[c] += m[c] / 2;
    cma(xs);
  }
  expect_close(cma->running_mean, avg, {1e-6, 1e-5}, "cumulative running_mean");
}

TEST(Layers, BatchNormGradcheck) {
  for (Layout layout : testing::kLayouts)
    expect_grads_ok(
        [](const std::vector<Tensor>& in) {
          return F::batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], true, 0.1, 1e-5);
        },
        {testing::leaf({3, 2, 2, 3}, -2, 2, 17, layout), testing::leaf({2}, 0.5, 1.5, 18),
         testing::leaf({2}, -1, 1, 19)},
        std::string("batch_norm ") + testing::layout_name(layout));
  // Eval mode: the running statistics are constants.
  const Tensor rm = uniform({2}, -1, 1, DType::F64, 20), rv = uniform({2}, 0.5, 2, DType::F64, 21);
  expect_grads_ok([&](const std::vector<Tensor>& in) { return F::batch_norm(in[0], rm, rv, in[1], in[2]); },
                  {testing::leaf({3, 2, 2, 3}, -2, 2, 22), testing::leaf({2}, 0.5, 1.5, 23),
                   testing::leaf({2}, -1, 1, 24)},
                  "batch_norm eval");
}

TEST(Layers, ActivationsMatchFormulasAndGradcheck) {
  const Tensor x = uniform({3, 7}, -3, 3, DType::F64, 25);
  const auto xv = x.to_vector<double>();
  struct Case {
    std::shared_ptr<nn::Module> m;
    double (*f)(double);
  };
  const std::vector<Case> cases = {
      {nn::ReLU(), [](double v) { return v > 0 ? v : 0.0; }},
      {nn::GELU(), [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }},
      {nn::GELU(nn::GELUOptions().approximate("tanh")),
       [](double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); }},
      {nn::SiLU(), [](double v) { return v / (1 + std::exp(-v)); }},
      {nn::Tanh(), [](double v) { return std::tanh(v); }},
      {nn::Sigmoid(), [](double v) { return 1 / (1 + std::exp(-v)); }},
  };
  for (const auto& c : cases) {
    std::vector<double> ref;
    for (double v : xv) ref.push_back(c.f(v));
    expect_close(c.m->forward(x), ref, {1e-12, 1e-10}, c.m->type_name());
    for (Layout layout : testing::kLayouts)
      expect_grads_ok([&](const std::vector<Tensor>& in) { return c.m->forward(in[0]); },
                      {testing::signed_leaf({3, 4}, 26, layout)}, c.m->type_name() + " gradcheck");
  }
}

TEST(Layers, BadInputs) {
  nn::Linear fc(4, 3);
  expect_error<ShapeError>([&] { fc(uniform({2, 5}, -1, 1)); }, {"linear", "[2, 5]", "[3, 4]"});
  expect_error<Error>([&] { nn::Linear(0, 3); }, {"Linear", "positive"});
  nn::Embedding emb(10, 3);
  expect_error<IndexError>(
      [&] {
        emb(tensor(std::vector<int64_t>{1, 12, 3}));
      },
      {"embedding", "index 12", "10 embeddings"});
  expect_error<IndexError>([&] { emb(tensor(std::vector<int64_t>{-1})); }, {"embedding", "index -1"});
  expect_error<DTypeError>([&] { emb(uniform({3}, 0, 5)); }, {"embedding", "i64", "f32"});
  expect_error<IndexError>([&] { nn::Embedding(nn::EmbeddingOptions(4, 2).padding_idx(4)); },
                           {"padding_idx 4", "4 embeddings"});
  expect_error<Error>([&] { nn::Dropout(1.5); }, {"Dropout", "1.5"});
  expect_error<DTypeError>([&] { F::dropout(arange(4), 0.5, true); }, {"dropout", "floating", "i64"});
  nn::LayerNorm ln(Shape{4});
  expect_error<ShapeError>([&] { ln(uniform({2, 5}, -1, 1)); }, {"layer_norm", "[2, 5]", "[4]"});
  nn::BatchNorm2d bn(3);
  expect_error<ShapeError>(
      [&] {
        bn(uniform({2, 3, 4}, -1, 1));
      },
      {"BatchNorm2d", "[2, 3, 4]", "[N, 3, H, W]"});
  expect_error<ShapeError>([&] { bn(uniform({2, 4, 2, 2}, -1, 1)); }, {"BatchNorm2d", "[2, 4, 2, 2]"});
  expect_error<ShapeError>([&] { bn(uniform({1, 3, 1, 1}, -1, 1)); }, {"batch_norm", "more than 1 value"});
  expect_error<Error>([&] { nn::GELU(nn::GELUOptions().approximate("fast")); }, {"GELU", "fast"});
}

}  // namespace
}  // namespace frugal
