// nn::init: fans (linear and conv weights), gains, the statistics of each fill (bounds, mean, std), and the
// bytes a fill and a module's construction take (none beside the parameters, or one f32 draw).
#include <cmath>

#include "nn/conv.h"
#include "nn/init.h"
#include "nn/layers.h"
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

// Filling a tensor allocates nothing for an f32 or f64 tensor on the cpu (drawn into it), and one temporary
// of its size for f16/bf16 (the f32 draw); not one per operation of the formula. The values are the
// formula's, u x (b - a) + a, rounded as the ops round it.
TEST(Init, AFillAllocatesNothingOrOneDraw) {
  for (DType dtype : {kF32, kF64, kBF16}) {
    Tensor t = empty({256, 1000}, TensorOptions(dtype));
    const int64_t extra = dtype == kBF16 ? t.numel() * 4 : 0;
    for (int kind = 0; kind < 3; ++kind) {
      memory::reset_peak();
      const int64_t before = memory::stats().allocated.current;
      if (kind == 0) init::uniform_(t, -2, 3);
      if (kind == 1) init::normal_(t, 1, 0.5);
      if (kind == 2) init::kaiming_uniform_(t, std::sqrt(5.0));
      const memory::Stats s = memory::stats();
      EXPECT_EQ(s.allocated.current, before) << dtype_name(dtype) << " fill " << kind << " kept memory";
      EXPECT_LE(s.allocated.peak - before, extra + 4096) << dtype_name(dtype) << " fill " << kind;
    }
  }
  for (DType dtype : {kF32, kF64, kBF16}) {
    Tensor t = empty({1000}, TensorOptions(dtype)), n = empty({1000}, TensorOptions(dtype));
    manual_seed(3);
    init::uniform_(t, -2, 3);
    init::normal_(n, 1, 0.5);
    manual_seed(3);
    const DType draw = dtype == kF64 ? kF64 : kF32;
    const Tensor want = ops::to(ops::add(ops::mul(rand({1000}, draw), 5.0), -2.0), dtype);
    const Tensor want_n = ops::to(ops::add(ops::mul(randn({1000}, draw), 0.5), 1.0), dtype);
    EXPECT_EQ(t.to_vector<double>(), want.to_vector<double>()) << dtype_name(dtype);
    EXPECT_EQ(n.to_vector<double>(), want_n.to_vector<double>()) << dtype_name(dtype);
  }
}

// A module is built in its parameters' bytes: its initialisation's draws leave nothing behind and take no
// room beside the parameters (Linear and Embedding through nn::init, Conv2d through its own draw).
TEST(Init, AModuleIsBuiltInItsParametersBytes) {
  auto built_in = [](const char* what, auto make) {
    memory::reset_peak();
    const int64_t before = memory::stats().allocated.current;
    auto module = make();
    int64_t bytes = 0;
    for (const Tensor& p : module->parameters()) bytes += p.numel() * int64_t(dtype_size(p.dtype()));
    const memory::Stats s = memory::stats();
    EXPECT_GE(s.allocated.current - before, bytes) << what;
    EXPECT_LE(s.allocated.peak - before, bytes + 4096) << what << ": built with room to spare";
  };
  built_in("Linear", [] { return nn::Linear(512, 300); });
  built_in("Conv2d", [] { return nn::Conv2d(nn::Conv2dOptions(64, 128, 3)); });
  built_in("Embedding", [] { return nn::Embedding(1000, 64); });
}

// rand_into / randn_into give what rand / randn of the tensor's shape and dtype give, and refuse what they
// cannot draw into, leaving it as it was.
TEST(Init, DrawIntoEqualsTheFactoriesAndRefusesOtherTensors) {
  for (DType dtype : {kF32, kF64}) {
    Tensor t = empty({3, 333}, TensorOptions(dtype));
    manual_seed(11);
    rand_into(t);
    const std::vector<double> drawn = t.to_vector<double>();
    randn_into(t);
    const std::vector<double> drawn_n = t.to_vector<double>();
    manual_seed(11);
    EXPECT_EQ(drawn, rand({3, 333}, dtype).to_vector<double>()) << dtype_name(dtype);
    EXPECT_EQ(drawn_n, randn({3, 333}, dtype).to_vector<double>()) << dtype_name(dtype);
  }
  Tensor half = zeros({4}, TensorOptions(kBF16));
  expect_error<Error>([&] { rand_into(half); },
                      {"rand_into", "expected a contiguous f32 or f64 tensor", "got bf16"});
  Tensor strided = zeros({4, 4}).transpose(0, 1);
  expect_error<Error>([&] { randn_into(strided); }, {"randn_into", "(not contiguous)"});
  Tensor undefined;
  expect_error<Error>([&] { rand_into(undefined); }, {"the tensor is undefined"});
  EXPECT_EQ(half.to_vector<float>(), std::vector<float>(4, 0.0f));
  EXPECT_EQ(strided.to_vector<float>(), std::vector<float>(16, 0.0f));
  Tensor meta = empty({1 << 20}, TensorOptions().device(kMeta));
  EXPECT_TRUE(can_draw_into(meta));
  rand_into(meta);  // draws nothing, touches nothing
}

}  // namespace
}  // namespace frugal
