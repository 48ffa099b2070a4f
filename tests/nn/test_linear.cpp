// The fused linear op (frugal::linear, behind F::linear and nn::Linear) against its composite
// (F::linear_composite: matmul and add): outputs and gradients in f32 and f64, with and without bias, for
// 1-D, 2-D and 3-D inputs and non-contiguous inputs and weights; finite differences in f64; which path runs;
// bad inputs of the op.
#include "nn/layers.h"
#include "tests/autograd/gradcheck_helpers.h"

namespace frugal {
namespace {

namespace F = nn::functional;
using testing::expect_close;
using testing::expect_error;
using testing::uniform;

struct Case {
  Shape x_shape;
  int64_t out;
  bool bias, transposed_x, transposed_w;
};
const Case kCases[] = {
    {{5, 7}, 3, true, false, false},     {{5, 7}, 3, false, false, false}, {{2, 3, 4}, 6, true, false, false},
    {{7}, 4, true, false, false},        {{6, 5}, 4, true, true, false},   {{6, 5}, 4, true, false, true},
    {{300, 64}, 96, true, false, false},
};

std::string name(const Case& c) {
  std::ostringstream s;
  s << c.x_shape << " -> " << c.out << (c.bias ? " bias" : "") << (c.transposed_x ? " x^T view" : "")
    << (c.transposed_w ? " w^T view" : "");
  return s.str();
}

// y and the gradients of x, weight, bias for a fixed random upstream gradient.
std::vector<Tensor> run(const Case& c, DType t, bool fused) {
  Tensor x = c.transposed_x ? uniform({c.x_shape[1], c.x_shape[0]}, -2, 2, t, 1).t()
                            : uniform(c.x_shape, -2, 2, t, 1);
  const int64_t in = c.x_shape.back();
  Tensor w = c.transposed_w ? uniform({in, c.out}, -1, 1, t, 2).t() : uniform({c.out, in}, -1, 1, t, 2);
  Tensor b = c.bias ? uniform({c.out}, -1, 1, t, 3) : Tensor();
  x = x.detach().requires_grad_();
  w = w.detach().requires_grad_();
  if (b.defined()) b.requires_grad_();
  const Tensor y = fused ? F::linear(x, w, b) : F::linear_composite(x, w, b);
  y.backward(uniform(y.shape(), -1, 1, t, 4));
  return {y.detach(), x.grad(), w.grad(), b.defined() ? b.grad() : Tensor()};
}

TEST(Linear, MatchesComposite) {
  for (const Case& c : kCases)
    for (DType t : {DType::F32, DType::F64}) {
      const auto fused = run(c, t, true), ref = run(c, t, false);
      const char* names[] = {"y", "dx", "dweight", "dbias"};
      const testing::Tol tol = t == DType::F64 ? testing::Tol{1e-12, 1e-12} : testing::Tol{1e-5, 1e-5};
      for (size_t i = 0; i < fused.size(); ++i) {
        const std::string what = name(c) + " " + dtype_name(t) + " " + names[i];
        ASSERT_EQ(fused[i].defined(), ref[i].defined()) << what;
        if (!fused[i].defined()) continue;
        EXPECT_EQ(fused[i].shape(), ref[i].shape()) << what;
        EXPECT_EQ(fused[i].dtype(), t) << what;
        expect_close(fused[i], ref[i].to_vector<double>(), tol, what);
      }
    }
}

TEST(Linear, RunsTheFusedOpWhereItApplies) {
  const Tensor x = uniform({4, 3}, -1, 1).requires_grad_(), w = uniform({2, 3}, -1, 1).requires_grad_();
  EXPECT_EQ(F::linear(x, w).grad_fn_name(), std::string("linear"));
  // Mixed dtypes take the composite, whose matmul names them.
  expect_error<DTypeError>([&] { F::linear(x, w.detach().to(DType::F64)); }, {"matmul", "f32", "f64"});
}

TEST(Linear, Gradcheck) {
  for (testing::Layout layout : testing::kLayouts)
    testing::expect_grads_ok([](const std::vector<Tensor>& in) { return F::linear(in[0], in[1], in[2]); },
                             {testing::leaf({4, 5}, -1, 1, 5, layout),
                              testing::leaf({3, 5}, -1, 1, 6, layout), testing::leaf({3}, -1, 1, 7)},
                             std::string("linear ") + testing::layout_name(layout));
  testing::expect_grads_ok([](const std::vector<Tensor>& in) { return F::linear(in[0], in[1]); },
                           {testing::leaf({2, 3, 4}, -1, 1, 8), testing::leaf({2, 4}, -1, 1, 9)},
                           "linear 3-d no bias");
}

TEST(Linear, BadInputsOfTheOp) {
  const Tensor x = uniform({4, 3}, -1, 1), w = uniform({2, 3}, -1, 1);
  expect_error<ShapeError>([&] { ops::linear(x, uniform({2, 4}, -1, 1)); }, {"linear", "[4, 3]", "[2, 4]"});
  expect_error<ShapeError>([&] { ops::linear(x, w, uniform({3}, -1, 1)); }, {"linear", "bias", "[2]"});
  expect_error<DTypeError>([&] { ops::linear(x, w.to(DType::F64)); }, {"linear", "f32", "f64"});
  expect_error<DTypeError>([&] { ops::linear(x.to(DType::I64), w.to(DType::I64)); }, {"linear", "i64"});
  expect_error<ShapeError>([&] { F::linear(x, uniform({2, 4}, -1, 1)); }, {"linear", "[4, 3]", "[2, 4]"});
}

}  // namespace
}  // namespace frugal
