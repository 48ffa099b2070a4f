// The one-pass gradients of the activations (gelu_backward, gelu_tanh_backward, relu_backward): argument
// checks and the call
// into the op table. The kernels are in kernels/cpu/activation.cpp.
#include "core/memory_history.h"
#include "core/op_table.h"
#include "core/ops.h"

namespace frugal::ops {

namespace {

Tensor activation_backward(OpTable<ElementwiseKernel>& table, const Tensor& grad_out, const Tensor& x) {
  memory::OpScope op_scope(table.name(), grad_out, x);  // Note [op names in the history]
  const char* op = table.name();
  FRUGAL_CHECK(x.defined() && grad_out.defined(), op, ": the input or the gradient is undefined");
  FRUGAL_CHECK_DTYPE(is_floating(x.dtype()), op, ": expected a floating input (f32, f64, f16, bf16), got ",
                     dtype_name(x.dtype()), " (shape ", x.shape(), ")");
  FRUGAL_CHECK_SHAPE(grad_out.shape() == x.shape(), op, ": the gradient's shape ", grad_out.shape(),
                     " differs from the input's ", x.shape());
  FRUGAL_CHECK_T(DeviceError, grad_out.device() == x.device(), op, ": the gradient is on ", grad_out.device(),
                 " but the input is on ", x.device());
  const Tensor dy = ops::to(grad_out, x.dtype());
  Tensor dx = empty(x.shape(), x.options());
  table.get(x.device(), x.dtype())(make_loop({&dx, &dy, &x}), {});
  return dx;
}

}  // namespace

Tensor gelu_backward(const Tensor& grad_out, const Tensor& x) {
  return activation_backward(op_gelu_backward, grad_out, x);
}
Tensor gelu_tanh_backward(const Tensor& grad_out, const Tensor& x) {
  return activation_backward(op_gelu_tanh_backward, grad_out, x);
}
Tensor relu_backward(const Tensor& grad_out, const Tensor& y) {
  return activation_backward(op_relu_backward, grad_out, y);
}

bool has_gelu_and_backward(const Tensor& x) { return op_gelu_and_backward.has(x.device(), x.dtype()); }

Tensor gelu_and_backward_(Tensor& grad, const Tensor& x) {
  memory::OpScope op_scope("gelu_and_backward", grad, x);  // Note [op names in the history]
  const char* op = "gelu_and_backward_";
  FRUGAL_CHECK(x.defined() && grad.defined(), op, ": the input or the gradient is undefined");
  FRUGAL_CHECK_DTYPE(is_floating(x.dtype()) && grad.dtype() == x.dtype(), op,
                     ": expected a floating input and a gradient of its dtype, got ", dtype_name(x.dtype()),
                     " and ", dtype_name(grad.dtype()));
  FRUGAL_CHECK_SHAPE(grad.shape() == x.shape(), op, ": the gradient's shape ", grad.shape(),
                     " differs from the input's ", x.shape());
  FRUGAL_CHECK_T(DeviceError, grad.device() == x.device(), op, ": the gradient is on ", grad.device(),
                 " but the input is on ", x.device());
  FRUGAL_CHECK(
      grad.is_contiguous() && grad.is_writable() && (!grad.storage() || grad.storage() != x.storage()), op,
      ": the gradient is written over, so it must be contiguous, writable and not share the input's memory");
  Tensor y = empty(x.shape(), x.options());
  op_gelu_and_backward.get(x.device(), x.dtype())(make_loop({&grad, &y, &x}), {});
  if (grad.storage()) grad.storage()->bump_version();
  return y;
}

}  // namespace frugal::ops
