// The differentiable ops: what a user calls. Each runs core's forward (frugal::ops, core/ops.h) and, when
// grad mode is on and an input requires grad, records a node whose backward rule sits beside it in
// autograd/grad_<family>.cpp. Semantics (shapes, dtypes, errors) are those of the forward op in core/ops.h.
//
//   Tensor w = randn({784, 10}).requires_grad_();
//   Tensor loss = mean(log_softmax(matmul(x, w), -1));
//   loss.backward();
#pragma once

#include <vector>

#include "../core/ops.h"
#include "graph.h"

namespace frugal {

// The elementwise ops of core/op_list.h, differentiable (the same signatures as in core/ops.h; rules in
// autograd/grad_elementwise.cpp). The in-place forms are not recorded: they throw while grad mode is on and
// `self` requires grad (use them on data, under NoGradGuard, e.g. in optimizers). Comparisons are not
// differentiable (bool results): they are core's.
FRUGAL_DECLARE_ELEMENTWISE_OPS()
#define FRUGAL_DIFF_COMPARE(name, F) using ops::name;
FRUGAL_COMPARE_OP_LIST(FRUGAL_DIFF_COMPARE)
#undef FRUGAL_DIFF_COMPARE

// Hand-written (core/op_list.h says why).
Tensor clamp_min(const Tensor& x, Scalar min);
Tensor clamp_max(const Tensor& x, Scalar max);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, Scalar b);
Tensor operator-(const Tensor& a, Scalar b);
Tensor operator*(const Tensor& a, Scalar b);
Tensor operator/(const Tensor& a, Scalar b);
Tensor operator+(Scalar a, const Tensor& b);
Tensor operator-(Scalar a, const Tensor& b);
Tensor operator*(Scalar a, const Tensor& b);
Tensor operator/(Scalar a, const Tensor& b);

// The ops of core/op_list.h's FRUGAL_TENSOR_OP_LIST (views, copies, reductions, softmax, matmul, cast,
// indexing): the recorded ones differentiable, with the same signatures as in core/ops.h (rules in
// autograd/grad_views.cpp, grad_reduce.cpp, grad_softmax.cpp, grad_linalg.cpp, grad_index.cpp; cast's in
// grad_elementwise.cpp); the others (argmax, argmin, one_hot: integer results) are core's.
#define FRUGAL_DIFF_TENSOR_OP(name, params, args, grad, method) \
  FRUGAL_IF_##grad(Tensor name FRUGAL_WITH_X params;) FRUGAL_UNLESS_##grad(using ops::name;)
FRUGAL_TENSOR_OP_LIST(FRUGAL_DIFF_TENSOR_OP)
#undef FRUGAL_DIFF_TENSOR_OP
// Along one dim with the indices (core/op_list.h; max(x, {1}) stays the Shape form). The gradient goes to
// the returned index only, PyTorch's rule for max(x, dim); the Shape forms split it among ties.
using ops::ValuesIndices;
FRUGAL_DECLARE_DIM_EXTREMES()

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor to(const Tensor& x, Device device);

// Convolution and pooling (PyTorch semantics; see core/ops.h). Gradients are first order only.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, Size2 stride = 1,
              Size2 padding = 0, Size2 dilation = 1, int64_t groups = 1);
// relu(conv2d(...)) as one op (core/ops.h: the ReLU applied as the kernel stores y, no tensor for the value
// before it); first order only. nn::Sequential calls it for a Conv2d followed by a ReLU.
Tensor conv2d_relu(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, Size2 stride = 1,
                   Size2 padding = 0, Size2 dilation = 1, int64_t groups = 1);
Tensor max_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride = {}, Size2 padding = 0,
                  Size2 dilation = 1);
Tensor avg_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride = {}, Size2 padding = 0,
                  bool count_include_pad = true);

// y [M, out] = x [M, in] weight^T + bias as one GEMM (see core/ops.h: one floating dtype with a GEMM kernel);
// gradients for x, weight and bias, first order only. nn::functional::linear calls it where it applies.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});
// relu(linear(x, weight, bias)) as one op (core/ops.h: the bias and ReLU inside the GEMM where the device
// can); first order only. nn::Sequential calls it, through nn::functional::linear_relu, for a Linear followed
// by a ReLU.
Tensor linear_relu(const Tensor& x, const Tensor& weight, const Tensor& bias = {});
// linear(gelu(x), weight, bias) (gelu_tanh with `tanh`) as one op that keeps x and not gelu(x): the backward
// computes gelu(x) again (Note [gelu_linear keeps the GELU's input]); first order only. The transformer
// block's MLP calls it, through nn::functional::gelu_linear.
Tensor gelu_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, bool tanh);
// linear(layer_norm(x, {d}, ln_weight, ln_bias, eps), weight, bias) for x [M, d], as one op that keeps x and
// not the norm's output: the backward computes it again (Note [gelu_linear keeps the GELU's input] holds for
// it too); first order only. The transformer block and nn::GPT's head call it, through
// nn::functional::layer_norm_linear. With `rounded` (autocast's dtype L) the norm's output is made from
// x-hat rounded to L and is itself L, and the op keeps that x-hat (and rstd) instead of x (Note [layer norm
// before a Linear under autocast], autograd/grad_linear.cpp); where ops::has_layer_norm_rounded.
Tensor layer_norm_linear(const Tensor& x, const Tensor& ln_weight, const Tensor& ln_bias, double eps,
                         const Tensor& weight, const Tensor& bias,
                         std::optional<DType> rounded = std::nullopt);

// Layer normalisation over the trailing dims named by normalized_shape, fused (see core/ops.h); gradients for
// x, weight and bias, first order only. nn::functional::layer_norm and nn::LayerNorm call it.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);

namespace autograd {
// frugal::layer_norm keeping for backward x-hat = (x - mean) rstd in xhat_dtype (and rstd) instead of x: what
// it does under autocast (Note [layer norm saves x-hat], autograd/grad_norm.cpp), in any floating dtype, for
// tests.
Tensor layer_norm_saving_xhat(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                              const Tensor& bias, double eps, DType xhat_dtype);

// Backpropagates from root (a scalar, or any tensor with an explicit gradient of its shape) into the .grad of
// every leaf that requires grad. Without retain_graph, each node frees its saved tensors once used.
void backward(const Tensor& root, const Tensor& grad = {}, bool retain_graph = false);
}  // namespace autograd

}  // namespace frugal
