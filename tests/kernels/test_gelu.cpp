// GELU (erf form and tanh approximation): the fused forward and one-pass backward against the composite forms
// built from erf / tanh, mul and add (whose gradients autograd derives) and against the derivative written
// out in f64; every float dtype, contiguous and strided, large enough for several threads; finite
// differences in f64; bad inputs of the backward ops.
#include <bit>
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
  // 2 x the parallel grain: several threads (under either waiting policy) and many buffered chunks.
  const Shape shape{2, parallel_grain() + 7};
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

// The bits of a tensor's values, for comparisons in which NaN equals NaN.
std::vector<uint64_t> bits_of(const Tensor& t) {
  std::vector<uint64_t> r;
  for (double v : t.to_vector<double>()) r.push_back(std::bit_cast<uint64_t>(v));
  return r;
}

// gelu_linear's one pass (Note [gelu_linear's backward in one pass over x]): y and dx are gelu's and
// gelu_backward's bit for bit, for every dtype, run lengths that leave a tail after the last whole vector,
// runs split over two threads at an unaligned element (2 x 16501), an input starting off a vector boundary,
// strided inputs, a gradient not aligned with y, and the special values.
TEST(Gelu, AndBackwardEqualsGeluThenGeluBackwardBitForBit) {
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16})
    for (int64_t n : {1, 15, 35, 1000, 33002})
      for (Layout layout : testing::kLayouts)
        for (int64_t offset : {0, 3}) {
          const Shape shape{2, n / 2 > 0 ? n / 2 : 1};
          Tensor x = testing::leaf(shape, -6, 6, 75, layout).detach().to(t);
          if (offset > 0) {  // x starting `offset` elements into a buffer
            Tensor buffer = testing::uniform({x.numel() + offset}, -6, 6, t, 76);
            x = buffer.narrow(0, offset, x.numel()).view(shape);
          }
          {
            NoGradGuard ng;  // the special values at the start
            const double special[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 10.0, -10.0, 1e-40, -30.0};
            Tensor flat = x.is_contiguous() ? x.view({x.numel()}) : Tensor();
            for (size_t i = 0; flat.defined() && i < std::size(special) && int64_t(i) < x.numel(); ++i)
              flat.narrow(0, int64_t(i), 1).fill_(special[i]);
          }
          const Tensor dy = testing::uniform(shape, -1, 1, t, 77);
          const std::string what = std::string(dtype_name(t)) + " n " + std::to_string(n) + " " +
                                   testing::layout_name(layout) + " offset " + std::to_string(offset);
          for (int64_t dy_offset : {0, 1}) {
            Tensor grad = dy.clone();
            if (dy_offset > 0) {  // a gradient one element off y's alignment
              Tensor buffer = empty({dy.numel() + 1}, dy.options());
              grad = buffer.narrow(0, 1, dy.numel()).view(shape);
              grad.copy_(dy);
            }
            const Tensor y = ops::gelu_and_backward_(grad, x);
            EXPECT_EQ(bits_of(y), bits_of(ops::gelu(x))) << what << " y";
            EXPECT_EQ(bits_of(grad), bits_of(ops::gelu_backward(dy, x)))
                << what << " dx, dy offset " << dy_offset;
          }
        }
}

TEST(Gelu, AndBackwardBadInputs) {
  const Tensor x = testing::uniform({3, 4}, -1, 1);
  Tensor g = testing::uniform({4, 3}, -1, 1);
  expect_error<ShapeError>([&] { ops::gelu_and_backward_(g, x); },
                           {"gelu_and_backward_", "[4, 3]", "[3, 4]"});
  g = testing::uniform({3, 4}, -1, 1, DType::F64);
  expect_error<DTypeError>([&] { ops::gelu_and_backward_(g, x); }, {"gelu_and_backward_", "f32", "f64"});
  Tensor xi = x.to(DType::I32), gi = xi.clone();
  expect_error<DTypeError>([&] { ops::gelu_and_backward_(gi, xi); }, {"gelu_and_backward_", "floating"});
  Tensor same = x;
  const std::vector<float> before = x.to_vector<float>();
  expect_error<Error>([&] { ops::gelu_and_backward_(same, x); }, {"gelu_and_backward_", "share"});
  EXPECT_EQ(x.to_vector<float>(), before);  // nothing written
  Tensor none;
  expect_error<Error>([&] { ops::gelu_and_backward_(none, x); }, {"gelu_and_backward_", "undefined"});
  // A gradient it cannot write over in place: a transposed view.
  Tensor gt = testing::uniform({4, 3}, -1, 1).t();
  const std::vector<float> gt_before = gt.to_vector<float>();
  expect_error<Error>([&] { ops::gelu_and_backward_(gt, x); }, {"gelu_and_backward_", "contiguous"});
  EXPECT_EQ(gt.to_vector<float>(), gt_before);
}

}  // namespace
}  // namespace frugal
