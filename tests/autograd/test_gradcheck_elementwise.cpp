// Gradients of the elementwise ops (autograd/grad_elementwise.cpp) by finite differences in f64: every unary
// and binary op, the Scalar forms and operators, broadcasting, where and cast, on contiguous and
// non-contiguous leaves; the conventions at kinks; and the dtype of f32 / bf16 gradients.
#include "tests/autograd/gradcheck_helpers.h"

namespace frugal {
namespace {

using testing::expect_grads_match_f64;
using testing::expect_grads_ok;
using testing::grads_of;
using testing::kLayouts;
using testing::Layout;
using testing::layout_name;
using testing::leaf;
using testing::signed_leaf;
using testing::tol_for;
using testing::uniform;

using Unary = std::function<Tensor(const Tensor&)>;
using Binary = std::function<Tensor(const Tensor&, const Tensor&)>;

// An op and the domain its input is drawn from: [lo, hi), or magnitudes in [0.1, 2) with random signs
// (kinked ops, kept away from the kink).
struct UnaryCase {
  const char* name;
  Unary f;
  double lo, hi;
  bool signed_input = false;
};

std::vector<UnaryCase> unary_cases() {
  return {
      {"neg", [](const Tensor& x) { return neg(x); }, -2, 2},
      {"operator-", [](const Tensor& x) { return -x; }, -2, 2},
      {"abs", [](const Tensor& x) { return abs(x); }, 0, 0, true},
      {"exp", [](const Tensor& x) { return exp(x); }, -2, 2},
      {"log", [](const Tensor& x) { return log(x); }, 0.2, 3},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, 0.2, 3},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, 0.2, 3},
      {"relu", [](const Tensor& x) { return relu(x); }, 0, 0, true},
      {"gelu", [](const Tensor& x) { return gelu(x); }, -3, 3},
      {"gelu_tanh", [](const Tensor& x) { return gelu_tanh(x); }, -3, 3},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, -3, 3},
      {"tanh", [](const Tensor& x) { return tanh(x); }, -3, 3},
      {"silu", [](const Tensor& x) { return silu(x); }, -3, 3},
      {"erf", [](const Tensor& x) { return erf(x); }, -2, 2},
      {"sin", [](const Tensor& x) { return sin(x); }, -3, 3},
      {"cos", [](const Tensor& x) { return cos(x); }, -3, 3},
      {"softplus", [](const Tensor& x) { return softplus(x); }, -3, 3},
      // beta x on both sides of the threshold (x itself above it, where the gradient is 1).
      {"softplus beta threshold", [](const Tensor& x) { return softplus(x, 2, 1); }, 0, 0, true},
      {"x.softplus", [](const Tensor& x) { return x.softplus(0.5); }, -3, 3},
      {"x.sin", [](const Tensor& x) { return x.sin(); }, -3, 3},
      // Bounds inside the range of the values, so both the passing and the blocked parts are checked.
      {"clamp", [](const Tensor& x) { return clamp(x, -0.55, 0.75); }, 0, 0, true},
      {"clamp_min", [](const Tensor& x) { return clamp_min(x, 0.35); }, 0, 0, true},
      {"clamp_max", [](const Tensor& x) { return clamp_max(x, -0.45); }, 0, 0, true},
  };
}

Tensor unary_input(const UnaryCase& c, const Shape& shape, uint64_t seed, Layout layout) {
  return c.signed_input ? signed_leaf(shape, seed, layout) : leaf(shape, c.lo, c.hi, seed, layout);
}

TEST(GradcheckUnary, EveryOpEveryLayout) {
  for (const UnaryCase& c : unary_cases())
    for (Layout layout : kLayouts) {
      const Tensor x = unary_input(c, {3, 4}, 11, layout);
      expect_grads_ok([&](const std::vector<Tensor>& in) { return c.f(in[0]); }, {x},
                      std::string(c.name) + " " + layout_name(layout));
    }
}

TEST(GradcheckUnary, ZeroDimAndThreeDimInputs) {
  for (const UnaryCase& c : unary_cases())
    for (const Shape& shape : {Shape{}, Shape{2, 3, 2}}) {
      const Tensor x = unary_input(c, shape, 12, Layout::Contiguous);
      expect_grads_ok([&](const std::vector<Tensor>& in) { return c.f(in[0]); }, {x},
                      std::string(c.name) + " " + shape.str());
    }
}

// An op and the domains of its two inputs.
struct BinaryCase {
  const char* name;
  Binary f;
  double a_lo, a_hi, b_lo, b_hi;
};

std::vector<BinaryCase> binary_cases() {
  return {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, -2, 2, -2, 2},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, -2, 2, -2, 2},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, -2, 2, -2, 2},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, -2, 2, 0.5, 2},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, 0.5, 2, -2, 2},
      // Independent draws: ties (where the rule splits the gradient) have probability 0.
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, -2, 2, -2, 2},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, -2, 2, -2, 2},
      {"operator+", [](const Tensor& a, const Tensor& b) { return a + b; }, -2, 2, -2, 2},
      {"operator-", [](const Tensor& a, const Tensor& b) { return a - b; }, -2, 2, -2, 2},
      {"operator*", [](const Tensor& a, const Tensor& b) { return a * b; }, -2, 2, -2, 2},
      {"operator/", [](const Tensor& a, const Tensor& b) { return a / b; }, -2, 2, 0.5, 2},
  };
}

TEST(GradcheckBinary, EveryOpEveryLayout) {
  for (const BinaryCase& c : binary_cases())
    for (Layout layout : kLayouts) {
      const Tensor a = leaf({3, 4}, c.a_lo, c.a_hi, 21, layout);
      const Tensor b = leaf({3, 4}, c.b_lo, c.b_hi, 22, layout);
      expect_grads_ok([&](const std::vector<Tensor>& in) { return c.f(in[0], in[1]); }, {a, b},
                      std::string(c.name) + " " + layout_name(layout));
    }
}

TEST(GradcheckBinary, DivByNegativeDenominators) {
  for (Layout layout : kLayouts) {
    const Tensor a = leaf({3, 4}, -2, 2, 23, layout);
    const Tensor b = signed_leaf({3, 4}, 24, layout, 0.5, 2);
    expect_grads_ok([](const std::vector<Tensor>& in) { return div(in[0], in[1]); }, {a, b},
                    std::string("div ") + layout_name(layout));
  }
}

// Only one input requiring grad: the other gets none and the first's is still right.
TEST(GradcheckBinary, OneInputRequiresGrad) {
  for (const BinaryCase& c : binary_cases()) {
    const Tensor a = leaf({3, 4}, c.a_lo, c.a_hi, 25);
    const Tensor b = leaf({3, 4}, c.b_lo, c.b_hi, 26);
    const testing::GradFn fn = [&](const std::vector<Tensor>& in) { return c.f(in[0], in[1]); };
    expect_grads_ok(fn, {a, b.detach()}, std::string(c.name) + " (a only)");
    expect_grads_ok(fn, {a.detach(), b}, std::string(c.name) + " (b only)");
    const std::vector<Tensor> g = grads_of(fn, {a, b.detach()});
    EXPECT_TRUE(g[0].defined()) << c.name;
    EXPECT_FALSE(g[1].defined()) << c.name;
  }
}

// Each input's gradient is summed back to its own shape, whichever side broadcasts.
TEST(GradcheckBinary, BroadcastingGivesEachInputItsShape) {
  const std::pair<Shape, Shape> shapes[] = {
      {{3, 4}, {4}}, {{4}, {3, 4}}, {{3, 1}, {1, 4}}, {{2, 3, 4}, {3, 1}},
      {{}, {5}},     {{5}, {}},     {{4, 1}, {4, 4}},
  };
  for (const BinaryCase& c : binary_cases())
    for (const auto& [sa, sb] : shapes)
      for (Layout layout : kLayouts) {
        const std::string what =
            std::string(c.name) + " " + sa.str() + " with " + sb.str() + " " + layout_name(layout);
        const Tensor a = leaf(sa, c.a_lo, c.a_hi, 31, layout);
        const Tensor b = leaf(sb, c.b_lo, c.b_hi, 32, layout);
        const testing::GradFn fn = [&](const std::vector<Tensor>& in) { return c.f(in[0], in[1]); };
        expect_grads_ok(fn, {a, b}, what);
        const std::vector<Tensor> g = grads_of(fn, {a, b});
        ASSERT_TRUE(g[0].defined() && g[1].defined()) << what;
        EXPECT_EQ(g[0].shape(), sa) << what;
        EXPECT_EQ(g[1].shape(), sb) << what;
        EXPECT_EQ(g[0].dtype(), DType::F64) << what;
        EXPECT_EQ(g[1].dtype(), DType::F64) << what;
      }
}

// The Scalar forms, with the Scalar on either side of an operator.
TEST(GradcheckBinary, ScalarOperands) {
  struct Case {
    const char* name;
    Unary f;
    double lo, hi;
    bool signed_input = false;
  };
  const Case cases[] = {
      {"add(x, s)", [](const Tensor& x) { return add(x, 2.5); }, -2, 2},
      {"sub(x, s)", [](const Tensor& x) { return sub(x, 1.5); }, -2, 2},
      {"mul(x, s)", [](const Tensor& x) { return mul(x, -1.5); }, -2, 2},
      {"div(x, s)", [](const Tensor& x) { return div(x, 0.7); }, -2, 2},
      {"pow(x, 3)", [](const Tensor& x) { return pow(x, 3.0); }, -2, 2},
      {"pow(x, 2.5)", [](const Tensor& x) { return pow(x, 2.5); }, 0.2, 2},
      {"pow(x, -1.5)", [](const Tensor& x) { return pow(x, -1.5); }, 0.5, 2},
      {"pow(x, 0)", [](const Tensor& x) { return pow(x, 0.0); }, 0.2, 2},
      {"maximum(x, s)", [](const Tensor& x) { return maximum(x, 0.3); }, 0, 0, true},
      {"minimum(x, s)", [](const Tensor& x) { return minimum(x, -0.2); }, 0, 0, true},
      {"x + s", [](const Tensor& x) { return x + 2.0; }, -2, 2},
      {"x - s", [](const Tensor& x) { return x - 2.0; }, -2, 2},
      {"x * s", [](const Tensor& x) { return x * 3.0; }, -2, 2},
      {"x / s", [](const Tensor& x) { return x / 4.0; }, -2, 2},
      {"s + x", [](const Tensor& x) { return 2.0 + x; }, -2, 2},
      {"s - x", [](const Tensor& x) { return 2.0 - x; }, -2, 2},
      {"s * x", [](const Tensor& x) { return 3.0 * x; }, -2, 2},
      {"s / x", [](const Tensor& x) { return 4.0 / x; }, 0, 0, true},
  };
  for (const Case& c : cases)
    for (Layout layout : kLayouts) {
      const Tensor x =
          c.signed_input ? signed_leaf({3, 4}, 41, layout, 0.5, 2) : leaf({3, 4}, c.lo, c.hi, 41, layout);
      expect_grads_ok([&](const std::vector<Tensor>& in) { return c.f(in[0]); }, {x},
                      std::string(c.name) + " " + layout_name(layout));
    }
}

// Where the derivative is undefined, the value PyTorch uses.
TEST(GradcheckBinary, ConventionsAtKinksMatchPyTorch) {
  const auto grad_of = [](const Unary& f, std::vector<double> x) {
    Tensor t = tensor<double>(x).requires_grad_();
    sum(f(t)).backward();
    return t.grad().to_vector<double>();
  };
  using V = std::vector<double>;
  EXPECT_EQ(grad_of([](const Tensor& x) { return abs(x); }, {-1, 0, 2}), (V{-1, 0, 1}));
  EXPECT_EQ(grad_of([](const Tensor& x) { return relu(x); }, {-1, 0, 2}), (V{0, 0, 1}));
  // clamp passes the gradient at its bounds (min <= x <= max).
  EXPECT_EQ(grad_of([](const Tensor& x) { return clamp(x, -1, 1); }, {-2, -1, 0, 1, 2}), (V{0, 1, 1, 1, 0}));
  EXPECT_EQ(grad_of([](const Tensor& x) { return clamp_min(x, 0.5); }, {0, 0.5, 1}), (V{0, 1, 1}));
  EXPECT_EQ(grad_of([](const Tensor& x) { return clamp_max(x, 0.5); }, {0, 0.5, 1}), (V{1, 1, 0}));
  // Ties in maximum / minimum split the gradient evenly.
  EXPECT_EQ(grad_of([](const Tensor& x) { return maximum(x, 1.0); }, {0, 1, 2}), (V{0, 0.5, 1}));
  EXPECT_EQ(grad_of([](const Tensor& x) { return minimum(x, 1.0); }, {0, 1, 2}), (V{1, 0.5, 0}));
  // x^0 is constant: a zero gradient, also at x = 0 (not 0 * 0^-1 = nan).
  EXPECT_EQ(grad_of([](const Tensor& x) { return pow(x, 0.0); }, {0, 1, -2}), (V{0, 0, 0}));
  EXPECT_EQ(grad_of([](const Tensor& x) { return pow(x, 2.0); }, {0, 3}), (V{0, 6}));
  // d/db a^b = a^b log(a) is taken as 0 at a = 0.
  Tensor a = tensor<double>({0, 2}).requires_grad_();
  Tensor b = tensor<double>({2, 3}).requires_grad_();
  sum(pow(a, b)).backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (V{0, 12}));
  testing::expect_close(b.grad(), {0, 8 * std::log(2.0)}, tol_for(DType::F64), "d pow / d b");
}

// At a tie between two inputs the central difference is the average of the one-sided slopes, 1/2: the rule's
// even split is what gradcheck measures.
TEST(GradcheckBinary, MaximumMinimumTiesSplitEvenly) {
  const Tensor a = leaf({3, 4}, -2, 2, 51);
  const Tensor b = a.detach().clone().requires_grad_();
  for (const BinaryCase& c : binary_cases()) {
    if (std::string(c.name) != "maximum" && std::string(c.name) != "minimum") continue;
    expect_grads_ok([&](const std::vector<Tensor>& in) { return c.f(in[0], in[1]); }, {a, b}, c.name);
    a.zero_grad();
    b.zero_grad();
    sum(c.f(a, b)).backward();
    EXPECT_EQ(a.grad().to_vector<double>(), std::vector<double>(12, 0.5)) << c.name;
    EXPECT_EQ(b.grad().to_vector<double>(), std::vector<double>(12, 0.5)) << c.name;
  }
}

TEST(GradcheckWhere, BothBranchesWithBroadcasting) {
  struct Case {
    Shape cond, a, b;
  };
  const Case cases[] = {
      {{3, 4}, {3, 4}, {3, 4}}, {{3, 1}, {4}, {3, 4}}, {{3, 4}, {}, {1, 4}}, {{4}, {3, 4}, {3, 1}}};
  for (const Case& c : cases)
    for (Layout layout : kLayouts) {
      const std::string what =
          "where " + c.cond.str() + " " + c.a.str() + " " + c.b.str() + " " + layout_name(layout);
      const Tensor cond = gt(uniform(c.cond, -1, 1, DType::F64, 61), 0.0);
      const Tensor a = leaf(c.a, -2, 2, 62, layout);
      const Tensor b = leaf(c.b, -2, 2, 63, layout);
      const testing::GradFn fn = [&](const std::vector<Tensor>& in) { return where(cond, in[0], in[1]); };
      expect_grads_ok(fn, {a, b}, what);
      const std::vector<Tensor> g = grads_of(fn, {a, b});
      EXPECT_EQ(g[0].shape(), c.a) << what;
      EXPECT_EQ(g[1].shape(), c.b) << what;
    }
  // The gradient goes to the branch each element was taken from, and nowhere else.
  Tensor a = tensor<double>({1, 2, 3}).requires_grad_();
  Tensor b = tensor<double>({4, 5, 6}).requires_grad_();
  sum(where(tensor<bool>({true, false, true}), a, b)).backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{1, 0, 1}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{0, 1, 0}));
}

TEST(GradcheckCast, FloatingCastsPassTheGradientBack) {
  // f64 -> f64 is a copy whose gradient is the identity.
  for (Layout layout : kLayouts)
    expect_grads_ok([](const std::vector<Tensor>& in) { return cast(in[0], DType::F64); },
                    {leaf({3, 4}, -2, 2, 71, layout)}, std::string("cast f64 ") + layout_name(layout));
  expect_grads_ok([](const std::vector<Tensor>& in) { return in[0].to(DType::F64) * 2.0; },
                  {leaf({3, 4}, -2, 2, 72)}, "to(f64)");

  // Through f32 and back the gradient is w rounded to f32: finite differences would only measure the
  // rounding, so compare with w directly, and check the gradient's dtype and shape.
  const Tensor x = leaf({3, 4}, -2, 2, 73, Layout::Transposed);
  const Tensor w = uniform({3, 4}, -1, 1, DType::F64, 74);
  sum(mul(cast(cast(x, DType::F32), DType::F64), w)).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), DType::F64);
  EXPECT_EQ(x.grad().shape(), x.shape());
  testing::expect_close(x.grad(), w.to_vector<double>(), {0, 1e-7}, "cast f64 -> f32 -> f64");

  // A low-precision leaf gets a gradient of its own dtype.
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    Tensor y = uniform({3, 4}, -2, 2, t, 75).requires_grad_();
    sum(mul(cast(y, DType::F64), w)).backward();
    ASSERT_TRUE(y.grad().defined()) << dtype_name(t);
    EXPECT_EQ(y.grad().dtype(), t);
    EXPECT_EQ(y.grad().shape(), y.shape());
    testing::expect_close(y.grad(), w.to(t).to_vector<double>(), tol_for(DType::F64), dtype_name(t));
  }
}

TEST(GradcheckCast, IntegerAndBoolResultsCarryNoGradient) {
  const Tensor x = leaf({3, 4}, -2, 2, 76);
  EXPECT_FALSE(cast(x, DType::I64).requires_grad());
  EXPECT_FALSE(cast(x, DType::Bool).requires_grad());
  EXPECT_TRUE(cast(x, DType::F32).requires_grad());
}

// Gradients of f32 and bf16 leaves: their own dtype and shape, and the f64 values within the dtype's
// tolerance (a chain of a few roundings: bf16 is allowed four ulps, twice tol_for's).
TEST(GradcheckDTypes, LowPrecisionGradientsMatchF64) {
  struct Case {
    const char* name;
    testing::GradFn f;
    std::vector<Tensor> inputs;
  };
  const Case cases[] = {
      {"exp", [](const std::vector<Tensor>& in) { return exp(in[0]); }, {leaf({3, 4}, -1, 1, 81)}},
      {"tanh", [](const std::vector<Tensor>& in) { return tanh(in[0]); }, {leaf({3, 4}, -2, 2, 82)}},
      {"gelu", [](const std::vector<Tensor>& in) { return gelu(in[0]); }, {leaf({3, 4}, -2, 2, 83)}},
      {"log", [](const std::vector<Tensor>& in) { return log(in[0]); }, {leaf({3, 4}, 0.5, 2, 84)}},
      {"relu", [](const std::vector<Tensor>& in) { return relu(in[0]); }, {signed_leaf({3, 4}, 85)}},
      {"mul broadcast",
       [](const std::vector<Tensor>& in) { return mul(in[0], in[1]); },
       {leaf({3, 4}, -2, 2, 86), leaf({4}, -2, 2, 87)}},
      {"div broadcast",
       [](const std::vector<Tensor>& in) { return div(in[0], in[1]); },
       {leaf({3, 1}, -2, 2, 88), leaf({1, 4}, 0.5, 2, 89)}},
      {"where",
       [](const std::vector<Tensor>& in) { return where(gt(in[0], 0.0), in[0], in[1] * 2.0); },
       {signed_leaf({3, 4}, 90), leaf({3, 4}, -1, 1, 91)}},
  };
  for (const Case& c : cases) {
    expect_grads_match_f64(c.f, c.inputs, DType::F32, tol_for(DType::F32), c.name);
    const testing::Tol bf16 = tol_for(DType::BF16);
    expect_grads_match_f64(c.f, c.inputs, DType::BF16, {2 * bf16.atol, 2 * bf16.rtol}, c.name);
  }
}

// Mixed dtypes promote in the forward; each gradient goes back in its own input's dtype.
TEST(GradcheckDTypes, PromotedInputsGetTheirOwnDTypes) {
  Tensor a = uniform({3, 4}, -1, 1, DType::BF16, 92).requires_grad_();
  Tensor b = uniform({4}, -1, 1, DType::F32, 93).requires_grad_();
  const Tensor y = mul(a, b);
  ASSERT_EQ(y.dtype(), DType::F32);
  sum(y).backward();
  EXPECT_EQ(a.grad().dtype(), DType::BF16);
  EXPECT_EQ(b.grad().dtype(), DType::F32);
  EXPECT_EQ(b.grad().shape(), Shape{4});
  testing::expect_close(b.grad(), sum(a.detach().to(DType::F64), {0}).to_vector<double>(),
                        tol_for(DType::F32), "d (a * b) / d b");
}

// Scalar-first arithmetic: the gradient reaches the tensor operand.
TEST(GradcheckBinary, ScalarFirstForms) {
  const Tensor x = leaf({3, 4}, 0.5, 2, 41, Layout::Contiguous);
  const std::pair<const char*, Unary> cases[] = {
      {"div(2, x)", [](const Tensor& t) { return div(2.0, t); }},
      {"sub(1, x)", [](const Tensor& t) { return sub(1.0, t); }},
      {"pow(2, x)", [](const Tensor& t) { return pow(2.0, t); }},
      {"add(1, x)", [](const Tensor& t) { return add(1.0, t); }},
      {"mul(2, x)", [](const Tensor& t) { return mul(2.0, t); }},
      {"x.pow(3)", [](const Tensor& t) { return t.pow(3); }},
      {"x.div(y)", [](const Tensor& t) { return t.div(t.exp()); }},
  };
  for (const auto& c : cases)  // not a structured binding: clang 14 cannot capture one in a lambda
    expect_grads_ok([&](const std::vector<Tensor>& in) { return c.second(in[0]); }, {x}, c.first);
}

// The methods of the non-elementwise ops record as their free functions.
TEST(GradcheckMethods, ReductionsAndSoftmax) {
  const Tensor x = leaf({3, 4}, -2, 2, 42, Layout::Contiguous);
  const std::pair<const char*, Unary> cases[] = {
      {"x.softmax(1)", [](const Tensor& t) { return t.softmax(1); }},
      {"x.log_softmax(0)", [](const Tensor& t) { return t.log_softmax(0); }},
      {"x.max()", [](const Tensor& t) { return t.max(); }},
      {"x.min({1})", [](const Tensor& t) { return t.min({1}); }},
      {"x.var({1})", [](const Tensor& t) { return t.var({1}); }},
      {"x.abs().sqrt()", [](const Tensor& t) { return t.abs().sqrt(); }},
  };
  for (const auto& c : cases)  // not a structured binding: clang 14 cannot capture one in a lambda
    expect_grads_ok([&](const std::vector<Tensor>& in) { return c.second(in[0]); }, {x}, c.first);
}

}  // namespace
}  // namespace frugal
