// The fused layer normalisation ops (layer_norm and its backward): argument checks, the [rows, cols] view of
// the input, and the call into the op table. The kernels are in kernels/cpu/norm.cpp.
#include <algorithm>

#include "core/memory_history.h"
#include "core/op_table.h"
#include "core/op_table_norm.h"
#include "core/ops.h"

namespace frugal::ops {

namespace {

// Checks x against normalized_shape and returns the number of rows (the product of the leading dims).
int64_t check_layer_norm(const char* op, const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                         const Tensor& bias) {
  FRUGAL_CHECK(x.defined(), op, ": the input is undefined");
  FRUGAL_CHECK_DTYPE(is_floating(x.dtype()), op, ": expected a floating input (f32, f64, f16, bf16), got ",
                     dtype_name(x.dtype()), " (shape ", x.shape(), ")");
  const int k = normalized_shape.size();
  bool fits = k >= 1 && x.dim() >= k;
  for (int i = 0; fits && i < k; ++i) fits = x.shape()[x.dim() - k + i] == normalized_shape[i];
  FRUGAL_CHECK_SHAPE(fits, op, ": input shape ", x.shape(), " does not end with normalized_shape ",
                     normalized_shape, " (normalized_shape names the input's last dims)");
  auto check_param = [&](const Tensor& t, const char* what) {
    if (!t.defined()) return;
    FRUGAL_CHECK_SHAPE(t.shape() == normalized_shape, op, ": ", what, " shape ", t.shape(),
                       " must equal normalized_shape ", normalized_shape);
    FRUGAL_CHECK_DTYPE(is_floating(t.dtype()), op, ": expected a floating ", what, ", got ",
                       dtype_name(t.dtype()), " (shape ", t.shape(), ")");
    FRUGAL_CHECK_T(DeviceError, t.device() == x.device(), op, ": the ", what, " is on ", t.device(),
                   " but the input is on ", x.device(), "; move one with .to(device)");
  };
  check_param(weight, "weight");
  check_param(bias, "bias");
  return x.numel() / std::max<int64_t>(normalized_shape.numel(), 1);
}

// A parameter (or undefined) as a contiguous tensor of the compute dtype, as the kernels read it.
Tensor as_compute(const Tensor& t, DType c) { return t.defined() ? contiguous(ops::to(t, c)) : t; }

// The outputs of a backward whose inputs are in a already: d x of x_dtype and the shape of `like` (x or
// x-hat), d weight and d bias when asked for, through `table` keyed by x_dtype.
LayerNormGrads run_backward(const OpTable<LayerNormKernel>& table, LayerNormArgs& a, const Tensor& like,
                            DType x_dtype, const Shape& normalized_shape, bool need_dx, bool need_dweight,
                            bool need_dbias) {
  const DType c = compute_dtype(x_dtype);
  const TensorOptions opts = like.options().dtype(c);
  const int64_t cols = a.cols;
  // Chunks of at least 8192 elements for the partial sums of dweight and dbias, from the shape alone (so
  // the sums, and the results, are the same for every thread count).
  a.chunks = std::clamp<int64_t>(like.numel() / 8192, 1, std::max<int64_t>(1, std::min<int64_t>(a.rows, 64)));
  LayerNormGrads g;
  Tensor workspace;
  if (need_dx) {
    g.dx = empty(like.shape(), like.options().dtype(x_dtype));
    a.dx = g.dx.raw_data();
  }
  if (need_dweight) {
    g.dweight = empty(normalized_shape, opts);
    a.dweight = g.dweight.raw_data();
  }
  if (need_dbias) {
    g.dbias = empty(normalized_shape, opts);
    a.dbias = g.dbias.raw_data();
  }
  if (need_dweight || need_dbias) {
    workspace = empty({a.chunks, 2, cols}, opts);
    a.workspace = workspace.raw_data();
  }
  if (like.numel() > 0) {
    table.get(like.device(), x_dtype)(a);
  } else {
    if (g.dweight.defined()) fill_(g.dweight, 0);
    if (g.dbias.defined()) fill_(g.dbias, 0);
  }
  return g;
}

void check_stats(const char* op, const Tensor& stat, const char* what, int64_t rows, DType c) {
  FRUGAL_CHECK(stat.defined() && stat.numel() == rows && stat.dtype() == c, op, ": ", what,
               " must be layer_norm's [", rows, "] ", dtype_name(c), " statistics, got ",
               stat.defined() ? dtype_name(stat.dtype()) : "undefined", " ",
               stat.defined() ? stat.shape() : Shape{});
}

}  // namespace

bool has_layer_norm_xhat(Device device, DType dtype) {
  return op_layer_norm_xhat.has(device, dtype) && op_layer_norm_backward_xhat.has(device, dtype);
}

bool has_layer_norm_rounded(Device device, DType dtype) {
  return op_layer_norm_rounded.has(device, dtype) && op_layer_norm_affine.has(device, dtype) &&
         has_layer_norm_xhat(device, dtype);
}

namespace {

// layer_norm, or with `rounded` layer_norm_rounded (xhat_dtype then given).
LayerNormResult layer_norm_impl(const char* op, const Tensor& x, const Shape& normalized_shape,
                                const Tensor& weight, const Tensor& bias, double eps,
                                std::optional<DType> xhat_dtype, bool rounded) {
  memory::OpScope op_scope(op, x, weight);  // Note [op names in the history]
  const int64_t rows = check_layer_norm(op, x, normalized_shape, weight, bias);
  if (xhat_dtype) {
    FRUGAL_CHECK_DTYPE(is_floating(*xhat_dtype), op, ": x-hat can be kept in a floating dtype only, got ",
                       dtype_name(*xhat_dtype));
    FRUGAL_CHECK_T(
        DeviceError,
        rounded ? has_layer_norm_rounded(x.device(), x.dtype()) : has_layer_norm_xhat(x.device(), x.dtype()),
        op, rounded ? ": no rounded layer_norm kernels for " : ": no x-hat kernels for ",
        dtype_name(x.dtype()), " inputs on ", x.device());
  }
  const DType c = compute_dtype(x.dtype());
  const Tensor xc = contiguous(x), w = as_compute(weight, c), b = as_compute(bias, c);
  LayerNormResult r;
  r.y = empty(x.shape(), rounded ? x.options().dtype(*xhat_dtype) : x.options());
  r.mean = empty({rows}, x.options().dtype(c));
  r.rstd = empty({rows}, x.options().dtype(c));
  LayerNormArgs a;
  a.x = xc.raw_data();
  a.weight = w.defined() ? w.raw_data() : nullptr;
  a.bias = b.defined() ? b.raw_data() : nullptr;
  a.y = r.y.raw_data();
  a.mean = r.mean.raw_data();
  a.rstd = r.rstd.raw_data();
  a.rows = rows;
  a.cols = normalized_shape.numel();
  a.eps = eps;
  if (xhat_dtype) {
    r.xhat = empty(x.shape(), x.options().dtype(*xhat_dtype));
    a.xhat = r.xhat.raw_data();
    a.xhat_dtype = *xhat_dtype;
  }
  if (x.numel() > 0)
    (rounded      ? op_layer_norm_rounded
     : xhat_dtype ? op_layer_norm_xhat
                  : op_layer_norm)
        .get(x.device(), x.dtype())(a);
  return r;
}

}  // namespace

LayerNormResult layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                           const Tensor& bias, double eps, std::optional<DType> xhat_dtype) {
  return layer_norm_impl("layer_norm", x, normalized_shape, weight, bias, eps, xhat_dtype, false);
}

LayerNormResult layer_norm_rounded(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                                   const Tensor& bias, double eps, DType low) {
  return layer_norm_impl("layer_norm_rounded", x, normalized_shape, weight, bias, eps, low, true);
}

Tensor layer_norm_affine(const Tensor& xhat, DType x_dtype, const Tensor& weight, const Tensor& bias) {
  memory::OpScope op_scope("layer_norm_affine", xhat, weight);  // Note [op names in the history]
  const char* op = "layer_norm_affine";
  FRUGAL_CHECK(xhat.defined() && xhat.dim() >= 1, op, ": x-hat must be a defined tensor of at least 1 dim");
  const Shape normalized{xhat.size(-1)};
  const int64_t rows = check_layer_norm(op, xhat, normalized, weight, bias);
  FRUGAL_CHECK_DTYPE(is_floating(x_dtype), op, ": expected the floating dtype of layer_norm's input, got ",
                     dtype_name(x_dtype));
  FRUGAL_CHECK_T(DeviceError, has_layer_norm_rounded(xhat.device(), x_dtype), op,
                 ": no rounded layer_norm kernels for ", dtype_name(x_dtype), " inputs on ", xhat.device());
  const DType c = compute_dtype(x_dtype);
  const Tensor xc = contiguous(xhat), w = as_compute(weight, c), b = as_compute(bias, c);
  Tensor y = empty(xhat.shape(), xhat.options());
  LayerNormArgs a;
  a.xhat = xc.raw_data();
  a.xhat_dtype = xhat.dtype();
  a.weight = w.defined() ? w.raw_data() : nullptr;
  a.bias = b.defined() ? b.raw_data() : nullptr;
  a.y = y.raw_data();
  a.rows = rows;
  a.cols = normalized.numel();
  if (xhat.numel() > 0) op_layer_norm_affine.get(xhat.device(), x_dtype)(a);
  return y;
}

LayerNormGrads layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Shape& normalized_shape,
                                   const Tensor& weight, const Tensor& mean, const Tensor& rstd, bool need_dx,
                                   bool need_dweight, bool need_dbias) {
  memory::OpScope op_scope("layer_norm_backward", grad_out, x);  // Note [op names in the history]
  const char* op = "layer_norm_backward";
  const int64_t rows = check_layer_norm(op, x, normalized_shape, weight, {});
  FRUGAL_CHECK(grad_out.defined() && grad_out.shape() == x.shape(), op, ": the gradient's shape ",
               grad_out.defined() ? grad_out.shape() : Shape{}, " differs from the input's ", x.shape());
  const DType c = compute_dtype(x.dtype());
  check_stats(op, mean, "mean", rows, c);
  check_stats(op, rstd, "rstd", rows, c);
  const Tensor xc = contiguous(x), w = as_compute(weight, c), mc = contiguous(mean), rc = contiguous(rstd);
  const Tensor dy = contiguous(ops::to(grad_out, x.dtype()));
  LayerNormArgs a;
  a.x = xc.raw_data();
  a.dy = dy.raw_data();
  a.weight = w.defined() ? w.raw_data() : nullptr;
  a.mean = mc.raw_data();
  a.rstd = rc.raw_data();
  a.rows = rows;
  a.cols = normalized_shape.numel();
  return run_backward(op_layer_norm_backward, a, x, x.dtype(), normalized_shape, need_dx,
                      need_dweight && weight.defined(), need_dbias);
}

LayerNormGrads layer_norm_backward_xhat(const Tensor& grad_out, const Tensor& xhat, DType x_dtype,
                                        const Shape& normalized_shape, const Tensor& weight,
                                        const Tensor& rstd, bool need_dx, bool need_dweight,
                                        bool need_dbias) {
  memory::OpScope op_scope("layer_norm_backward", grad_out, xhat);  // Note [op names in the history]
  const char* op = "layer_norm_backward_xhat";
  const int64_t rows = check_layer_norm(op, xhat, normalized_shape, weight, {});
  FRUGAL_CHECK_DTYPE(is_floating(x_dtype), op, ": expected the floating dtype of layer_norm's input, got ",
                     dtype_name(x_dtype));
  FRUGAL_CHECK_T(DeviceError, has_layer_norm_xhat(xhat.device(), x_dtype), op, ": no x-hat kernels for ",
                 dtype_name(x_dtype), " inputs on ", xhat.device());
  FRUGAL_CHECK(grad_out.defined() && grad_out.shape() == xhat.shape(), op, ": the gradient's shape ",
               grad_out.defined() ? grad_out.shape() : Shape{}, " differs from x-hat's ", xhat.shape());
  const DType c = compute_dtype(x_dtype);
  check_stats(op, rstd, "rstd", rows, c);
  const Tensor xc = contiguous(xhat), w = as_compute(weight, c), rc = contiguous(rstd);
  // d x-hat in x-hat's 16-bit dtype under an f32 x (autocast): the CPU's kernel reads it as it is, without a
  // cast to f32 (a pass and a tensor of x's size); everywhere else the gradient comes in x's dtype.
  const bool dy_as_is = !xhat.device().is_cuda() && x_dtype == DType::F32 &&
                        grad_out.dtype() == xhat.dtype() &&
                        (xhat.dtype() == DType::BF16 || xhat.dtype() == DType::F16);
  const Tensor dy = contiguous(dy_as_is ? grad_out : ops::to(grad_out, x_dtype));
  LayerNormArgs a;
  a.xhat = xc.raw_data();
  a.xhat_dtype = xhat.dtype();
  a.dy = dy.raw_data();
  if (dy_as_is) a.dy_dtype = dy.dtype();
  a.weight = w.defined() ? w.raw_data() : nullptr;
  a.rstd = rc.raw_data();
  a.rows = rows;
  a.cols = normalized_shape.numel();
  return run_backward(op_layer_norm_backward_xhat, a, xhat, x_dtype, normalized_shape, need_dx,
                      need_dweight && weight.defined(), need_dbias);
}

}  // namespace frugal::ops
