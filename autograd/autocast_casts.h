// The casts autocast makes (Note [autocast policy], amp/autocast.h), as recorded differentiable casts, for
// the differentiable ops to apply to their inputs first. Each returns x itself when autocast is off or x
// needs no cast.
//
//   Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
//     const Tensor a = autograd::autocast_lower(a_in), b = autograd::autocast_lower(b_in);
//     ...
#pragma once

#include "../amp/autocast.h"
#include "../core/tensor.h"

namespace frugal::autograd {

namespace detail {
Tensor autocast_to(const Tensor& x, DType dtype);
}

// For a GEMM-like op: a floating x other than f64 in the autocast dtype. Casts of leaves that require grad
// are cached while the outermost enabled guard lives.
inline Tensor autocast_lower(const Tensor& x) {
  if (!amp::is_autocast_enabled() || !x.defined()) return x;
  const DType t = x.dtype(), low = amp::autocast_dtype();
  if (!is_floating(t) || t == DType::F64 || t == low) return x;
  return detail::autocast_to(x, low);
}

// For a numerically sensitive op: an f16/bf16 x in f32.
inline Tensor autocast_f32(const Tensor& x) {
  if (!amp::is_autocast_enabled() || !x.defined()) return x;
  if (x.dtype() != DType::F16 && x.dtype() != DType::BF16) return x;
  return detail::autocast_to(x, DType::F32);
}

}  // namespace frugal::autograd
