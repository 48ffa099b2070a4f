// The fused linear layer (linear and its backward, and linear_relu with the ReLU fused in): checks, then GEMM
// calls through the op tables. The differentiable wrappers are autograd/grad_linear.cpp; their references,
// nn::functional::linear_composite and relu of it.
#include <algorithm>

#include "core/memory_history.h"
#include "core/op_table_linalg.h"
#include "core/ops.h"

namespace frugal::ops {

namespace {

void check_linear(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  FRUGAL_CHECK(x.defined() && weight.defined(), op, ": the input or the weight is undefined");
  FRUGAL_CHECK_SHAPE(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), op,
                     ": expected x [M, in] and weight [out, in], got shapes ", x.shape(), " and ",
                     weight.shape());
  FRUGAL_CHECK_SHAPE(!bias.defined() || bias.shape() == Shape{weight.size(0)}, op,
                     ": the bias must have shape [", weight.size(0), "], got ", bias.shape());
  FRUGAL_CHECK_DTYPE(
      is_floating(x.dtype()) && weight.dtype() == x.dtype() && (!bias.defined() || bias.dtype() == x.dtype()),
      op, ": expected x, weight and bias of one floating dtype, got ", dtype_name(x.dtype()), ", ",
      dtype_name(weight.dtype()), " and ", bias.defined() ? dtype_name(bias.dtype()) : "no bias");
  FRUGAL_CHECK_T(DeviceError,
                 weight.device() == x.device() && (!bias.defined() || bias.device() == x.device()), op,
                 ": x, weight and bias must be on one device");
}

// C [m, n] = A [m, k] B [k, n] (+ C when accumulate); A and B given by (row, col) strides in elements.
void gemm(const void* a, int64_t a_row, int64_t a_col, const void* b, int64_t b_row, int64_t b_col, Tensor& c,
          int64_t k, bool accumulate) {
  GemmArgs g;
  g.m = c.size(0);
  g.n = c.size(1);
  g.k = k;
  g.a = a;
  g.a_row = a_row;
  g.a_col = a_col;
  g.b = b;
  g.b_row = b_row;
  g.b_col = b_col;
  g.c = c.raw_data();
  g.c_row = g.n;
  g.beta = accumulate ? 1.0f : 0.0f;
  if (c.numel() == 0) return;
  if (k == 0) {
    if (!accumulate) ops::fill_(c, 0);
    return;
  }
  const double operands = double(g.m * k + k * g.n + (accumulate ? g.m * g.n : 0)) * double(c.element_size());
  detail::count_flops(c.device(), 2.0 * double(g.m) * double(g.n) * double(k), operands);
  op_gemm.get(c.device(), c.dtype())(g);
}

}  // namespace

namespace {

// y = x w^T + bias (relu: then max(y, 0)) through the device's fused kernel, which the caller checked exists.
Tensor fused_linear(const Tensor& x_in, const Tensor& weight, const Tensor& bias, bool relu) {
  const Tensor x = contiguous(x_in), w = contiguous(weight), b = bias.defined() ? contiguous(bias) : Tensor();
  Tensor y = empty({x.size(0), w.size(0)}, x.options());
  LinearArgs a;
  a.m = x.size(0);
  a.n = w.size(0);
  a.k = x.size(1);
  a.x = x.raw_data();
  a.w = w.raw_data();
  a.bias = b.defined() ? b.raw_data() : nullptr;
  a.y = y.raw_data();
  a.relu = relu;
  detail::count_flops(x.device(), 2.0 * double(a.m) * double(a.n) * double(a.k),
                      double(x.nbytes() + w.nbytes()));
  op_linear.get(x.device(), x.dtype())(a);
  return y;
}

bool has_fused_linear(const Tensor& x, const Tensor& weight) {
  return op_linear.has(x.device(), x.dtype()) && x.size(0) > 0 && x.size(1) > 0 && weight.size(0) > 0;
}

}  // namespace

Tensor linear(const Tensor& x_in, const Tensor& weight, const Tensor& bias) {
  memory::OpScope op_scope("linear", x_in, weight, bias);  // Note [op names in the history]
  check_linear("linear", x_in, weight, bias);
  if (has_fused_linear(x_in, weight)) return fused_linear(x_in, weight, bias, false);
  const Tensor x = contiguous(x_in);
  const int64_t m = x.size(0), in = x.size(1), out = weight.size(0);
  Tensor y = empty({m, out}, x.options());
  if (bias.defined()) copy_(y, ops::expand(bias, {m, out}));
  // B = weight^T [in, out]: a contiguous weight is read in place as that transpose (every device's GEMM
  // reads a transposed operand), so it is never copied; any other layout (or a single input column, whose
  // in-place view has no usable stride) through a transposing copy.
  if (weight.is_contiguous() && in > 1) {
    gemm(x.raw_data(), in, 1, weight.raw_data(), 1, in, y, in, bias.defined());
  } else {
    const Tensor wt = contiguous(ops::transpose(weight, 0, 1));
    gemm(x.raw_data(), in, 1, wt.raw_data(), out, 1, y, in, bias.defined());
  }
  return y;
}

LinearGrads linear_backward(const Tensor& grad_out, const Tensor& x_in, const Tensor& weight, bool need_dx,
                            bool need_dweight, bool need_dbias) {
  const char* op = "linear_backward";
  FRUGAL_CHECK(grad_out.defined() && grad_out.dim() == 2, op, ": expected a 2-D gradient [M, out]");
  FRUGAL_CHECK(!need_dx || weight.defined(), op, ": d x needs the weight");
  FRUGAL_CHECK(!need_dweight || x_in.defined(), op, ": d weight needs x");
  const Tensor g = contiguous(grad_out);
  const int64_t m = g.size(0), out = g.size(1);
  LinearGrads r;
  if (need_dx) {
    FRUGAL_CHECK_SHAPE(weight.dim() == 2 && weight.size(0) == out && weight.dtype() == g.dtype(), op,
                       ": the weight ", weight.shape(), " does not fit the gradient ", g.shape());
    const Tensor w = contiguous(weight);
    r.dx = empty({m, w.size(1)}, g.options());
    gemm(g.raw_data(), out, 1, w.raw_data(), w.size(1), 1, r.dx, out, false);  // [M, out] [out, in]
  }
  if (need_dweight) {
    FRUGAL_CHECK_SHAPE(x_in.dim() == 2 && x_in.size(0) == m && x_in.dtype() == g.dtype(), op, ": x ",
                       x_in.shape(), " does not fit the gradient ", g.shape());
    const Tensor x = contiguous(x_in);
    r.dweight = empty({out, x.size(1)}, g.options());
    gemm(g.raw_data(), 1, out, x.raw_data(), x.size(1), 1, r.dweight, m, false);  // [out, M] [M, in]
  }
  if (need_dbias) r.dbias = sum(g, {0});
  return r;
}

Tensor linear_relu(const Tensor& x_in, const Tensor& weight, const Tensor& bias) {
  memory::OpScope op_scope("linear_relu", x_in, weight, bias);  // Note [op names in the history]
  check_linear("linear_relu", x_in, weight, bias);
  if (has_fused_linear(x_in, weight)) return fused_linear(x_in, weight, bias, true);
  Tensor y = linear(x_in, weight, bias);
  return relu_(y);
}

LinearGrads linear_relu_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                 const Tensor& y, bool need_dx, bool need_dweight, bool need_dbias,
                                 bool overwrite_grad) {
  const char* op = "linear_relu_backward";
  FRUGAL_CHECK(grad_out.defined() && grad_out.dim() == 2 && y.defined(), op,
               ": expected a 2-D gradient [M, out] and the layer's output");
  FRUGAL_CHECK_SHAPE(y.shape() == grad_out.shape(), op, ": the output's shape ", y.shape(),
                     " differs from the gradient's ", grad_out.shape());
  FRUGAL_CHECK_DTYPE(is_floating(y.dtype()) && grad_out.dtype() == y.dtype(), op,
                     ": expected a gradient and an output of one floating dtype, got ",
                     dtype_name(grad_out.dtype()), " and ", dtype_name(y.dtype()));
  FRUGAL_CHECK_T(DeviceError, grad_out.device() == y.device(), op, ": the gradient is on ", grad_out.device(),
                 " but the output is on ", y.device());
  Tensor gz, dbias;
  if (need_dbias && op_relu_backward_bias.has(y.device(), y.dtype()) && y.numel() > 0) {
    const Tensor g = contiguous(grad_out), yc = contiguous(y);
    // Over d y: each element is read before it is written.
    if (overwrite_grad && g.is_same(grad_out) && !g.is_same(yc)) {
      gz = g;
      gz.storage()->bump_version();
    } else {
      gz = empty(g.shape(), g.options());
    }
    dbias = empty({g.size(1)}, g.options());
    ReluBackwardBiasArgs a;
    a.rows = g.size(0);
    a.cols = g.size(1);
    a.g = g.raw_data();
    a.y = yc.raw_data();
    a.gz = gz.raw_data();
    a.dbias = dbias.raw_data();
    op_relu_backward_bias.get(y.device(), y.dtype())(a);
  } else {
    gz = relu_backward(grad_out, y);
    if (need_dbias) dbias = sum(gz, {0});
  }
  LinearGrads r = linear_backward(gz, x, weight, need_dx, need_dweight, false);
  r.dbias = dbias;
  return r;
}

}  // namespace frugal::ops
