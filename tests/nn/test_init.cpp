// nn::init: fans (linear and conv weights), gains, and the statistics of each fill (bounds, mean, std).
#include <cmath>

#include "nn/init.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

namespace init = nn::init;
using testing::expect_error;

double stddev(const Tensor& t) { return std::sqrt(var(t.to(DType::F64)).item<double>()); }
double max_abs(const Tensor& t) { return max(abs(t.to(DType::F64))).item<double>(); }

TEST(Init, FansOfLinearAndConvWeights) {
  EXPECT_EQ(init::calculate_fan_in_and_fan_out(empty({30, 20})), (std::pair<int64_t, int64_t>{20, 30}));
  EXPECT_EQ(init::calculate_fan_in_and_fan_out(empty({64, 32, 3, 3})),
            (std::pair<int64_t, int64_t>{288, 576}));
  expect_error<ShapeError>([] { init::calculate_fan_in_and_fan_out(empty({5})); },
                           {"at least 2 dims", "[5]"});
}

TEST(Init, Gains) {
  using N = init::Nonlinearity;
  EXPECT_EQ(init::calculate_gain(N::Linear), 1.0);
  EXPECT_EQ(init::calculate_gain(N::Conv2d), 1.0);
  EXPECT_EQ(init::calculate_gain(N::Sigmoid), 1.0);
  EXPECT_DOUBLE_EQ(init::calculate_gain(N::Tanh), 5.0 / 3.0);
  EXPECT_DOUBLE_EQ(init::calculate_gain(N::ReLU), std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(init::calculate_gain(N::LeakyReLU), std::sqrt(2.0 / (1 + 0.01 * 0.01)));
  EXPECT_DOUBLE_EQ(init::calculate_gain(N::LeakyReLU, std::sqrt(5.0)), std::sqrt(1.0 / 3.0));
  EXPECT_DOUBLE_EQ(init::calculate_gain(N::SELU), 0.75);
}

TEST(Init, UniformNormalConstant) {
  Generator g(1);
  Tensor t = empty({200, 500});
  init::uniform_(t, -2, 3, &g);
  EXPECT_GE(min(t).item<double>(), -2.0);
  EXPECT_LT(max(t).item<double>(), 3.0);
  EXPECT_NEAR(mean(t).item<double>(), 0.5, 0.02);
  init::normal_(t, 1.5, 0.5, &g);
  EXPECT_NEAR(mean(t).item<double>(), 1.5, 0.01);
  EXPECT_NEAR(stddev(t), 0.5, 0.01);
  init::constant_(t, 0.25);
  EXPECT_EQ(min(t).item<double>(), 0.25);
  EXPECT_EQ(max(t).item<double>(), 0.25);
  init::ones_(t);
  EXPECT_EQ(sum(t).item<double>(), 1e5);
  init::zeros_(t);
  EXPECT_EQ(sum(abs(t)).item<double>(), 0.0);
  // The same generator state gives the same values; a bf16 parameter is filled in place.
  Generator g1(9), g2(9);
  Tensor a = empty({10}), b = empty({10});
  EXPECT_EQ(init::uniform_(a, 0, 1, &g1).to_vector<float>(), init::uniform_(b, 0, 1, &g2).to_vector<float>());
  Tensor p = zeros({64, 64}, DType::BF16).requires_grad_();
  const Tensor handle = p;
  init::normal_(p);  // works on a parameter: under NoGradGuard
  EXPECT_TRUE(handle.is_same(p));
  EXPECT_EQ(p.dtype(), DType::BF16);
  EXPECT_NEAR(stddev(p), 1.0, 0.05);
  expect_error<DTypeError>(
      [] {
        Tensor i = zeros({2}, DType::I64);
        init::normal_(i);
      },
      {"normal_", "i64"});
}

TEST(Init, XavierAndKaimingStatistics) {
  Generator g(2);
  Tensor w = empty({256, 128, 3, 3});  // fan_in 1152, fan_out 2304
  const double fan_in = 1152, fan_out = 2304;
  init::xavier_uniform_(w, 2.0, &g);
  const double xb = 2.0 * std::sqrt(6.0 / (fan_in + fan_out));
  EXPECT_LE(max_abs(w), xb);
  EXPECT_GT(max_abs(w), 0.99 * xb);
  init::xavier_normal_(w, 1.0, &g);
  EXPECT_NEAR(stddev(w), std::sqrt(2.0 / (fan_in + fan_out)), 0.01 * std::sqrt(2.0 / (fan_in + fan_out)));
  init::kaiming_uniform_(w, 0, init::FanMode::FanIn, init::Nonlinearity::ReLU, &g);
  const double kb = std::sqrt(3.0) * std::sqrt(2.0) / std::sqrt(fan_in);
  EXPECT_LE(max_abs(w), kb);
  EXPECT_GT(max_abs(w), 0.99 * kb);
  init::kaiming_normal_(w, 0, init::FanMode::FanOut, init::Nonlinearity::ReLU, &g);
  const double ks = std::sqrt(2.0) / std::sqrt(fan_out);
  EXPECT_NEAR(stddev(w), ks, 0.01 * ks);
  // Linear's default: kaiming_uniform_(a = sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  Tensor l = empty({300, 400});
  init::kaiming_uniform_(l, std::sqrt(5.0), init::FanMode::FanIn, init::Nonlinearity::LeakyReLU, &g);
  EXPECT_LE(max_abs(l), 1 / 20.0);
  EXPECT_GT(max_abs(l), 0.99 / 20.0);
}

}  // namespace
}  // namespace frugal
