// ReLU's one-pass backward (ops::relu_backward, the rule autograd's relu runs) against its composite
// where(y > 0, dy, 0): exactly the same values, every float dtype, contiguous and strided, zeros, negative
// zeros and NaN; autograd's relu gradient and gradcheck in f64; bad inputs.
#include <cmath>
#include <limits>

#include "tests/autograd/gradcheck_helpers.h"

namespace frugal {
namespace {

using testing::expect_error;
using testing::Layout;

Tensor composite(const Tensor& dy, const Tensor& y) { return where(gt(y, 0.0), dy, zeros_like(dy)); }

TEST(ReluBackward, EqualsCompositeExactly) {
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16})
    for (Layout layout : testing::kLayouts) {
      // 3 x the parallel grain: several threads (under either waiting policy) and many buffered chunks; a
      // quarter of them exactly 0.
      const Shape shape{3, parallel_grain() + 7};
      Tensor y = relu(testing::leaf(shape, -3, 1, 81, layout).detach()).to(t);
      const Tensor dy = testing::uniform(shape, -1, 1, t, 82);
      const std::string what = std::string(dtype_name(t)) + " " + testing::layout_name(layout);
      const Tensor dx = ops::relu_backward(dy, y);
      EXPECT_EQ(dx.dtype(), t) << what;
      EXPECT_EQ(dx.shape(), shape) << what;
      EXPECT_EQ(dx.to_vector<double>(), composite(dy, y).to_vector<double>()) << what;
    }
}

TEST(ReluBackward, ZerosNegativeZerosAndNaN) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor y = tensor(std::vector<float>{0.0f, -0.0f, float(nan), 2.0f, -1.0f, 1e-30f});
  const Tensor dy = tensor(std::vector<float>{1, 2, 3, 4, 5, 6});
  EXPECT_EQ(ops::relu_backward(dy, y).to_vector<double>(), (std::vector<double>{0, 0, 0, 4, 0, 6}));
}

TEST(ReluBackward, AutogradMatchesCompositeAndGradcheck) {
  const Tensor x0 = testing::uniform({64, 300}, -1, 1, DType::F32, 83);
  const Tensor g = testing::uniform({64, 300}, -1, 1, DType::F32, 84);
  Tensor x = x0.clone().requires_grad_();
  relu(x).backward(g);
  EXPECT_EQ(x.grad().to_vector<float>(), composite(g, relu(x0)).to_vector<float>());
  testing::expect_grads_ok([](const std::vector<Tensor>& in) { return relu(in[0]); },
                           {testing::leaf({4, 6}, -4, 4, 85, Layout::Strided)}, "relu");
}

TEST(ReluBackward, BadInputs) {
  const Tensor y = testing::uniform({3, 4}, -1, 1);
  expect_error<ShapeError>(
      [&] {
        ops::relu_backward(testing::uniform({4, 3}, -1, 1), y);
      },
      {"relu_backward", "[4, 3]", "[3, 4]"});
  expect_error<DTypeError>([&] { ops::relu_backward(y, y.to(DType::I32)); },
                           {"relu_backward", "floating", "i32"});
  // A gradient of another floating dtype is converted to y's.
  const Tensor dx = ops::relu_backward(ones({3, 4}, DType::F64), y);
  EXPECT_EQ(dx.dtype(), DType::F32);
  EXPECT_EQ(dx.to_vector<double>(), composite(ones({3, 4}), y).to_vector<double>());
}

}  // namespace
}  // namespace frugal
