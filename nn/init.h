// nn::init: in-place parameter initialisation with PyTorch's formulas (fans, gains, bounds). Each function
// fills its tensor under NoGradGuard, draws from `gen` (the default generator when null) and returns it.
//
//   nn::init::kaiming_uniform_(w, std::sqrt(5.0));  // what nn::Linear does
//   nn::init::xavier_normal_(w, nn::init::calculate_gain(nn::init::Nonlinearity::Tanh));
//   nn::init::zeros_(b);
#pragma once

#include <optional>
#include <utility>

#include "../core/rng.h"
#include "../core/tensor.h"

namespace frugal::nn::init {

enum class Nonlinearity { Linear, Conv1d, Conv2d, Conv3d, Sigmoid, Tanh, ReLU, LeakyReLU, SELU };
enum class FanMode { FanIn, FanOut };

// The recommended gain for a nonlinearity: 1 (linear, conv, sigmoid), 5/3 (tanh), sqrt(2) (relu),
// sqrt(2 / (1 + a^2)) (leaky relu with slope a, 0.01 when not given), 3/4 (selu).
double calculate_gain(Nonlinearity nonlinearity, std::optional<double> param = std::nullopt);

// (fan_in, fan_out) of a weight of >= 2 dims: shape[1] and shape[0] times the receptive field (the product of
// shape[2:]), as for conv weights [out, in, kh, kw].
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);

Tensor& uniform_(Tensor& t, double a = 0, double b = 1, Generator* gen = nullptr);
Tensor& normal_(Tensor& t, double mean = 0, double std = 1, Generator* gen = nullptr);
Tensor& constant_(Tensor& t, double value);
Tensor& zeros_(Tensor& t);
Tensor& ones_(Tensor& t);
// U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)); N(0, gain * sqrt(2 / (fan_in + fan_out))).
Tensor& xavier_uniform_(Tensor& t, double gain = 1, Generator* gen = nullptr);
Tensor& xavier_normal_(Tensor& t, double gain = 1, Generator* gen = nullptr);
// std = gain(nonlinearity, a) / sqrt(fan); uniform draws U(-sqrt(3) std, sqrt(3) std).
Tensor& kaiming_uniform_(Tensor& t, double a = 0, FanMode mode = FanMode::FanIn,
                         Nonlinearity nonlinearity = Nonlinearity::LeakyReLU, Generator* gen = nullptr);
Tensor& kaiming_normal_(Tensor& t, double a = 0, FanMode mode = FanMode::FanIn,
                        Nonlinearity nonlinearity = Nonlinearity::LeakyReLU, Generator* gen = nullptr);

}  // namespace frugal::nn::init
