// Elementwise ops: input checks, broadcasting and type promotion, then one kernel call through the op table.
#include <cmath>

#include "core/op_table.h"
#include "core/op_table_copy.h"
#include "core/ops.h"

namespace frugal::ops {

namespace {

void check_defined(const Tensor& t, const char* op, const char* what) {
  FRUGAL_CHECK(t.defined(), op, ": the ", what, " tensor is undefined");
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  FRUGAL_CHECK_T(DeviceError, a.device() == b.device(), op, ": tensors on different devices (", a.device(),
                 " with shape ", a.shape(), " and ", b.device(), " with shape ", b.shape(),
                 "); move one with .to(device)");
}

void check_floating(const char* op, const Tensor& x) {
  FRUGAL_CHECK_DTYPE(is_floating(x.dtype()), op, ": expected a floating dtype (f32, f64, f16, bf16), got ",
                     dtype_name(x.dtype()), " (shape ", x.shape(), "); convert first, e.g. x.to(DType::F32)");
}

// The dtype a Scalar takes beside a tensor of dtype t: t itself, unless t is integral or bool and the value
// is not a whole number (then f32), or t is bool and the value is a number (then i64).
DType scalar_dtype(DType t, Scalar v) {
  if (is_floating(t)) return t;
  if (v != std::floor(v)) return DType::F32;
  return t == DType::Bool ? DType::I64 : t;
}

Tensor unary(OpTable<ElementwiseKernel>& table, const Tensor& x, bool floating_only, OpArgs args = {}) {
  check_defined(x, table.name(), "input");
  if (floating_only) check_floating(table.name(), x);
  Tensor out = empty(x.shape(), x.options());
  table.get(x.device(), x.dtype())(make_loop({&out, &x}), args);
  return out;
}

// Converts both operands to their promoted dtype (or to `compute`) and returns the broadcast shape.
Shape prepare_binary(const char* op, const Tensor& a, const Tensor& b, DType compute, Tensor& a2,
                     Tensor& b2) {
  check_defined(a, op, "first");
  check_defined(b, op, "second");
  check_same_device(op, a, b);
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), op);
  a2 = a.to(compute);
  b2 = b.to(compute);
  return shape;
}

Tensor binary(OpTable<ElementwiseKernel>& table, const Tensor& a, const Tensor& b,
              bool true_division = false) {
  check_defined(a, table.name(), "first");
  check_defined(b, table.name(), "second");
  DType t = promote_types(a.dtype(), b.dtype());
  if (true_division && !is_floating(t)) t = DType::F32;
  Tensor a2, b2;
  const Shape shape = prepare_binary(table.name(), a, b, t, a2, b2);
  Tensor out = empty(shape, a2.options());
  table.get(a.device(), t)(make_loop({&out, &a2, &b2}), {});
  return out;
}

Tensor compare(OpTable<ElementwiseKernel>& table, const Tensor& a, const Tensor& b) {
  check_defined(a, table.name(), "first");
  check_defined(b, table.name(), "second");
  const DType t = promote_types(a.dtype(), b.dtype());
  Tensor a2, b2;
  const Shape shape = prepare_binary(table.name(), a, b, t, a2, b2);
  Tensor out = empty(shape, TensorOptions(DType::Bool).device(a.device()));
  table.get(a.device(), t)(make_loop({&out, &a2, &b2}), {});
  return out;
}

// self = op(self, other), computed in self's dtype; other must broadcast to self's shape.
Tensor& inplace(OpTable<ElementwiseKernel>& table, Tensor& self, const Tensor& other) {
  check_defined(self, table.name(), "first");
  check_defined(other, table.name(), "second");
  check_same_device(table.name(), self, other);
  const Shape shape = broadcast_shapes(self.shape(), other.shape(), table.name());
  FRUGAL_CHECK_SHAPE(shape == self.shape(), table.name(), "_: the result's shape ", shape,
                     " differs from the shape ", self.shape(), " of the tensor written in place");
  const Tensor o = other.to(self.dtype());
  table.get(self.device(), self.dtype())(make_loop({&self, &self, &o}), {});
  self.storage()->bump_version();
  return self;
}

// A copy across devices moves the bytes once, contiguous and already of the destination's dtype and shape;
// the conversion happens on the cpu side, so a device needs no kernel for a dtype merely to hold it. Between
// two GPUs the bytes go through the host.
Tensor& copy_between_devices(Tensor& self, const Tensor& src) {
  if (!self.device().is_cpu() && !src.device().is_cpu()) {
    Tensor host = empty(src.shape(), src.options().device(kCPU));
    copy_(host, src);
    return copy_(self, host);
  }
  DeviceCopyArgs a;
  Tensor from, to;
  if (src.device().is_cpu()) {
    Tensor s = src.dtype() == self.dtype() ? src : cast(src, self.dtype());
    from = contiguous(s.shape() == self.shape() ? s : s.expand(self.shape()));
    to = self.is_contiguous() ? self : empty(self.shape(), self.options());
  } else {
    from = contiguous(src);
    const bool direct = self.is_contiguous() && self.dtype() == src.dtype() && self.shape() == src.shape();
    to = direct ? self : empty(src.shape(), src.options().device(kCPU));
  }
  a.dst = to.raw_data();
  a.src = from.raw_data();
  a.nbytes = from.nbytes();
  a.dst_device = to.device();
  a.src_device = from.device();
  const Device gpu = src.device().is_cpu() ? self.device() : src.device();
  if (a.nbytes > 0) op_copy_between_devices.get(gpu, from.dtype())(a);
  if (!to.is_same(self)) copy_(self, to);
  self.storage()->bump_version();
  return self;
}

}  // namespace

Tensor wrap_scalar(const Tensor& like, Scalar value) {
  return scalar_tensor(value, like.options().dtype(scalar_dtype(like.dtype(), value)));
}

#define FRUGAL_UNARY(name, floating_only) \
  Tensor name(const Tensor& x) { return unary(op_##name, x, floating_only); }
FRUGAL_UNARY(neg, false)
FRUGAL_UNARY(abs, false)
FRUGAL_UNARY(relu, false)
FRUGAL_UNARY(exp, true)
FRUGAL_UNARY(log, true)
FRUGAL_UNARY(sqrt, true)
FRUGAL_UNARY(rsqrt, true)
FRUGAL_UNARY(gelu, true)
FRUGAL_UNARY(gelu_tanh, true)
FRUGAL_UNARY(sigmoid, true)
FRUGAL_UNARY(tanh, true)
FRUGAL_UNARY(silu, true)
FRUGAL_UNARY(erf, true)
#undef FRUGAL_UNARY

Tensor clamp(const Tensor& x, Scalar min, Scalar max) {
  FRUGAL_CHECK(!(min > max), "clamp: min ", min, " is greater than max ", max);
  return unary(op_clamp, x, false, {min, max});
}
Tensor clamp_min(const Tensor& x, Scalar min) { return clamp(x, min, INFINITY); }
Tensor clamp_max(const Tensor& x, Scalar max) { return clamp(x, -INFINITY, max); }

#define FRUGAL_BINARY(name, true_division)                                                         \
  Tensor name(const Tensor& a, const Tensor& b) { return binary(op_##name, a, b, true_division); } \
  Tensor name(const Tensor& a, Scalar b) { return binary(op_##name, a, wrap_scalar(a, b), true_division); }
FRUGAL_BINARY(add, false)
FRUGAL_BINARY(sub, false)
FRUGAL_BINARY(mul, false)
FRUGAL_BINARY(div, true)
FRUGAL_BINARY(pow, false)
FRUGAL_BINARY(maximum, false)
FRUGAL_BINARY(minimum, false)
#undef FRUGAL_BINARY

#define FRUGAL_COMPARE(name)                                                         \
  Tensor name(const Tensor& a, const Tensor& b) { return compare(op_##name, a, b); } \
  Tensor name(const Tensor& a, Scalar b) { return compare(op_##name, a, wrap_scalar(a, b)); }
FRUGAL_COMPARE_OPS(FRUGAL_COMPARE)
#undef FRUGAL_COMPARE

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_defined(cond, "where", "condition");
  FRUGAL_CHECK_DTYPE(cond.dtype() == DType::Bool, "where: the condition must be bool, got ",
                     dtype_name(cond.dtype()), " (shape ", cond.shape(), "); compare first, e.g. gt(x, 0)");
  check_defined(a, "where", "second");
  check_defined(b, "where", "third");
  check_same_device("where", cond, a);
  const DType t = promote_types(a.dtype(), b.dtype());
  Tensor a2, b2;
  const Shape ab = prepare_binary("where", a, b, t, a2, b2);
  const Shape shape = broadcast_shapes(cond.shape(), ab, "where");
  Tensor out = empty(shape, a2.options());
  op_where.get(a.device(), t)(make_loop({&out, &cond, &a2, &b2}), {});
  return out;
}

Tensor cast(const Tensor& x, DType dtype) {
  check_defined(x, "cast", "input");
  Tensor out = empty(x.shape(), x.options().dtype(dtype));
  op_cast.get(x.device(), dtype)(make_loop({&out, &x}), {double(int(x.dtype()))});
  return out;
}

namespace {

// self [c, r] contiguous and src of its dtype the transpose of a row-major [r, c] matrix (rows stride(1)
// apart), with a transposing kernel on the device.
bool is_transposed_matrix_copy(const Tensor& self, const Tensor& src) {
  return src.dim() == 2 && self.dtype() == src.dtype() && src.size(0) > 1 && src.size(1) > 1 &&
         src.stride(0) == 1 && src.stride(1) >= src.size(0) && self.is_contiguous() &&
         self.storage() != src.storage() && op_transpose2d.has(self.device(), self.dtype());
}

}  // namespace

Tensor& copy_(Tensor& self, const Tensor& src) {
  check_defined(src, "copy_", "source");
  const Shape shape = broadcast_shapes(self.shape(), src.shape(), "copy_");
  FRUGAL_CHECK_SHAPE(shape == self.shape(), "copy_: a source of shape ", src.shape(),
                     " does not broadcast to the destination's shape ", self.shape());
  if (self.device() != src.device()) return copy_between_devices(self, src);
  if (is_transposed_matrix_copy(self, src)) {
    // The blocked transposing kernel: the element-by-element copy would stride through src's columns.
    TransposeArgs t;
    t.in = src.raw_data();
    t.out = self.raw_data();
    t.rows = src.size(1);
    t.cols = src.size(0);
    t.in_stride = src.stride(1);
    op_transpose2d.get(self.device(), self.dtype())(t);
    self.storage()->bump_version();
    return self;
  }
  op_cast.get(self.device(), self.dtype())(make_loop({&self, &src}), {double(int(src.dtype()))});
  self.storage()->bump_version();
  return self;
}

Tensor& fill_(Tensor& self, Scalar value) {
  op_fill.get(self.device(), self.dtype())(make_loop({&self}), {value});
  self.storage()->bump_version();
  return self;
}

Tensor& add_(Tensor& self, const Tensor& other) { return inplace(op_add, self, other); }
Tensor& sub_(Tensor& self, const Tensor& other) { return inplace(op_sub, self, other); }
Tensor& mul_(Tensor& self, const Tensor& other) { return inplace(op_mul, self, other); }
Tensor& div_(Tensor& self, const Tensor& other) {
  check_floating("div_", self);
  return inplace(op_div, self, other);
}
Tensor& add_(Tensor& self, Scalar other) {
  return inplace(op_add, self, scalar_tensor(other, self.options()));
}
Tensor& mul_(Tensor& self, Scalar other) {
  return inplace(op_mul, self, scalar_tensor(other, self.options()));
}
Tensor& relu_(Tensor& self) {
  op_relu.get(self.device(), self.dtype())(make_loop({&self, &self}), {});
  self.storage()->bump_version();
  return self;
}
Tensor& clamp_(Tensor& self, Scalar min, Scalar max) {
  FRUGAL_CHECK(!(min > max), "clamp_: min ", min, " is greater than max ", max);
  op_clamp.get(self.device(), self.dtype())(make_loop({&self, &self}), {min, max});
  self.storage()->bump_version();
  return self;
}

}  // namespace frugal::ops
