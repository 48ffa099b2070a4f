// GELU's Eigen forms (erf form), in one place: gelu's kernel (kernels/cpu/elementwise.cpp), gelu_backward's
// and gelu_and_backward's (kernels/cpu/activation.cpp) all build their expressions from these, so that the
// fused op's results stay those of the two ops bit for bit (Note [gelu_linear's backward in one pass over
// x]). x and the results are Eigen array expressions of compute type C; each form returns an expression
// (its operands nested by value), evaluated where it is assigned.
#pragma once

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>

namespace frugal::cpu {

// erf(x / sqrt 2)
template <typename C, typename X>
auto gelu_erf(const X& x) {
  return (x * C(0.70710678118654752)).erf();
}
// gelu(x) = x Phi(x), from erf = gelu_erf(x)
template <typename C, typename X, typename E>
auto gelu_form(const X& x, const E& erf) {
  return C(0.5) * x * (C(1) + erf);
}
// dy gelu'(x) = dy (Phi(x) + x phi(x)), from erf = gelu_erf(x); phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
template <typename C, typename DY, typename X, typename E>
auto gelu_backward_form(const DY& dy, const X& x, const E& erf) {
  return dy * (C(0.5) + C(0.5) * erf + x * C(0.39894228040143267794) * (C(-0.5) * x.square()).exp());
}

}  // namespace frugal::cpu
