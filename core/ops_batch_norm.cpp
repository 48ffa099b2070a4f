// The fused batch norm ops (core/batch_norm.h): argument checks, the parameters in the compute type, and the
// calls into the op tables. The kernels are in kernels/cpu/batch_norm.cpp and kernels/cuda/batch_norm.cu.
#include "core/batch_norm.h"
#include "core/memory_history.h"

#include "core/ops.h"

namespace frugal {

constinit OpTable<BatchNormKernel> op_batch_norm{"batch_norm"};
constinit OpTable<BatchNormKernel> op_batch_norm_backward{"batch_norm_backward"};

namespace ops {
namespace {

bool is_half(DType t) { return t == DType::F16 || t == DType::BF16; }

// A [C] tensor in the compute type, contiguous (undefined stays undefined).
Tensor per_channel(const Tensor& t, DType compute) {
  return t.defined() ? ops::contiguous(ops::to(t, compute)) : t;
}

void check_per_channel(const char* op, const char* what, const Tensor& t, const Tensor& x) {
  if (!t.defined()) return;
  FRUGAL_CHECK_SHAPE(t.shape() == Shape{x.size(1)}, op, ": ", what, " must have shape [", x.size(1),
                     "] for input shape ", x.shape(), ", got ", t.shape());
  FRUGAL_CHECK_DTYPE(is_floating(t.dtype()), op, ": ", what, " must be floating, got ",
                     dtype_name(t.dtype()));
  FRUGAL_CHECK_T(DeviceError, t.device() == x.device(), op, ": ", what, " is on ", t.device(),
                 " but the input is on ", x.device());
}

void check_input(const char* op, const Tensor& x) {
  FRUGAL_CHECK(x.defined(), op, ": the input is undefined");
  FRUGAL_CHECK_DTYPE(is_floating(x.dtype()), op, ": expected a floating input, got ", dtype_name(x.dtype()),
                     " (shape ", x.shape(), ")");
  FRUGAL_CHECK_SHAPE(x.dim() >= 2, op, ": expected an input [N, C, ...] with at least 2 dims, got shape ",
                     x.shape());
}

// x as [n, c, hw].
void set_sizes(BatchNormArgs& a, const Tensor& x) {
  a.n = x.size(0);
  a.c = x.size(1);
  a.hw = 1;
  for (int d = 2; d < x.dim(); ++d) a.hw *= x.size(d);
}

// f16/bf16 on a device without a native kernel compute in f32 (as the other ops do; DESIGN.md, Precision).
bool via_f32(const OpTable<BatchNormKernel>& table, const Tensor& x) {
  return is_half(x.dtype()) && !table.has(x.device(), x.dtype());
}

}  // namespace

BatchNormResult batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                           const Tensor& running_mean, const Tensor& running_var, bool training, double eps) {
  memory::OpScope op_scope("batch_norm", x, weight);  // Note [op names in the history]
  const char* op = "batch_norm";
  check_input(op, x);
  check_per_channel(op, "weight", weight, x);
  check_per_channel(op, "bias", bias, x);
  check_per_channel(op, "running_mean", running_mean, x);
  check_per_channel(op, "running_var", running_var, x);
  FRUGAL_CHECK(training || (running_mean.defined() && running_var.defined()), op,
               ": without training, running_mean and running_var must be defined");
  BatchNormArgs a;
  set_sizes(a, x);
  FRUGAL_CHECK_SHAPE(!training || a.n * a.hw > 1, op,
                     ": expected more than 1 value per channel when training, got input shape ", x.shape());
  if (via_f32(op_batch_norm, x)) {
    BatchNormResult r =
        batch_norm(ops::to(x, DType::F32), weight, bias, running_mean, running_var, training, eps);
    r.y = ops::to(r.y, x.dtype());
    return r;
  }
  const DType cd = compute_dtype(x.dtype());
  const Tensor xc = ops::contiguous(x), w = per_channel(weight, cd), b = per_channel(bias, cd);
  BatchNormResult r;
  r.y = empty(x.shape(), x.options());
  if (training) {
    r.mean = empty({a.c}, x.options().dtype(cd));
    r.invstd = empty({a.c}, x.options().dtype(cd));
  } else {
    // As the composite computes them: 1 / sqrt(running_var + eps) in the compute type.
    r.mean = per_channel(running_mean, cd);
    r.invstd = rsqrt(add(per_channel(running_var, cd), eps));
  }
  if (x.numel() == 0) return r;
  a.x = xc.raw_data();
  a.weight = w.defined() ? w.raw_data() : nullptr;
  a.bias = b.defined() ? b.raw_data() : nullptr;
  a.y = r.y.raw_data();
  a.mean = r.mean.raw_data();
  a.invstd = r.invstd.raw_data();
  a.eps = eps;
  a.training = training;
  op_batch_norm.get(x.device(), x.dtype())(a);
  return r;
}

BatchNormGrads batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                   const Tensor& mean, const Tensor& invstd, bool training, double eps,
                                   bool need_dx, bool need_dweight, bool need_dbias) {
  memory::OpScope op_scope("batch_norm_backward", grad_out, x);  // Note [op names in the history]
  const char* op = "batch_norm_backward";
  check_input(op, x);
  FRUGAL_CHECK(grad_out.defined(), op, ": the output gradient is undefined");
  FRUGAL_CHECK_SHAPE(grad_out.shape() == x.shape(), op, ": the output gradient has shape ", grad_out.shape(),
                     " but the input has shape ", x.shape());
  FRUGAL_CHECK_DTYPE(grad_out.dtype() == x.dtype(), op, ": the output gradient is ",
                     dtype_name(grad_out.dtype()), " but the input is ", dtype_name(x.dtype()));
  FRUGAL_CHECK_T(DeviceError, grad_out.device() == x.device(), op, ": the output gradient is on ",
                 grad_out.device(), " but the input is on ", x.device());
  check_per_channel(op, "weight", weight, x);
  check_per_channel(op, "mean", mean, x);
  check_per_channel(op, "invstd", invstd, x);
  FRUGAL_CHECK(mean.defined() && invstd.defined(), op, ": mean and invstd must be defined");
  if (via_f32(op_batch_norm_backward, x)) {
    BatchNormGrads d = batch_norm_backward(ops::to(grad_out, DType::F32), ops::to(x, DType::F32), weight,
                                           mean, invstd, training, eps, need_dx, need_dweight, need_dbias);
    if (d.dx.defined()) d.dx = ops::to(d.dx, x.dtype());
    return d;
  }
  BatchNormArgs a;
  set_sizes(a, x);
  const DType cd = compute_dtype(x.dtype());
  const Tensor gc = ops::contiguous(grad_out), xc = ops::contiguous(x), w = per_channel(weight, cd),
               m = per_channel(mean, cd), is = per_channel(invstd, cd);
  BatchNormGrads d;
  if (need_dx) d.dx = empty(x.shape(), x.options());
  if (need_dweight) d.dweight = empty({a.c}, x.options().dtype(cd));
  if (need_dbias) d.dbias = empty({a.c}, x.options().dtype(cd));
  if (x.numel() == 0) {
    if (d.dweight.defined()) d.dweight = zeros({a.c}, x.options().dtype(cd));
    if (d.dbias.defined()) d.dbias = zeros({a.c}, x.options().dtype(cd));
    return d;
  }
  a.x = xc.raw_data();
  a.dy = gc.raw_data();
  a.weight = w.defined() ? w.raw_data() : nullptr;
  a.mean = m.raw_data();
  a.invstd = is.raw_data();
  a.dx = need_dx ? d.dx.raw_data() : nullptr;
  a.dweight = need_dweight ? d.dweight.raw_data() : nullptr;
  a.dbias = need_dbias ? d.dbias.raw_data() : nullptr;
  a.eps = eps;
  a.training = training;
  op_batch_norm_backward.get(x.device(), x.dtype())(a);
  return d;
}

}  // namespace ops
}  // namespace frugal
