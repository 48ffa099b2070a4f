// nn::Conv2d, nn::MaxPool2d, nn::AvgPool2d: shapes, parameter counts, PyTorch's initialisation bounds,
// forward equal to the functional ops, gradients reaching the parameters, and bad options.
#include <cmath>

#include "nn/conv.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::uniform;

TEST(Conv2dModule, ShapesParametersAndInitBounds) {
  struct Case {
    nn::Conv2dOptions options;
    Shape x, y;
  };
  const Case cases[] = {
      {nn::Conv2dOptions(1, 32, 3).padding(1), {4, 1, 28, 28}, {4, 32, 28, 28}},    // W2 conv1
      {nn::Conv2dOptions(32, 64, 3).padding(1), {4, 32, 14, 14}, {4, 64, 14, 14}},  // W2 conv2
      {nn::Conv2dOptions(6, 4, {3, 2}).stride(2).groups(2).bias(false), {2, 6, 9, 9}, {2, 4, 4, 4}},
      {nn::Conv2dOptions(4, 8, 3).dilation(2).padding({2, 1}).groups(4), {1, 4, 7, 7}, {1, 8, 7, 5}},
  };
  for (const auto& c : cases) {
    nn::Conv2d conv(c.options);
    const auto& o = c.options;
    const Size2 k = o.kernel_size();
    const int64_t fan_in = o.in_channels() / o.groups() * k.h * k.w;
    const Shape ws{o.out_channels(), o.in_channels() / o.groups(), k.h, k.w};
    EXPECT_EQ(conv->weight.shape(), ws);
    EXPECT_EQ(conv->bias.defined(), o.bias());
    EXPECT_EQ(conv->num_parameters(), ws.numel() + (o.bias() ? o.out_channels() : 0));
    EXPECT_EQ(conv->parameters().size(), o.bias() ? 2u : 1u);
    EXPECT_EQ(conv->named_parameters()[0].first, "weight");
    // U(-b, b), b = 1 / sqrt(fan_in): inside the bound, and spread over it (not all zeros or constant).
    const double bound = 1 / std::sqrt(double(fan_in));
    for (const Tensor& p : conv->parameters()) {
      EXPECT_TRUE(p.requires_grad());
      EXPECT_TRUE(p.is_leaf());
      EXPECT_LE(ops::max(ops::abs(p)).item<double>(), bound);
      if (p.numel() >= 200) {
        EXPECT_GT(ops::max(ops::abs(p)).item<double>(), 0.8 * bound);
        EXPECT_NEAR(ops::mean(p).item<double>(), 0.0, 0.2 * bound);
      }
    }
    const Tensor x = uniform(c.x, -1, 1);
    const Tensor y = conv(x);
    EXPECT_EQ(y.shape(), c.y);
    expect_close(y,
                 ops::conv2d(x, conv->weight, conv->bias, o.stride(), o.padding(), o.dilation(), o.groups())
                     .to_vector<double>(),
                 {0, 0}, "module vs functional");
  }
}

TEST(Conv2dModule, GradientsReachParametersAndDtypeConversion) {
  nn::Conv2d conv(nn::Conv2dOptions(3, 4, 3).padding(1));
  const Tensor x = uniform({2, 3, 6, 6}, -1, 1);
  sum(conv(x)).backward();
  ASSERT_TRUE(conv->weight.grad().defined());
  EXPECT_EQ(conv->weight.grad().shape(), conv->weight.shape());
  // d sum / d bias[o] = the number of output positions.
  expect_close(conv->bias.grad(), std::vector<double>(4, 2.0 * 36), {1e-4, 1e-6}, "bias grad");
  conv->to(DType::BF16);
  EXPECT_EQ(conv->weight.dtype(), DType::BF16);
  EXPECT_EQ(conv(x.to(DType::BF16)).dtype(), DType::BF16);
}

TEST(PoolModules, ShapesAndForward) {
  const Tensor x = uniform({2, 3, 28, 28}, -1, 1);
  nn::MaxPool2d pool(2);
  EXPECT_EQ(pool(x).shape(), (Shape{2, 3, 14, 14}));
  EXPECT_EQ(pool->num_parameters(), 0);
  expect_close(pool(x), ops::max_pool2d(x, 2).to_vector<double>(), {0, 0}, "max");
  nn::MaxPool2d overlap(3, 2, 1);
  EXPECT_EQ(overlap(x).shape(), (Shape{2, 3, 14, 14}));
  nn::AvgPool2d avg(Size2{2, 3}, Size2{2, 1}, Size2{1, 1}, false);
  EXPECT_EQ(avg(x).shape(), (Shape{2, 3, 15, 28}));
  expect_close(avg(x), ops::avg_pool2d(x, {2, 3}, Size2{2, 1}, {1, 1}, false).to_vector<double>(), {0, 0},
               "avg");
  EXPECT_EQ(avg->type_name(), "AvgPool2d");
}

TEST(ConvModules, W2FeatureStackTrains) {
  // W2's feature extractor at batch 4: [4, 1, 28, 28] -> [4, 64, 7, 7], gradients into both convolutions.
  nn::Conv2d conv1(nn::Conv2dOptions(1, 32, 3).padding(1)), conv2(nn::Conv2dOptions(32, 64, 3).padding(1));
  nn::MaxPool2d pool(2);
  const Tensor x = uniform({4, 1, 28, 28}, 0, 1);
  const Tensor h = pool(relu(conv2(pool(relu(conv1(x))))));
  EXPECT_EQ(h.shape(), (Shape{4, 64, 7, 7}));
  mean(h).backward();
  for (nn::Conv2d* c : {&conv1, &conv2})
    for (const Tensor& p : (*c)->parameters()) {
      ASSERT_TRUE(p.grad().defined());
      EXPECT_GT(sum(abs(p.grad())).item<double>(), 0);
    }
}

TEST(ConvModules, BadOptions) {
  expect_error<Error>([] { nn::Conv2d(nn::Conv2dOptions(0, 4, 3)); },
                      {"Conv2d", "in_channels (0)", "positive"});
  expect_error<Error>([] { nn::Conv2d(nn::Conv2dOptions(6, 4, 3).groups(4)); },
                      {"Conv2d", "groups (4)", "in_channels (6)"});
  expect_error<Error>([] { nn::Conv2d(nn::Conv2dOptions(4, 4, 0)); }, {"Conv2d", "kernel_size", "(0, 0)"});
  expect_error<Error>([] { nn::Conv2d(nn::Conv2dOptions(4, 4, 3).stride({1, 0})); }, {"Conv2d", "stride"});
  expect_error<Error>([] { nn::MaxPool2d(2, Size2(-1)); }, {"MaxPool2d", "stride", "(-1, -1)"});
  expect_error<Error>([] { nn::AvgPool2d(2, std::nullopt, -1); }, {"AvgPool2d", "padding"});
  nn::Conv2d conv(3, 8, 3);
  expect_error<ShapeError>([&] { conv(ones({1, 4, 8, 8})); }, {"conv2d", "4 channels", "expects 3"});
}

}  // namespace
}  // namespace frugal
