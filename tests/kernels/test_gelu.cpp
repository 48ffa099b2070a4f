// GELU (erf form and tanh approximation): the fused forward and one-pass backward against the composite forms
// built from erf / tanh, mul and add (whose gradients autograd derives) and against the derivative written
// out in f64; every float dtype, contiguous and strided, large enough for several threads; finite
// differences in f64; bad inputs of the backward ops.
#include <cmath>

#include "tests/autograd/gradcheck_helpers.h"

namespace frugal {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::Layout;
using testing::tol_for;

constexpr double kK = 0.79788456080286535588, kC = 0.044715;  // sqrt(2 / pi), the cubic's coefficient

Tensor gelu_composite(const Tensor& x) { return mul(mul(x, 0.5), add(erf(mul(x, M_SQRT1_2)), 1.0)); }
Tensor gelu_tanh_composite(const Tensor& x) {
  return mul(mul(x, 0.5), add(tanh(mul(add(x, mul(mul(mul(x, x), x), kC)), kK)), 1.0));
}

double d_gelu(double x) {
  return 0.5 * (1 + std::erf(x * M_SQRT1_2)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}
double d_gelu_tanh(double x) {
  const double t = std::tanh(kK * (x + kC * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kK * (1 + 3 * kC * x * x);
}

struct Form {
  const char* name;
  Tensor (*fused)(const Tensor&);
  Tensor (*composite)(const Tensor&);
  double (*derivative)(double);
};
const Form kForms[] = {{"gelu", gelu, gelu_composite, d_gelu},
                       {"gelu_tanh", gelu_tanh, gelu_tanh_composite, d_gelu_tanh}};

// y and dx of fn on x (of dtype t, laid out as `layout`) for a fixed random upstream gradient.
std::pair<Tensor, Tensor> run(Tensor (*fn)(const Tensor&), const Shape& shape, DType t,
                              Layout layout = Layout::Contiguous) {
  Tensor x = testing::leaf(shape, -6, 6, 71, layout).detach();
  x = layout == Layout::Contiguous ? x.to(t) : testing::leaf(shape, -6, 6, 71, layout).detach().to(t);
  x.requires_grad_();
  const Tensor y = fn(x);
  y.backward(testing::uniform(shape, -1, 1, t, 72));
  return {y.detach(), x.grad()};
}

TEST(Gelu, MatchesCompositeEveryDtype) {
  // 2 x 40000 elements: several threads and many buffered chunks.
  const Shape shape{2, 40000};
  for (const Form& f : kForms)
    for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
      const auto [y, dx] = run(f.fused, shape, t);
      const auto [y_ref, dx_ref] = run(f.composite, shape, t);
      const std::string what = std::string(f.name) + " " + dtype_name(t);
      // The composite rounds each intermediate to t; the fused form only its result.
      testing::Tol tol = tol_for(t);
      if (t == DType::F64) tol = {1e-14, 1e-13};
      if (t == DType::BF16 || t == DType::F16) tol = {4 * tol.atol, 2 * tol.rtol};
      EXPECT_EQ(dx.dtype(), t) << what;
      expect_close(y, y_ref.to_vector<double>(), tol, what + " forward");
      expect_close(dx, dx_ref.to_vector<double>(), tol, what + " backward");
    }
}

TEST(Gelu, BackwardMatchesDerivativeInF64) {
  for (const Form& f : kForms)
    for (Layout layout : testing::kLayouts)
      for (DType t : {DType::F32, DType::F64, DType::BF16}) {
        const Shape shape{7, 300};
        const auto [y, dx] = run(f.fused, shape, t, layout);
        // The reference from the same rounded inputs and upstream gradient, in f64.
        const Tensor x = testing::leaf(shape, -6, 6, 71, layout).detach().to(t);
        const auto xv = x.to_vector<double>();
        const auto gv = testing::uniform(shape, -1, 1, t, 72).to_vector<double>();
        std::vector<double> ref(xv.size());
        for (size_t i = 0; i < xv.size(); ++i) ref[i] = gv[i] * f.derivative(xv[i]);
        // In f32, 1 - t^2 loses its digits where |t| rounds near 1 (as in every tanh form): an absolute
        // error near 1e-6 there, within tol_for's atol.
        const testing::Tol tol = tol_for(t);
        expect_close(dx, ref, tol,
                     std::string(f.name) + " " + dtype_name(t) + " " + testing::layout_name(layout));
      }
}

TEST(Gelu, Gradcheck) {
  for (Layout layout : testing::kLayouts) {
    testing::expect_grads_ok([](const std::vector<Tensor>& in) { return gelu(in[0]); },
                             {testing::leaf({4, 6}, -4, 4, 73, layout)},
                             std::string("gelu ") + testing::layout_name(layout));
    testing::expect_grads_ok([](const std::vector<Tensor>& in) { return gelu_tanh(in[0]); },
                             {testing::leaf({4, 6}, -4, 4, 74, layout)},
                             std::string("gelu_tanh ") + testing::layout_name(layout));
  }
}

TEST(Gelu, BackwardBadInputs) {
  const Tensor x = testing::uniform({3, 4}, -1, 1);
  expect_error<ShapeError>(
      [&] {
        ops::gelu_backward(testing::uniform({4, 3}, -1, 1), x);
      },
      {"gelu_backward", "[4, 3]", "[3, 4]"});
  expect_error<DTypeError>([&] { ops::gelu_tanh_backward(x, x.to(DType::I32)); },
                           {"gelu_tanh_backward", "floating", "i32"});
  expect_error<DTypeError>([&] { gelu(x.to(DType::I64)); }, {"gelu", "i64"});
  // A gradient of another floating dtype is converted to the input's.
  const Tensor dx = ops::gelu_backward(ones({3, 4}, DType::F64), x);
  EXPECT_EQ(dx.dtype(), DType::F32);
  std::vector<double> ref;
  for (double v : x.to_vector<double>()) ref.push_back(d_gelu(v));
  expect_close(dx, ref, {2e-6, 2e-6}, "gelu_backward of a f64 gradient");
}

}  // namespace
}  // namespace frugal
