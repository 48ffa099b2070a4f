// Losses: values and gradients against PyTorch's (tests/fixtures/losses_ref.h), the fused cross-entropy
// against the composite (values, gradients, every dtype, gradcheck), and bad inputs.
#include "nn/functional.h"
#include "tests/autograd/gradcheck_helpers.h"
#include "tests/fixtures/losses_ref.h"

namespace frugal {
namespace {

namespace F = nn::functional;
namespace fx = fixtures;
using F::Reduction;
using testing::expect_close;
using testing::expect_error;
using testing::expect_grads_ok;
using testing::Layout;
using testing::tol_for;
using testing::uniform;

constexpr testing::Tol kTorchTol{1e-10, 1e-9};

Tensor f64(const std::vector<double>& v, const Shape& s) { return tensor(v, s); }
Tensor i64(const std::vector<int64_t>& v, const Shape& s) { return tensor(v, s); }

// Value of fn(x) and the gradient of it (a scalar) with respect to x.
std::pair<Tensor, Tensor> value_and_grad(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x0) {
  Tensor x = x0.detach().clone().requires_grad_();
  Tensor y = fn(x);
  y.backward();
  return {y.detach(), x.grad()};
}

TEST(Losses, CrossEntropyMatchesPyTorch) {
  const Tensor x = f64(fx::ce_logits, {5, 7});
  const Tensor t = i64(fx::ce_target, {5});
  for (int fused = 0; fused < 2; ++fused) {
    auto ce = fused ? F::cross_entropy : F::cross_entropy_composite;
    const std::string what = fused ? "fused" : "composite";
    expect_close(ce(x, t, Reduction::None, -100, 0), fx::ce_ls0_none, kTorchTol, what + " none");
    expect_close(ce(x, t, Reduction::Sum, -100, 0), fx::ce_ls0_sum, kTorchTol, what + " sum");
    expect_close(ce(x, t, Reduction::None, -100, 0.1), fx::ce_ls1_none, kTorchTol, what + " none ls");
    expect_close(ce(x, t, Reduction::Sum, -100, 0.1), fx::ce_ls1_sum, kTorchTol, what + " sum ls");
    for (double ls : {0.0, 0.1}) {
      auto [y, g] = value_and_grad([&](const Tensor& v) { return ce(v, t, Reduction::Mean, -100, ls); }, x);
      expect_close(y.reshape({1}), ls == 0 ? fx::ce_ls0_mean : fx::ce_ls1_mean, kTorchTol, what + " mean");
      expect_close(g, ls == 0 ? fx::ce_ls0_mean_grad : fx::ce_ls1_mean_grad, kTorchTol, what + " grad");
    }
  }
}

TEST(Losses, CrossEntropySpatialMatchesPyTorch) {
  const Tensor x = f64(fx::ce3_logits, {3, 4, 2});
  const Tensor t = i64(fx::ce3_target, {3, 2});
  for (int fused = 0; fused < 2; ++fused) {
    auto ce = fused ? F::cross_entropy : F::cross_entropy_composite;
    auto [y, g] = value_and_grad([&](const Tensor& v) { return ce(v, t, Reduction::Mean, 1, 0.2); }, x);
    expect_close(y.reshape({1}), fx::ce3_mean, kTorchTol, "mean");
    expect_close(g, fx::ce3_mean_grad, kTorchTol, "grad");
    const Tensor none = ce(x, t, Reduction::None, 1, 0.2);
    EXPECT_EQ(none.shape(), (Shape{3, 2}));
    expect_close(none, fx::ce3_none, kTorchTol, "none");
  }
}

TEST(Losses, CrossEntropyAllIgnoredIsNanAndUnbatchedWorks) {
  const Tensor x = uniform({2, 3}, -1, 1, DType::F32, 3);
  EXPECT_TRUE(std::isnan(F::cross_entropy(x, i64({-100, -100}, {2})).item<double>()));
  EXPECT_EQ(F::cross_entropy(x, i64({-100, -100}, {2}), Reduction::Sum).item<double>(), 0.0);
  // [C] with a 0-d target is row 0 of the batched loss.
  const double one = F::cross_entropy(x.select(0, 1), i64({2}, {})).item<double>();
  const double row = F::cross_entropy(x, i64({0, 2}, {2}), Reduction::None).to_vector<double>()[1];
  EXPECT_NEAR(one, row, 1e-6);
}

// The fused kernel against the composite: values and gradients for large rows (several chunks), every dtype,
// with and without label smoothing and ignore_index, on a non-contiguous view.
TEST(Losses, FusedCrossEntropyMatchesComposite) {
  for (int64_t classes : {3, 1000, 1300}) {
    for (double ls : {0.0, 0.15}) {
      const Tensor base = uniform({6, classes}, -8, 8, DType::F64, uint64_t(classes));
      Generator g(5);
      Tensor t = randint(0, classes, {6}, DType::I64, &g);
      t = where(eq(arange(6), 2.0), full({6}, -100, DType::I64), t);
      const std::string what = "C=" + std::to_string(classes) + " ls=" + std::to_string(ls);
      for (DType dt : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
        const Tensor x = base.to(dt);
        auto fused = value_and_grad(
            [&](const Tensor& v) { return F::cross_entropy(v, t, Reduction::Mean, -100, ls); }, x);
        auto ref = value_and_grad(
            [&](const Tensor& v) { return F::cross_entropy_composite(v, t, Reduction::Mean, -100, ls); }, x);
        EXPECT_EQ(fused.first.dtype(), dt);
        EXPECT_EQ(fused.second.dtype(), dt);
        const testing::Tol tol = dt == DType::F64 ? testing::Tol{1e-12, 1e-12} : tol_for(dt);
        expect_close(fused.first, ref.first.to_vector<double>(), tol, what + " value " + dtype_name(dt));
        expect_close(fused.second, ref.second.to_vector<double>(), tol, what + " grad " + dtype_name(dt));
      }
      // A transposed view: [classes, 6] contiguous seen as [6, classes].
      const Tensor tx = base.t().contiguous().t();
      ASSERT_FALSE(tx.is_contiguous());
      expect_close(F::cross_entropy(tx, t, Reduction::None, -100, ls),
                   F::cross_entropy_composite(base, t, Reduction::None, -100, ls).to_vector<double>(),
                   {1e-12, 1e-12}, what + " strided");
    }
  }
}

TEST(Losses, FusedCrossEntropyGradcheck) {
  const Tensor t = i64({1, 4, -100, 0}, {4});
  for (Layout layout : testing::kLayouts) {
    for (double ls : {0.0, 0.3}) {
      for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
        expect_grads_ok(
            [&](const std::vector<Tensor>& in) { return F::cross_entropy(in[0], t, r, -100, ls); },
            {testing::leaf({4, 5}, -3, 3, 11, layout)},
            std::string("cross_entropy ") + testing::layout_name(layout) + " " + F::reduction_name(r));
      }
    }
  }
  const Tensor t3 = i64({0, 2, 1, 2, 0, 2}, {2, 3});
  expect_grads_ok(
      [&](const std::vector<Tensor>& in) { return F::cross_entropy(in[0], t3, Reduction::Mean, 2, 0.1); },
      {testing::leaf({2, 3, 3}, -3, 3, 12)}, "cross_entropy [N, C, d]");
}

TEST(Losses, NllMseL1MatchPyTorch) {
  const Tensor t = i64(fx::ce_target, {5});
  auto [y, g] =
      value_and_grad([&](const Tensor& v) { return F::nll_loss(v, t); }, f64(fx::nll_input, {5, 7}));
  expect_close(y.reshape({1}), fx::nll_mean, kTorchTol, "nll mean");
  expect_close(g, fx::nll_mean_grad, kTorchTol, "nll grad");

  const Tensor a = f64(fx::reg_input, {4, 3}), b = f64(fx::reg_target, {4, 3});
  expect_close(F::mse_loss(a, b).reshape({1}), fx::mse_mean, kTorchTol, "mse mean");
  expect_close(F::mse_loss(a, b, Reduction::Sum).reshape({1}), fx::mse_sum, kTorchTol, "mse sum");
  expect_close(F::l1_loss(a, b).reshape({1}), fx::l1_mean, kTorchTol, "l1 mean");
  expect_close(F::l1_loss(a, b, Reduction::None), fx::l1_none, kTorchTol, "l1 none");
}

// A mean over 2^24 squared errors in f32 within 1e-6 of its f64 value (PyTorch: about 1e-7), for any thread
// count: Note [pairwise sums] in kernels/cpu/cascade.h.
TEST(Losses, MseOfALongF32InputIsAccurate) {
  Generator gen(24);
  const Tensor x = randn({1 << 24}, DType::F32, &gen);
  const Tensor target = zeros({1 << 24});
  const auto x64 = x.to_vector<double>();
  long double ss = 0;
  for (double v : x64) ss += v * v;  // exact in f64: a product of two floats
  const double expected = double(ss / x64.size());
  const int before = num_threads();
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    const double got = F::mse_loss(x, target).item<double>();
    EXPECT_LE(std::fabs(got - expected), 1e-6 * expected)
        << threads << " threads: " << got << " vs " << expected;
  }
  set_num_threads(before);
}

TEST(Losses, KlDivMatchesPyTorch) {
  const Tensor in = f64(fx::kl_input, {3, 5}), t = f64(fx::kl_target, {3, 5});
  auto [y, g] = value_and_grad([&](const Tensor& v) { return F::kl_div(v, t, Reduction::BatchMean); }, in);
  expect_close(y.reshape({1}), fx::kl_batchmean, kTorchTol, "batchmean");
  expect_close(g, fx::kl_batchmean_grad, kTorchTol, "batchmean grad");
  expect_close(F::kl_div(in, t).reshape({1}), fx::kl_mean, kTorchTol, "mean");
  expect_close(F::kl_div(in, t, Reduction::Sum).reshape({1}), fx::kl_sum, kTorchTol, "sum");
  expect_close(F::kl_div(in, f64(fx::kl_log_target, {3, 5}), Reduction::Sum, true).reshape({1}),
               fx::kl_log_target_sum, kTorchTol, "log_target");
}

TEST(Losses, BceWithLogitsMatchesPyTorch) {
  const Tensor x = f64(fx::bce_input, {4, 3}), t = f64(fx::bce_target, {4, 3});
  expect_close(F::binary_cross_entropy_with_logits(x, t, Reduction::None), fx::bce_none, kTorchTol, "none");
  const Tensor pw = f64(fx::bce_pos_weight, {3});
  auto [y, g] = value_and_grad(
      [&](const Tensor& v) { return F::binary_cross_entropy_with_logits(v, t, Reduction::Mean, pw); }, x);
  expect_close(y.reshape({1}), fx::bce_pw_mean, kTorchTol, "pos_weight mean");
  expect_close(g, fx::bce_pw_mean_grad, kTorchTol, "pos_weight grad");
}

TEST(Losses, GradcheckEveryLoss) {
  for (Layout layout : testing::kLayouts) {
    const std::string l = testing::layout_name(layout);
    const Tensor t = testing::leaf({3, 4}, -1, 1, 21, layout);
    expect_grads_ok([](const std::vector<Tensor>& in) { return F::mse_loss(in[0], in[1]); },
                    {testing::leaf({3, 4}, -1, 1, 20, layout), t}, "mse " + l);
    expect_grads_ok([](const std::vector<Tensor>& in) { return F::l1_loss(in[0], in[1], Reduction::Sum); },
                    {testing::signed_leaf({3, 4}, 22, layout), testing::leaf({3, 4}, -0.05, 0.05, 23)},
                    "l1 " + l);
    expect_grads_ok(
        [](const std::vector<Tensor>& in) {
          return F::kl_div(log_softmax(in[0], 1), in[1], Reduction::BatchMean);
        },
        {testing::leaf({3, 4}, -1, 1, 24, layout), testing::leaf({3, 4}, 0.1, 1, 25, layout)}, "kl_div " + l);
    expect_grads_ok(
        [](const std::vector<Tensor>& in) {
          return F::binary_cross_entropy_with_logits(in[0], in[1], Reduction::Mean, in[2]);
        },
        {testing::leaf({3, 4}, -4, 4, 26, layout), testing::leaf({3, 4}, 0, 1, 27, layout),
         testing::leaf({4}, 0.5, 2, 28)},
        "bce " + l);
    expect_grads_ok(
        [](const std::vector<Tensor>& in) {
          return F::nll_loss(in[0], i64({2, -100, 0}, {3}));
        },
        {testing::leaf({3, 4}, -3, 0, 29, layout)}, "nll " + l);
    expect_grads_ok(
        [](const std::vector<Tensor>& in) {
          return F::cross_entropy_composite(in[0], i64({2, -100, 0}, {3}), Reduction::Mean, -100, 0.2);
        },
        {testing::leaf({3, 4}, -3, 3, 30, layout)}, "cross_entropy_composite " + l);
  }
}

// The distillation loss against its definition computed here in plain loops (f64), its gradient by finite
// differences, the teacher untouched by backward, and its two ends: alpha 0 is the cross-entropy.
TEST(Losses, DistillationLossMatchesItsDefinition) {
  const int64_t n = 3, c = 4;
  const Tensor s = testing::leaf({n, c}, -3, 3, 40), t = testing::leaf({n, c}, -3, 3, 41);
  const Tensor y = i64({2, 0, 3}, {n});
  for (double temp : {1.0, 2.5}) {
    for (double alpha : {0.0, 0.4, 1.0}) {
      const std::vector<double> sv = s.to_vector<double>(), tv = t.to_vector<double>();
      const std::vector<int64_t> yv = y.to_vector<int64_t>();
      double kl = 0, ce = 0;
      for (int64_t i = 0; i < n; ++i) {
        auto log_softmax_row = [&](const std::vector<double>& v, double scale) {
          std::vector<double> out(static_cast<size_t>(c));
          double m = -1e300, z = 0;
          for (int64_t j = 0; j < c; ++j) m = std::max(m, v[size_t(i * c + j)] / scale);
          for (int64_t j = 0; j < c; ++j) z += std::exp(v[size_t(i * c + j)] / scale - m);
          for (int64_t j = 0; j < c; ++j) out[size_t(j)] = v[size_t(i * c + j)] / scale - m - std::log(z);
          return out;
        };
        const std::vector<double> ls = log_softmax_row(sv, temp), lt = log_softmax_row(tv, temp);
        for (int64_t j = 0; j < c; ++j) kl += std::exp(lt[size_t(j)]) * (lt[size_t(j)] - ls[size_t(j)]);
        ce -= log_softmax_row(sv, 1.0)[size_t(yv[size_t(i)])];
      }
      const double want = alpha * temp * temp * kl / double(n) + (1 - alpha) * ce / double(n);
      const std::string what = "T " + std::to_string(temp) + " alpha " + std::to_string(alpha);
      EXPECT_NEAR(F::distillation_loss(s, t, y, temp, alpha).item<double>(), want, 1e-12) << what;
      expect_grads_ok(
          [&](const std::vector<Tensor>& in) { return F::distillation_loss(in[0], t, y, temp, alpha); }, {s},
          "distillation " + what);
    }
  }
  EXPECT_NEAR(F::distillation_loss(s, t, y, 3.0, 0.0).item<double>(), F::cross_entropy(s, y).item<double>(),
              1e-15)
      << "alpha 0 is the cross-entropy";
  // The teacher's logits require grad here, yet its side of the graph is detached.
  const Tensor teacher = t.detach().requires_grad_(true);
  F::distillation_loss(s, teacher, y, 2.0, 0.5).backward();
  EXPECT_FALSE(teacher.grad().defined());
  EXPECT_TRUE(s.grad().defined());
}

TEST(Losses, DistillationLossBadInputs) {
  const Tensor s = uniform({4, 5}, -1, 1), t = uniform({4, 5}, -1, 1), y = i64({0, 1, 2, 3}, {4});
  expect_error<Error>([&] { F::distillation_loss(s, t, y, 0.0, 0.5); },
                      {"distillation_loss", "temperature", "0"});
  expect_error<Error>([&] { F::distillation_loss(s, t, y, 2.0, 1.5); },
                      {"distillation_loss", "alpha", "1.5"});
  expect_error<ShapeError>(
      [&] {
        F::distillation_loss(s, uniform({4, 6}, -1, 1), y, 2.0, 0.5);
      },
      {"distillation_loss", "[4, 5]", "[4, 6]"});
  expect_error<ShapeError>([&] { F::distillation_loss(s.reshape({20}), t.reshape({20}), y, 2.0, 0.5); },
                           {"distillation_loss", "[N, C]", "[20]"});
  expect_error<DTypeError>(
      [&] {
        F::distillation_loss(arange(20).reshape({4, 5}), t, y, 2.0, 0.5);
      },
      {"distillation_loss", "floating", "i64"});
  expect_error<IndexError>(
      [&] {
        F::distillation_loss(s, t, i64({0, 1, 2, 9}, {4}), 2.0, 0.5);
      },
      {"target 9"});
}

TEST(Losses, BadInputs) {
  const Tensor x = uniform({4, 5}, -1, 1);
  expect_error<IndexError>(
      [&] {
        F::cross_entropy(x, i64({0, 7, 1, 2}, {4}));
      },
      {"cross_entropy", "target 7", "5 classes", "[4, 5]"});
  expect_error<IndexError>([&] { F::cross_entropy(x, i64({0, -3, 1, 2}, {4})); }, {"target -3"});
  expect_error<DTypeError>([&] { F::cross_entropy(x, uniform({4}, 0, 1)); }, {"cross_entropy", "i64", "f32"});
  expect_error<ShapeError>(
      [&] {
        F::cross_entropy(x, i64({0, 1, 2}, {3}));
      },
      {"cross_entropy", "[4, 5]", "[4]", "[3]"});
  expect_error<ShapeError>([&] { F::cross_entropy(scalar_tensor(1.0), i64({0}, {})); },
                           {"cross_entropy", "0-d"});
  expect_error<Error>(
      [&] {
        F::cross_entropy(x, i64({0, 1, 2, 3}, {4}), Reduction::Mean, -100, 1.5);
      },
      {"label_smoothing", "1.5"});
  expect_error<DTypeError>(
      [&] {
        F::cross_entropy(arange(20).reshape({4, 5}), i64({0, 1, 2, 3}, {4}));
      },
      {"cross_entropy", "floating", "i64"});
  expect_error<IndexError>([&] { F::nll_loss(x, i64({0, 5, 1, 2}, {4})); }, {"nll_loss", "target 5"});
  expect_error<ShapeError>([&] { F::mse_loss(x, uniform({5, 4}, -1, 1)); }, {"mse_loss", "[4, 5]", "[5, 4]"});
  expect_error<DTypeError>([&] { F::l1_loss(x, arange(20).reshape({4, 5})); }, {"l1_loss", "target", "i64"});
  expect_error<ShapeError>([&] { F::kl_div(x, uniform({4}, -1, 1)); }, {"kl_div", "[4, 5]", "[4]"});
  expect_error<Error>([&] { F::mse_loss(x, x, Reduction::BatchMean); }, {"mse_loss", "batchmean"});
  expect_error<ShapeError>(
      [&] { F::binary_cross_entropy_with_logits(x, x, Reduction::Mean, uniform({3}, -1, 1)); },
      {"binary_cross_entropy_with_logits", "pos_weight", "[3]", "[5]"});
  expect_error<ShapeError>([&] { F::cross_entropy_rows(x.reshape({20}), i64({0}, {1})); },
                           {"cross_entropy", "[N, C]", "[20]"});
}

}  // namespace
}  // namespace frugal
