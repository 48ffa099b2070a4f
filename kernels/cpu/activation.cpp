// CPU kernels of the activations' gradients that run as one pass (op_gelu_backward, op_gelu_tanh_backward,
// op_relu_backward; formulas in core/op_table.h) instead of several elementwise ops. The math is one Eigen
// array expression, so contiguous f32/f64 runs use Eigen's vectorised erf, exp and tanh (Eigen's float erf is
// a clamped rational approximation accurate to a few ulps, the same the forward gelu uses); other runs
// (strided, f16/bf16) pass through small buffers in the compute type. Their reference is the gradient
// autograd derives from the composite forms (tests/kernels/test_gelu.cpp).
#include <Eigen/Core>
#include <algorithm>
#include <unsupported/Eigen/SpecialFunctions>

#include "core/op_table.h"
#include "kernels/cpu/map.h"
#include "kernels/cpu/register.h"

namespace frugal {
namespace {

using cpu::In;
using cpu::Out;

// dx, dy, x as Eigen maps, in L1-sized pieces: the rules below are two statements.
template <typename T, typename F>
void map_backward(const Loop& loop, F f) {
  cpu::map_kernel<T, 2, /*Chunked=*/true>(loop, f);
}

// dx = dy (Phi(x) + x phi(x)): Phi(x) = (1 + erf(x / sqrt 2)) / 2, phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
template <typename T>
void gelu_backward_cpu(const Loop& loop, const OpArgs&) {
  using C = acc_t<T>;
  map_backward<T>(loop, [](Out<C>& dx, const In<C>& dy, const In<C>& x) {
    dx = dy * (C(0.5) + C(0.5) * (x * C(0.70710678118654752)).erf() +
               x * C(0.39894228040143267794) * (C(-0.5) * x.square()).exp());
  });
}

// dx = dy ((1 + t) / 2 + x (1 - t^2) k (1 + 3 c x^2) / 2), t = tanh(k (x + c x^3))
template <typename T>
void gelu_tanh_backward_cpu(const Loop& loop, const OpArgs&) {
  using C = acc_t<T>;
  map_backward<T>(loop, [](Out<C>& dx, const In<C>& dy, const In<C>& x) {
    constexpr C k = C(0.79788456080286535588), c = C(0.044715);
    dx = (k * x * (C(1) + c * x.square())).tanh();  // t, computed once (an expression would recompute it)
    dx = dy * C(0.5) * (C(1) + dx + x * (C(1) - dx.square()) * k * (C(1) + C(3) * c * x.square()));
  });
}

// dx = y > 0 ? dy : 0 (y is ReLU's output; a select, so the values are exactly where(y > 0, dy, 0)'s)
template <typename T>
void relu_backward_cpu(const Loop& loop, const OpArgs&) {
  using C = acc_t<T>;
  map_backward<T>(loop,
                  [](Out<C>& dx, const In<C>& dy, const In<C>& y) { dx = (y > C(0)).select(dy, C(0)); });
}

const bool kRegistered = [] {
  cpu::for_types<float, double, Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_gelu_backward.set(DeviceType::CPU, dtype_v<T>, gelu_backward_cpu<T>);
    op_gelu_tanh_backward.set(DeviceType::CPU, dtype_v<T>, gelu_tanh_backward_cpu<T>);
    op_relu_backward.set(DeviceType::CPU, dtype_v<T>, relu_backward_cpu<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
