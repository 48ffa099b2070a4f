// The fused layer norm (frugal::layer_norm, behind F::layer_norm and nn::LayerNorm) against its composite
// (F::layer_norm_composite): outputs and gradients in f32 (tight) and f16/bf16 (dtype tolerance), with and
// without weight and bias, over one and two trailing dims, on non-contiguous inputs; finite differences in
// f64; gradients that do not depend on the thread count; bad inputs.
#include <cmath>

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

struct Case {
  Shape x_shape, normalized;
  bool weight, bias;
};
// Rows of 7 to 256 elements, 1 to 600 rows (the last: several chunks of the backward's partial sums).
const Case kCases[] = {
    {{4, 7, 32}, {32}, true, true},  {{5, 3, 4}, {3, 4}, true, true}, {{6, 16}, {16}, true, false},
    {{6, 16}, {16}, false, true},    {{2, 7}, {7}, false, false},     {{1, 9}, {9}, true, true},
    {{600, 256}, {256}, true, true},
};

std::string name(const Case& c) {
  std::ostringstream s;
  s << c.x_shape << " over " << c.normalized << (c.weight ? " weight" : "") << (c.bias ? " bias" : "");
  return s.str();
}

// Output and gradients (x, weight, bias) of F::layer_norm or the composite on leaves of dtype t; the
// upstream gradient is a fixed random tensor, so errors cannot cancel in a plain sum.
std::vector<Tensor> run(const Case& c, DType t, bool fused, Layout layout = Layout::Contiguous) {
  Tensor x = testing::leaf(c.x_shape, -2, 3, 21, layout).detach();
  if (layout != Layout::Contiguous) {  // keep the view non-contiguous in dtype t
    Tensor base = testing::leaf(c.x_shape, -2, 3, 21, layout);
    x = base.detach().to(t);
  } else {
    x = x.to(t);
  }
  x.requires_grad_();
  Tensor w, b;
  if (c.weight) w = uniform(c.normalized, 0.5, 1.5, t, 22).requires_grad_();
  if (c.bias) b = uniform(c.normalized, -1, 1, t, 23).requires_grad_();
  const Tensor y = fused ? F::layer_norm(x, c.normalized, w, b, 1e-5)
                         : F::layer_norm_composite(x, c.normalized, w, b, 1e-5);
  const Tensor dy = uniform(c.x_shape, -1, 1, t, 24);
  sum(mul(y, dy)).backward();
  return {y.detach(), x.grad(), w.defined() ? w.grad() : Tensor(), b.defined() ? b.grad() : Tensor()};
}

void expect_same(const std::vector<Tensor>& fused, const std::vector<Tensor>& ref, testing::Tol tol,
                 const std::string& what) {
  const char* names[] = {"y", "dx", "dweight", "dbias"};
  for (size_t i = 0; i < fused.size(); ++i) {
    ASSERT_EQ(fused[i].defined(), ref[i].defined()) << what << " " << names[i];
    if (!fused[i].defined()) continue;
    EXPECT_EQ(fused[i].dtype(), ref[i].dtype()) << what << " " << names[i];
    EXPECT_EQ(fused[i].shape(), ref[i].shape()) << what << " " << names[i];
    expect_close(fused[i], ref[i].to_vector<double>(), tol, what + " " + names[i]);
  }
}

TEST(LayerNorm, MatchesCompositeF32) {
  for (const Case& c : kCases)
    for (Layout layout : {Layout::Contiguous, Layout::Transposed})
      expect_same(run(c, DType::F32, true, layout), run(c, DType::F32, false, layout), {2e-5, 2e-5},
                  name(c) + " " + testing::layout_name(layout));
}

TEST(LayerNorm, MatchesCompositeHalfTypes) {
  // Both compute in f32 from the same rounded inputs; the results differ by the final rounding (and, for the
  // composite, the rounding of its f32 intermediate results to the dtype of weight-times-x products).
  for (DType t : {DType::BF16, DType::F16})
    for (const Case& c : kCases) {
      testing::Tol tol = testing::tol_for(t);
      tol.atol *= 4;  // sums over rows of bf16 gradients
      expect_same(run(c, t, true), run(c, t, false), tol, name(c) + " " + dtype_name(t));
    }
}

TEST(LayerNorm, MatchesNaiveF64) {
  // y = (x - mean) / sqrt(var + eps) * w + b from plain loops, f64 throughout.
  const Tensor x = uniform({3, 10}, -2, 3, DType::F64, 31), w = uniform({10}, 0.5, 1.5, DType::F64, 32),
               b = uniform({10}, -1, 1, DType::F64, 33);
  const auto xv = x.to_vector<double>(), wv = w.to_vector<double>(), bv = b.to_vector<double>();
  std::vector<double> ref;
  for (size_t r = 0; r < 3; ++r) {
    double m = 0, v = 0;
    for (size_t j = 0; j < 10; ++j) m += xv[r * 10 + j] / 10;
    for (size_t j = 0; j < 10; ++j) v += (xv[r * 10 + j] - m) * (xv[r * 10 + j] - m) / 10;
    for (size_t j = 0; j < 10; ++j) ref.push_back((xv[r * 10 + j] - m) / std::sqrt(v + 1e-5) * wv[j] + bv[j]);
  }
  expect_close(F::layer_norm(x, {10}, w, b), ref, {1e-12, 1e-12}, "layer_norm f64");
}

TEST(LayerNorm, Gradcheck) {
  for (Layout layout : testing::kLayouts) {
    const std::string l = testing::layout_name(layout);
    expect_grads_ok([](const std::vector<Tensor>& in) { return F::layer_norm(in[0], {5}, in[1], in[2]); },
                    {testing::leaf({3, 5}, -2, 2, 41, layout), testing::leaf({5}, 0.5, 1.5, 42),
                     testing::leaf({5}, -1, 1, 43)},
                    "layer_norm weight bias " + l);
    expect_grads_ok(
        [](const std::vector<Tensor>& in) {
          return F::layer_norm(in[0], {2, 3}, in[1]);
        },
        {testing::leaf({4, 2, 3}, -2, 2, 44, layout), testing::leaf({2, 3}, 0.5, 1.5, 45)},
        "layer_norm over two dims " + l);
    expect_grads_ok([](const std::vector<Tensor>& in) { return F::layer_norm(in[0], {6}); },
                    {testing::leaf({2, 6}, -2, 2, 46, layout)}, "layer_norm no affine " + l);
  }
  // Only the parameters require grad (no d x), and only the bias.
  const Tensor x = testing::leaf({3, 4}, -2, 2, 47).detach();
  expect_grads_ok([x](const std::vector<Tensor>& in) { return F::layer_norm(x, {4}, in[0], in[1]); },
                  {testing::leaf({4}, 0.5, 1.5, 48), testing::leaf({4}, -1, 1, 49)},
                  "layer_norm params only");
  const Tensor w = testing::leaf({4}, 0.5, 1.5, 50).detach();
  expect_grads_ok([x, w](const std::vector<Tensor>& in) { return F::layer_norm(x, {4}, w, in[0]); },
                  {testing::leaf({4}, -1, 1, 51)}, "layer_norm bias only");
}

TEST(LayerNorm, GradientsDoNotDependOnThreads) {
  const Case c{{600, 256}, {256}, true, true};
  const int before = num_threads();
  set_num_threads(1);
  const auto one = run(c, DType::F32, true);
  set_num_threads(std::max(2, before));
  const auto many = run(c, DType::F32, true);
  set_num_threads(before);
  expect_same(one, many, {0, 0}, "1 thread vs several");
}

// A row's statistics depend on its values alone, not on where it lies (Note [a row's statistics]): the rows
// of x and the same rows one element further along a buffer (another alignment) normalise bit for bit alike,
// for lengths around the vector widths.
TEST(LayerNorm, ResultsDoNotDependOnWhereTheRowsLie) {
  for (DType t : {DType::F32, DType::F64})
    for (int64_t cols : {5, 16, 37, 64, 130}) {
      const Tensor x = uniform({4, cols}, -2, 3, t, 31);
      Tensor buffer = zeros({4 * cols + 1}, t);
      Tensor shifted = buffer.narrow(0, 1, 4 * cols).view({4, cols});
      shifted.copy_(x);
      const ops::LayerNormResult a = ops::layer_norm(x, {cols});
      const ops::LayerNormResult b = ops::layer_norm(shifted, {cols});
      const std::string what = std::string(dtype_name(t)) + " cols " + std::to_string(cols);
      EXPECT_EQ(a.mean.to_vector<double>(), b.mean.to_vector<double>()) << what;
      EXPECT_EQ(a.rstd.to_vector<double>(), b.rstd.to_vector<double>()) << what;
      EXPECT_EQ(a.y.to_vector<double>(), b.y.to_vector<double>()) << what;
    }
}

TEST(LayerNorm, MixedParameterDtypes) {
  // bf16 activations with f32 parameters (as under autocast): parameter gradients come back in f32.
  const Tensor x = uniform({4, 8}, -2, 2, DType::BF16, 61).requires_grad_();
  const Tensor w = uniform({8}, 0.5, 1.5, DType::F32, 62).requires_grad_();
  const Tensor b = uniform({8}, -1, 1, DType::F32, 63).requires_grad_();
  const Tensor y = F::layer_norm(x, {8}, w, b);
  EXPECT_EQ(y.dtype(), DType::BF16);
  sum(y).backward();
  EXPECT_EQ(x.grad().dtype(), DType::BF16);
  EXPECT_EQ(w.grad().dtype(), DType::F32);
  EXPECT_EQ(b.grad().dtype(), DType::F32);
  expect_close(b.grad(), std::vector<double>(8, 4.0), {0, 0}, "dbias");
}

TEST(LayerNorm, EmptyRows) {
  const Tensor x = zeros({0, 4}).requires_grad_();
  const Tensor w = ones({4}).requires_grad_();
  const Tensor y = F::layer_norm(x, {4}, w);
  EXPECT_EQ(y.shape(), (Shape{0, 4}));
  sum(y).backward();
  EXPECT_EQ(x.grad().shape(), (Shape{0, 4}));
  expect_close(w.grad(), std::vector<double>(4, 0.0), {0, 0}, "dweight of no rows");
}

TEST(LayerNorm, BadInputs) {
  const Tensor x = uniform({2, 5}, -1, 1);
  expect_error<ShapeError>([&] { F::layer_norm(x, {4}); }, {"layer_norm", "[2, 5]", "[4]"});
  expect_error<ShapeError>([&] { F::layer_norm(x, {2, 5, 1}); }, {"layer_norm", "[2, 5]", "[2, 5, 1]"});
  expect_error<ShapeError>([&] { F::layer_norm(x, {}); }, {"layer_norm", "normalized_shape"});
  expect_error<ShapeError>([&] { F::layer_norm(x, {5}, ones({4})); }, {"layer_norm", "weight", "[4]", "[5]"});
  expect_error<ShapeError>(
      [&] {
        F::layer_norm(x, {5}, {}, ones({2, 5}));
      },
      {"layer_norm", "bias", "[2, 5]"});
  expect_error<DTypeError>([&] { F::layer_norm(x.to(DType::I64), {5}); }, {"layer_norm", "floating", "i64"});
  expect_error<DTypeError>([&] { F::layer_norm(x, {5}, ones({5}, DType::I32)); },
                           {"layer_norm", "weight", "i32"});
  expect_error<Error>([&] { F::layer_norm(Tensor(), {5}); }, {"layer_norm", "undefined"});
  // A failed call leaves its inputs untouched.
  const auto before = x.to_vector<double>();
  expect_error<ShapeError>([&] { F::layer_norm(x, {3}); }, {"layer_norm"});
  EXPECT_EQ(x.to_vector<double>(), before);
}

}  // namespace
}  // namespace frugal
