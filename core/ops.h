// The ops on tensors. Each checks its inputs (throwing an Error that names the op, shapes, dtypes and
// devices), allocates its result from the arena, and runs the kernel the op table holds for (device, dtype).
//
//   Tensor y = relu(matmul(x, w) + b);
//   Tensor p = softmax(y, -1);
//   Tensor i = argmax(p, -1);
#pragma once

#include <concepts>
#include <optional>
#include <utility>
#include <vector>

#include "op_list.h"
#include "tensor.h"

namespace frugal::ops {

// The elementwise ops of core/op_list.h, generated from it (name, dtypes and parameters there):
//   Tensor exp(const Tensor& x);                               one input
//   Tensor clamp(const Tensor& x, Scalar min, Scalar max);      one input and two parameters
//   Tensor add(const Tensor& a, const Tensor& b);               two inputs, broadcasting and promotion
//   Tensor add(const Tensor& a, Scalar b), add(Scalar a, const Tensor& b);  a Scalar takes the tensor's dtype
//   Tensor eq(const Tensor& a, const Tensor& b), eq(const Tensor& a, Scalar b);  bool results
// and, where the list says inplace, the result written into `self` (which must already have the broadcast
// shape) converted to its dtype, bumping the storage's version counter:
//   Tensor& relu_(Tensor& self);  Tensor& add_(Tensor& self, const Tensor& other);  add_(self, Scalar)
// Ops of a floating class refuse other dtypes with a message; div (true division) computes integers in f32.
FRUGAL_DECLARE_ELEMENTWISE_OPS()
#define FRUGAL_OPS_COMPARE(name, F)              \
  Tensor name(const Tensor& a, const Tensor& b); \
  Tensor name(const Tensor& a, Scalar b);
FRUGAL_COMPARE_OP_LIST(FRUGAL_OPS_COMPARE)
#undef FRUGAL_OPS_COMPARE

// Hand-written elementwise ops (core/op_list.h says why).
Tensor clamp_min(const Tensor& x, Scalar min);
Tensor clamp_max(const Tensor& x, Scalar max);
// GELU's gradients in one pass, d y * gelu'(x), for d y and x of one shape (d y is converted to x's dtype).
Tensor gelu_backward(const Tensor& grad_out, const Tensor& x);
Tensor gelu_tanh_backward(const Tensor& grad_out, const Tensor& x);
// gelu(x), and grad (d y: contiguous, of x's shape, dtype and device, not x's memory) overwritten with
// gelu_backward(grad, x): one pass over x, erf computed once, both results those of the two ops bit for bit
// (Note [gelu_linear's backward in one pass over x]). Only where has_gelu_and_backward(x).
Tensor gelu_and_backward_(Tensor& grad, const Tensor& x);
bool has_gelu_and_backward(const Tensor& x);
// ReLU's gradient from its output y in one pass: y > 0 ? d y : 0 (d y converted to y's dtype).
Tensor relu_backward(const Tensor& grad_out, const Tensor& y);
// cond ? a : b, elementwise with broadcasting; cond is bool.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// self = src, broadcast and converted to self's dtype, from any device; self = value.
Tensor& copy_(Tensor& self, const Tensor& src);
Tensor& fill_(Tensor& self, Scalar value);
// A 0-d tensor for a Scalar operand beside `like`: like's dtype, unless like is integral or bool and the
// value is not a whole number (then f32), or like is bool (then i64).
Tensor wrap_scalar(const Tensor& like, Scalar value);

// The ops of core/op_list.h's FRUGAL_TENSOR_OP_LIST, generated from it (what each does is written there):
//   views (view, reshape, flatten, transpose, permute, narrow, slice, select, expand, squeeze, unsqueeze),
//   copies (contiguous, clone), reductions (sum, mean, max, min, var, argmax, argmin), softmax,
//   log_softmax, matmul, cast and indexing (index_select, gather, scatter_add, one_hot):
//   Tensor sum(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
FRUGAL_TENSOR_OP_LIST(FRUGAL_DECLARE_TENSOR_OP)

// A view with the given shape, strides (in elements) and element offset from x's start; every element it
// reaches must lie inside x's storage. Elements may overlap, as in PyTorch.
Tensor as_strided(const Tensor& x, const Shape& shape, const Shape& strides, int64_t element_offset);
Tensor to(const Tensor& x, DType dtype);    // x itself when the dtype already matches
Tensor to(const Tensor& x, Device device);  // x itself when already there

// What max / min along a dim return: both members, or unpacked, auto [values, indices] = max(x, 1);
struct ValuesIndices {
  Tensor values;   // the extreme elements, x's dtype
  Tensor indices;  // their positions along the dim, i64
};
FRUGAL_DECLARE_DIM_EXTREMES()

// A copy of x with src's slices added at the positions a 1-d index names along dim (duplicates accumulate):
// out.select(dim, index[i]) += src.select(dim, i). index_select's gradient.
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
// Joins tensors along an existing dim; shapes must match elsewhere, dtypes promote.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
// {min, max} of a non-empty integer tensor, on the host, for bounds checks of indices: on a GPU one reduction
// and one copy, so one wait for the device (Note [index bounds on a GPU] in core/ops_index.cpp).
std::pair<int64_t, int64_t> integer_range(const Tensor& x);

}  // namespace frugal::ops

namespace frugal {
// A (height, width) pair of sizes for the 2-D ops; one number means both: Size2 k = 3; Size2 s{2, 1};
struct Size2 {
  int64_t h = 0, w = 0;
  Size2() = default;
  Size2(int64_t both) : h(both), w(both) {}  // NOLINT: implicit by design, as PyTorch's ExpandingArray
  Size2(int64_t h_, int64_t w_) : h(h_), w(w_) {}
  friend bool operator==(const Size2&, const Size2&) = default;
};
}  // namespace frugal

namespace frugal::ops {

// 2-D convolution (cross-correlation, as PyTorch's conv2d): x [N, C, H, W], weight [O, C / groups, kH, kW],
// bias [O] or undefined; y [N, O, OH, OW] with OH = (H + 2 padding.h - dilation.h (kH - 1) - 1) / stride.h +
// 1 (OW likewise). Floating dtypes; f16/bf16 compute in f32 where the device has no native kernel.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, Size2 stride = 1,
              Size2 padding = 0, Size2 dilation = 1, int64_t groups = 1);
// Its gradients: d x (of shape x_shape) and d weight (of shape weight_shape) from d y, and d bias (the sum of
// d y over N, OH, OW; undefined unless with_bias).
Tensor conv2d_backward_data(const Tensor& grad_out, const Tensor& weight, const Shape& x_shape, Size2 stride,
                            Size2 padding, Size2 dilation, int64_t groups);
std::pair<Tensor, Tensor> conv2d_backward_weight(const Tensor& grad_out, const Tensor& x,
                                                 const Shape& weight_shape, Size2 stride, Size2 padding,
                                                 Size2 dilation, int64_t groups, bool with_bias);
// conv2d's gradients in one call, as its rule wants them: d x (when need_dx; weight needed), d weight and d
// bias (when need_dweight / need_dbias; x needed) from d y; with relu_y defined (conv2d_relu's output), from
// d z = relu_y > 0 ? d y : 0. Where the device has the fused kernel (op_conv2d_backward; on the CPU oneDNN's
// primitives, d z written once in the layout both want, in one pass with the mask) and d weight is needed;
// else relu_backward and the two ops above. The same values either way, bit for bit.
struct ConvGrads {
  Tensor dx, dweight, dbias;
};
ConvGrads conv2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& relu_y,
                          const Shape& x_shape, const Shape& weight_shape, Size2 stride, Size2 padding,
                          Size2 dilation, int64_t groups, bool need_dx, bool need_dweight, bool need_dbias);
// relu(conv2d(...)) with the same checks and values, a NaN and a -0 included: on the CPU the convolution's
// kernel, then relu's rule in one pass over y in place (Note [conv2d_relu keeps a NaN] in
// kernels/cpu/conv.cpp); conv2d then relu_ on other devices. No buffer for the value before the ReLU either
// way.
Tensor conv2d_relu(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, Size2 stride = 1,
                   Size2 padding = 0, Size2 dilation = 1, int64_t groups = 1);
// max_pool2d(conv2d_relu(...), 2): the same checks and values, bit for bit, for inference (nothing is
// recorded for backward). Where the device has the fused kernel (op_conv2d_relu_pool2; on the CPU in f32:
// Note [a convolution pooled from its blocked output], kernels/cpu/conv.cpp) the convolution's output exists
// a chunk of images at a time, pooled from oneDNN's blocked layout without a reorder to NCHW where the pool
// can read that layout; elsewhere the two ops run in turn.
Tensor conv2d_relu_pool2(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, Size2 stride = 1,
                         Size2 padding = 0, Size2 dilation = 1, int64_t groups = 1);
// Whether conv2d_relu_pool2 has its fused kernel for x's device and dtype.
bool has_conv2d_relu_pool2(Device device, DType dtype);

// 2-D pooling over x [N, C, H, W] (or [C, H, W]); stride defaults to the kernel; padding at most half the
// (effective) kernel. max_pool2d_with_indices also returns, as i64, where each maximum came from (h * W + w
// within its plane), which max_pool2d_backward scatters d y back to; a window with no tap in the input
// (possible with dilation) is -inf at index -1, and passes no gradient (Note [a window with no tap],
// kernels/cpu/pool.cpp). max_pool2d_backward refuses, with an IndexError, an index outside [-1, H W) on the
// CPU; a GPU skips it without saying so.
Tensor max_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride = {}, Size2 padding = 0,
                  Size2 dilation = 1);
std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& x, Size2 kernel,
                                                  std::optional<Size2> stride = {}, Size2 padding = 0,
                                                  Size2 dilation = 1);
Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& x_shape);
// count_include_pad: padding zeros count in each window's divisor.
Tensor avg_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride = {}, Size2 padding = 0,
                  bool count_include_pad = true);
Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& x_shape, Size2 kernel, Size2 stride,
                           Size2 padding, bool count_include_pad);

// Layer normalisation over the trailing dims of x named by normalized_shape, in one fused pass per row:
// y = (x - mean) / sqrt(var + eps) * weight + bias (biased variance; weight and bias of normalized_shape, or
// undefined). y has x's dtype; f16/bf16 compute in f32, and weight and bias are used in that compute type.
// Also returns each row's mean and 1 / sqrt(var + eps) ([rows], the compute type) for the backward, and
// with xhat_dtype (a floating dtype, where has_layer_norm_xhat) x-hat = (x - mean) rstd rounded to it, x's
// shape, for layer_norm_backward_xhat; y is the same bit for bit with or without it.
struct LayerNormResult {
  Tensor y, mean, rstd;
  Tensor xhat;  // undefined without xhat_dtype
};
LayerNormResult layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {},
                           const Tensor& bias = {}, double eps = 1e-5,
                           std::optional<DType> xhat_dtype = std::nullopt);
// Whether layer_norm can return x-hat for inputs of this device and dtype (the device has the x-hat kernels).
bool has_layer_norm_xhat(Device device, DType dtype);
// layer_norm whose y is rounded to `low` and made from x-hat rounded to `low`: y = low(low(x-hat) weight +
// bias), returned with that x-hat, mean and rstd. A Linear's input under autocast, which layer_norm_affine
// makes again from x-hat alone (Note [layer norm before a Linear under autocast], autograd/grad_linear.cpp).
LayerNormResult layer_norm_rounded(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                                   const Tensor& bias, double eps, DType low);
// layer_norm_rounded's y from its x-hat (over the last dim), bit for bit; x_dtype is the dtype of the x that
// xhat came from (the kernels and the weight's compute type are its).
Tensor layer_norm_affine(const Tensor& xhat, DType x_dtype, const Tensor& weight = {},
                         const Tensor& bias = {});
// Whether the device has layer_norm_rounded's and layer_norm_affine's kernels (and the x-hat backward's) for
// x of this dtype.
bool has_layer_norm_rounded(Device device, DType dtype);
// Its gradients from d y: d x (when need_dx; x's dtype) and d weight, d bias (when asked for, d weight only
// with a weight; in the compute type). mean and rstd are layer_norm's.
struct LayerNormGrads {
  Tensor dx, dweight, dbias;
};
LayerNormGrads layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Shape& normalized_shape,
                                   const Tensor& weight, const Tensor& mean, const Tensor& rstd, bool need_dx,
                                   bool need_dweight, bool need_dbias);
// The same from layer_norm's x-hat and rstd instead of x and mean (x itself no longer needed): d x of
// x_dtype, the dtype of the x that xhat came from.
LayerNormGrads layer_norm_backward_xhat(const Tensor& grad_out, const Tensor& xhat, DType x_dtype,
                                        const Shape& normalized_shape, const Tensor& weight,
                                        const Tensor& rstd, bool need_dx, bool need_dweight, bool need_dbias);

// The affine map of a linear layer as one GEMM: y [M, out] = x [M, in] weight^T + bias, x, weight [out, in]
// and bias [out] (or undefined) of one floating dtype that has a GEMM kernel on their device. Where the
// device registers a fused linear kernel (op_linear: f32 and bf16 on the CPU with oneDNN), that one call:
// the weight read as its transpose in place and the bias added as y is stored. Elsewhere the bias fills y
// first, the weight is transposed into [in, out] and the GEMM adds onto y.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});
// Its gradients from d y [M, out]: d x = d y weight (when need_dx; weight needed), d weight = d y^T x, in
// weight's [out, in] layout (when need_dweight; x needed), d bias = the column sums of d y (when need_dbias).
struct LinearGrads {
  Tensor dx, dweight, dbias;
};
LinearGrads linear_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, bool need_dx,
                            bool need_dweight, bool need_dbias);
// relu(linear(x, weight, bias)) with the same checks: the fused kernel where the device registers one
// (op_linear: on the CPU linear's primitive, then relu's rule in one pass over y, a NaN kept as relu keeps
// it: Note [linear_relu keeps a NaN] in kernels/cpu/linear.cpp, tests/nn/test_linear_relu.cpp); linear then
// relu_ elsewhere.
Tensor linear_relu(const Tensor& x, const Tensor& weight, const Tensor& bias = {});
// Its gradients from d y and y, its output: d z = y > 0 ? d y : 0, then linear_backward's from d z; d bias
// and d z come from one pass (op_relu_backward_bias) where the device has it, with exactly the values of
// relu_backward and sum(d z, {0}) when out > 1. With overwrite_grad (the caller's d y is its own, contiguous,
// and not needed after), d z is written over d y instead of into a new buffer.
LinearGrads linear_relu_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                 const Tensor& y, bool need_dx, bool need_dweight, bool need_dbias,
                                 bool overwrite_grad = false);

}  // namespace frugal::ops
