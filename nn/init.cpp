// nn::init: fans, gains and the in-place fills. Values are drawn in f64 for f64 tensors and in f32 otherwise,
// then converted into the tensor (so f16/bf16 parameters round once).
#include "nn/init.h"

#include <cmath>

#include "autograd/functions.h"

namespace frugal::nn::init {

namespace {
DType draw_dtype(const Tensor& t) { return t.dtype() == DType::F64 ? DType::F64 : DType::F32; }

// t = u x scale + shift, u a draw (rand or randn) of t's shape. In place: into t itself where it can take
// the draw (an f32 or f64 parameter on the cpu: nothing allocated), else in one temporary of t's size, then
// converted into t. Not as one expression, whose three temporaries (the draw, the product, the sum) would
// live together: a 1 GiB embedding was filled with 3 GiB to spare. The same operations either way, hence the
// same values.
template <typename Draw, typename DrawInto>
Tensor& fill(Tensor& t, Generator* gen, double scale, double shift, Draw draw, DrawInto draw_into) {
  NoGradGuard no_grad;
  if (can_draw_into(t)) return ops::add_(ops::mul_(draw_into(t, gen), scale), shift);
  Tensor u = draw(t.shape(), TensorOptions(draw_dtype(t)).device(t.device()), gen);
  ops::add_(ops::mul_(u, scale), shift);
  return ops::copy_(t, u);
}

void check_floating(const Tensor& t, const char* op) {
  FRUGAL_CHECK(t.defined(), "init::", op, ": the tensor is undefined");
  FRUGAL_CHECK_DTYPE(is_floating(t.dtype()), "init::", op, ": expected a floating tensor, got ",
                     dtype_name(t.dtype()), " (shape ", t.shape(), ")");
}

int64_t fan(const Tensor& t, FanMode mode) {
  const auto [in, out] = calculate_fan_in_and_fan_out(t);
  return mode == FanMode::FanIn ? in : out;
}
}  // namespace

double calculate_gain(Nonlinearity nonlinearity, std::optional<double> param) {
  switch (nonlinearity) {
    case Nonlinearity::Linear:
    case Nonlinearity::Conv1d:
    case Nonlinearity::Conv2d:
    case Nonlinearity::Conv3d:
    case Nonlinearity::Sigmoid:
      return 1;
    case Nonlinearity::Tanh:
      return 5.0 / 3.0;
    case Nonlinearity::ReLU:
      return std::sqrt(2.0);
    case Nonlinearity::LeakyReLU: {
      const double slope = param.value_or(0.01);
      return std::sqrt(2.0 / (1 + slope * slope));
    }
    case Nonlinearity::SELU:
      return 3.0 / 4.0;
  }
  return 1;
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  FRUGAL_CHECK(t.defined(), "init: the tensor is undefined");
  FRUGAL_CHECK_SHAPE(t.dim() >= 2, "init: fan in and fan out need a tensor of at least 2 dims, got shape ",
                     t.shape());
  int64_t receptive = 1;
  for (int d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

Tensor& uniform_(Tensor& t, double a, double b, Generator* gen) {
  check_floating(t, "uniform_");
  FRUGAL_CHECK(a <= b, "init::uniform_: expected a <= b, got [", a, ", ", b, ")");
  return fill(t, gen, b - a, a, rand, rand_into);
}

Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) {
  check_floating(t, "normal_");
  FRUGAL_CHECK(std >= 0, "init::normal_: std must be >= 0, got ", std);
  return fill(t, gen, std, mean, randn, randn_into);
}

Tensor& constant_(Tensor& t, double value) {
  FRUGAL_CHECK(t.defined(), "init::constant_: the tensor is undefined");
  NoGradGuard no_grad;
  ops::fill_(t, value);
  return t;
}
Tensor& zeros_(Tensor& t) { return constant_(t, 0); }
Tensor& ones_(Tensor& t) { return constant_(t, 1); }

Tensor& xavier_uniform_(Tensor& t, double gain, Generator* gen) {
  const auto [in, out] = calculate_fan_in_and_fan_out(t);
  const double bound = gain * std::sqrt(6.0 / double(in + out));
  return uniform_(t, -bound, bound, gen);
}

Tensor& xavier_normal_(Tensor& t, double gain, Generator* gen) {
  const auto [in, out] = calculate_fan_in_and_fan_out(t);
  return normal_(t, 0, gain * std::sqrt(2.0 / double(in + out)), gen);
}

Tensor& kaiming_uniform_(Tensor& t, double a, FanMode mode, Nonlinearity nonlinearity, Generator* gen) {
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(double(fan(t, mode)));
  const double bound = std::sqrt(3.0) * std;
  return uniform_(t, -bound, bound, gen);
}

Tensor& kaiming_normal_(Tensor& t, double a, FanMode mode, Nonlinearity nonlinearity, Generator* gen) {
  return normal_(t, 0, calculate_gain(nonlinearity, a) / std::sqrt(double(fan(t, mode))), gen);
}

}  // namespace frugal::nn::init
