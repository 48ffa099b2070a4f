// The fused attention probabilities (nn::functional::attention_scores_softmax) against a naive loop and the
// composite (mul, where, softmax): values, masked zeros, every dtype, non-contiguous scores, gradients by
// finite differences in f64, and bad inputs.
#include <cmath>

#include "nn/attention.h"
#include "tests/autograd/gradcheck_helpers.h"

namespace frugal::testing {
namespace {

namespace F = nn::functional;

// Naive f64 reference over [rows, T] rows of a contiguous [..., T, T] tensor.
std::vector<double> naive(const Tensor& scores, double scale, bool causal) {
  const auto x = scores.contiguous().to_vector<double>();
  const int64_t t = scores.size(-1), rows = scores.numel() / t;
  std::vector<double> y(x.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = causal ? r % t + 1 : t;
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < n; ++j) m = std::max(m, scale * x[size_t(r * t + j)]);
    for (int64_t j = 0; j < n; ++j) s += std::exp(scale * x[size_t(r * t + j)] - m);
    for (int64_t j = 0; j < n; ++j) y[size_t(r * t + j)] = std::exp(scale * x[size_t(r * t + j)] - m) / s;
  }
  return y;
}

struct Case {
  bool causal;
  double scale;
};
constexpr Case kCases[] = {{true, 0.37}, {false, 0.37}, {true, 1.0}, {false, -0.5}};

std::string name(const Case& c) {
  return std::string(c.causal ? "causal" : "full") + " scale " + std::to_string(c.scale);
}

TEST(AttentionScoresSoftmax, MatchesNaiveAndComposite) {
  for (const Case& c : kCases) {
    for (DType t : {DType::F64, DType::F32}) {
      const Tensor x = uniform({2, 3, 7, 7}, -4, 4, t, 3);
      const Tensor fused = F::attention_scores_softmax(x, c.scale, c.causal);
      const Tensor composite = F::attention_scores_softmax_composite(x, c.scale, c.causal);
      EXPECT_EQ(fused.shape(), x.shape());
      EXPECT_EQ(fused.dtype(), t);
      expect_close(fused, naive(x, c.scale, c.causal), tol_for(t), "fused vs naive, " + name(c));
      expect_close(fused, composite.to_vector<double>(), tol_for(t), "fused vs composite, " + name(c));
    }
  }
}

TEST(AttentionScoresSoftmax, MaskedEntriesAreExactlyZero) {
  const Tensor x = uniform({4, 9, 9}, -3, 3, DType::F32, 5);
  const auto y = F::attention_scores_softmax(x, 0.5, true).to_vector<double>();
  for (int64_t r = 0; r < 4 * 9; ++r)
    for (int64_t j = r % 9 + 1; j < 9; ++j)
      ASSERT_EQ(y[size_t(r * 9 + j)], 0.0) << "row " << r << " col " << j;
}

TEST(AttentionScoresSoftmax, LowPrecisionMatchesF32) {
  for (const Case& c : kCases) {
    const Tensor x = uniform({2, 2, 16, 16}, -3, 3, DType::F32, 7);
    for (DType t : {DType::F16, DType::BF16}) {
      const Tensor xt = x.to(t);
      const Tensor y = F::attention_scores_softmax(xt, c.scale, c.causal);
      EXPECT_EQ(y.dtype(), t);
      // Reference from the rounded inputs, so only the computation's precision is compared.
      expect_close(y, naive(xt.to(DType::F64), c.scale, c.causal), tol_for(t),
                   std::string(dtype_name(t)) + " " + name(c));
    }
  }
}

TEST(AttentionScoresSoftmax, NonContiguousScores) {
  for (const Case& c : kCases) {
    const Tensor base = uniform({2, 6, 6, 3}, -2, 2, DType::F32, 11);
    const Tensor x = base.permute({0, 3, 1, 2});  // [2, 3, 6, 6], strided
    ASSERT_FALSE(x.is_contiguous());
    expect_close(F::attention_scores_softmax(x, c.scale, c.causal), naive(x, c.scale, c.causal),
                 tol_for(DType::F32), "permuted scores, " + name(c));
  }
}

TEST(AttentionScoresSoftmax, GradientsMatchComposite) {
  for (const Case& c : kCases) {
    const Tensor x = uniform({2, 3, 8, 8}, -3, 3, DType::F32, 13).requires_grad_();
    const auto fused = grads_of(
        [&](const std::vector<Tensor>& in) { return F::attention_scores_softmax(in[0], c.scale, c.causal); },
        {x}, DType::F32);
    const auto composite = grads_of(
        [&](const std::vector<Tensor>& in) {
          return F::attention_scores_softmax_composite(in[0], c.scale, c.causal);
        },
        {x}, DType::F32);
    ASSERT_TRUE(fused[0].defined());
    EXPECT_EQ(fused[0].shape(), x.shape());
    expect_close(fused[0], composite[0].to_vector<double>(), tol_for(DType::F32), "d scores, " + name(c));
  }
}

TEST(AttentionScoresSoftmax, GradcheckF64) {
  for (const Case& c : kCases) {
    for (Layout layout : kLayouts) {
      const std::string what = name(c) + ", " + layout_name(layout);
      const Tensor x = leaf({2, 2, 5, 5}, -2, 2, 17, layout);
      expect_grads_ok(
          [&](const std::vector<Tensor>& in) {
            return F::attention_scores_softmax(in[0], c.scale, c.causal);
          },
          {x}, "fused, " + what);
      expect_grads_ok(
          [&](const std::vector<Tensor>& in) {
            return F::attention_scores_softmax_composite(in[0], c.scale, c.causal);
          },
          {x}, "composite, " + what);
    }
  }
}

TEST(AttentionScoresSoftmax, LowPrecisionGradients) {
  const Tensor x = leaf({2, 6, 6}, -2, 2, 19);
  const GradFn fn = [](const std::vector<Tensor>& in) {
    return F::attention_scores_softmax(in[0], 0.7, true);
  };
  expect_grads_match_f64(fn, {x}, DType::F32, tol_for(DType::F32), "fused");
  expect_grads_match_f64(fn, {x}, DType::BF16, tol_for(DType::BF16), "fused");
  expect_grads_match_f64(fn, {x}, DType::F16, tol_for(DType::F16), "fused");
}

TEST(AttentionScoresSoftmax, BadInputs) {
  expect_error<ShapeError>(
      [] {
        F::attention_scores_softmax(randn({2, 4, 5}), 1.0, true);
      },
      {"attention_scores_softmax", "[..., T, T]", "[2, 4, 5]"});
  expect_error<ShapeError>([] { F::attention_scores_softmax(randn({5}), 1.0, false); },
                           {"attention_scores_softmax", "[5]"});
  expect_error<DTypeError>(
      [] {
        F::attention_scores_softmax(zeros({3, 3}, DType::I64), 1.0, true);
      },
      {"attention_scores_softmax", "floating", "i64"});
  expect_error<Error>([] { F::attention_scores_softmax(Tensor(), 1.0, true); },
                      {"attention_scores_softmax", "undefined"});
  expect_error<ShapeError>(
      [] {
        F::attention_scores_softmax_composite(randn({3, 4}), 1.0, true);
      },
      {"attention_scores_softmax_composite", "[3, 4]"});
}

TEST(AttentionScoresSoftmax, EmptyBatch) {
  const Tensor y = F::attention_scores_softmax(randn({0, 4, 4}), 1.0, true);
  EXPECT_EQ(y.shape(), (Shape{0, 4, 4}));
}

}  // namespace
}  // namespace frugal::testing
