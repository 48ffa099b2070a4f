// The fused linear op (frugal::linear, behind F::linear and nn::Linear) against its composite
// (F::linear_composite: matmul and add): outputs and gradients in f32 and f64, with and without bias, for
// 1-D, 2-D and 3-D inputs and non-contiguous inputs and weights; finite differences in f64; which path runs;
// bad inputs of the op.
#include "nn/layers.h"
#include "tests/autograd/gradcheck_helpers.h"
#include "tests/nn/linear_case.h"

namespace frugal {
namespace {

namespace F = nn::functional;
using testing::expect_close;
using testing::expect_error;
using testing::uniform;

const std::vector<testing::LinearCase> kCases = {
    {{5, 7}, 3, true, false, false},
    {{5, 7}, 3, false, false, false},
    {{2, 3, 4}, 6, true, false, false},
    {{7}, 4, true, false, false},
    {{6, 5}, 4, true, true, false},
    {{6, 5}, 4, true, false, true},
    {{300, 64}, 96, true, false, false},
    // One output, one input, one row: matrices whose unused stride oneDNN's GEMM still checked.
    {{512, 32}, 1, true, false, false},
    {{512, 1}, 32, true, false, false},
    {{1, 32}, 1, false, false, false},
    // No input features under leading dims: y is the bias (the fused op once folded the leading dims by a -1,
    // which reshape refuses for a tensor of no elements).
    {{2, 3, 0}, 4, true, false, false},
};

TEST(Linear, MatchesComposite) {
  testing::expect_matches_composite(
      kCases, [](const Tensor& x, const Tensor& w, const Tensor& b) { return F::linear(x, w, b); },
      [](const Tensor& x, const Tensor& w, const Tensor& b) { return F::linear_composite(x, w, b); });
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
