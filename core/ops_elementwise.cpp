// Elementwise ops: input checks, broadcasting and type promotion, then one kernel call through the op table.
// The ops of core/op_list.h are generated from it; where, cast, copy_ and fill_ are written out. Core calls
// ops:: only, never a Tensor method (those record autograd).
#include <cmath>

#include "core/memory_history.h"
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

// x itself when it already has the dtype, else a converted copy.
Tensor to_dtype(const Tensor& x, DType t) { return x.dtype() == t ? x : cast(x, t); }

Tensor unary(OpTable<ElementwiseKernel>& table, const Tensor& x, bool floating_only, OpArgs args = {}) {
  memory::OpScope op_scope(table.name(), x);  // Note [op names in the history]
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
  a2 = to_dtype(a, compute);
  b2 = to_dtype(b, compute);
  return shape;
}

// true_division: integers and bools compute in f32 (div); takes_bool: the op has bool kernels (add, mul).
Tensor binary(OpTable<ElementwiseKernel>& table, const Tensor& a, const Tensor& b, bool true_division,
              bool takes_bool) {
  memory::OpScope op_scope(table.name(), a, b);  // Note [op names in the history]
  check_defined(a, table.name(), "first");
  check_defined(b, table.name(), "second");
  DType t = promote_types(a.dtype(), b.dtype());
  if (true_division && !is_floating(t)) t = DType::F32;
  FRUGAL_CHECK_DTYPE(t != DType::Bool || takes_bool, table.name(),
                     ": bool tensors are not supported (shapes ", a.shape(), " and ", b.shape(),
                     "), as in PyTorch; for masks, add is a logical or, mul a ",
                     "logical and, and ne(a, b) an exclusive or");
  // An f32 and a 16-bit operand (autocast's residual adds): add widens the 16-bit one as it reads it, with
  // no f32 copy of it first (the values of the cast and the add, bit for bit).
  if (&table == &op_add && t == DType::F32 && a.dtype() != b.dtype() &&
      (a.dtype() == DType::F32 || b.dtype() == DType::F32) && a.device() == b.device()) {
    const Tensor& wide = a.dtype() == DType::F32 ? a : b;
    const Tensor& narrow = a.dtype() == DType::F32 ? b : a;
    if (op_add_widened.has(a.device(), narrow.dtype())) {
      Tensor out = empty(broadcast_shapes(a.shape(), b.shape(), table.name()), wide.options());
      op_add_widened.get(a.device(), narrow.dtype())(make_loop({&out, &wide, &narrow}), {});
      return out;
    }
  }
  Tensor a2, b2;
  const Shape shape = prepare_binary(table.name(), a, b, t, a2, b2);
  Tensor out = empty(shape, a2.options());
  table.get(a.device(), t)(make_loop({&out, &a2, &b2}), {});
  return out;
}

Tensor compare(OpTable<ElementwiseKernel>& table, const Tensor& a, const Tensor& b) {
  memory::OpScope op_scope(table.name(), a, b);  // Note [op names in the history]
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
  memory::OpScope op_scope(table.name(), self, other);  // Note [op names in the history]
  check_defined(self, table.name(), "first");
  check_defined(other, table.name(), "second");
  check_writable(self, table.name());
  check_same_device(table.name(), self, other);
  const Shape shape = broadcast_shapes(self.shape(), other.shape(), table.name());
  FRUGAL_CHECK_SHAPE(shape == self.shape(), table.name(), "_: the result's shape ", shape,
                     " differs from the shape ", self.shape(), " of the tensor written in place");
  const Tensor o = to_dtype(other, self.dtype());
  table.get(self.device(), self.dtype())(make_loop({&self, &self, &o}), {});
  self.storage()->bump_version();
  return self;
}

// A copy across devices moves the bytes once, contiguous and already of the destination's dtype and shape;
// the conversion happens on the cpu side, so a device needs no kernel for a dtype merely to hold it. Between
// two GPUs the bytes go through the host.
Tensor& copy_between_devices(Tensor& self, const Tensor& src) {
  // Note [the meta device]: nothing to move into a meta tensor, nothing to read out of one.
  FRUGAL_CHECK_T(DeviceError, !src.device().is_meta(), "copy_: a meta tensor (shape ", src.shape(),
                 ") has no values to copy to ", self.device(),
                 "; the meta device is for dry runs (core/estimate.h)");
  if (self.device().is_meta()) {
    self.storage()->bump_version();
    return self;
  }
  if (!self.device().is_cpu() && !src.device().is_cpu()) {
    Tensor host = empty(src.shape(), src.options().device(kCPU));
    copy_(host, src);
    return copy_(self, host);
  }
  DeviceCopyArgs a;
  Tensor from, to;
  if (src.device().is_cpu()) {
    Tensor s = src.dtype() == self.dtype() ? src : cast(src, self.dtype());
    from = contiguous(s.shape() == self.shape() ? s : expand(s, self.shape()));
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

namespace {
enum class DTypes { floating, signed_numeric, numeric, all };
}  // namespace

// The ops of core/op_list.h.
#define FRUGAL_OPS_UNARY(name, F, dtypes, autocast, method, inplace)                               \
  Tensor name(const Tensor& x) { return unary(op_##name, x, DTypes::dtypes == DTypes::floating); } \
  FRUGAL_IF_##inplace(Tensor& name##_(Tensor& self) {                                              \
    if (DTypes::dtypes == DTypes::floating) check_floating(#name "_", self);                       \
    check_writable(self, #name "_");                                                               \
    op_##name.get(self.device(), self.dtype())(make_loop({&self, &self}), {});                     \
    self.storage()->bump_version();                                                                \
    return self;                                                                                   \
  })
#define FRUGAL_OPS_UNARY_PARAM(name, F, dtypes, autocast, method, inplace, p1, d1, p2, d2, check, why) \
  Tensor name(const Tensor& x, Scalar p1, Scalar p2) {                                                 \
    FRUGAL_CHECK(check, #name ": " why " (" #p1 " ", p1, ", " #p2 " ", p2, ")");                       \
    return unary(op_##name, x, DTypes::dtypes == DTypes::floating, {p1, p2});                          \
  }                                                                                                    \
  FRUGAL_IF_##inplace(Tensor& name##_(Tensor& self, Scalar p1, Scalar p2) {                            \
    FRUGAL_CHECK(check, #name "_: " why " (" #p1 " ", p1, ", " #p2 " ", p2, ")");                      \
    if (DTypes::dtypes == DTypes::floating) check_floating(#name "_", self);                           \
    check_writable(self, #name "_");                                                                   \
    op_##name.get(self.device(), self.dtype())(make_loop({&self, &self}), {p1, p2});                   \
    self.storage()->bump_version();                                                                    \
    return self;                                                                                       \
  })
#define FRUGAL_OPS_BINARY(name, F, dtypes, autocast, method, inplace)                                  \
  Tensor name(const Tensor& a, const Tensor& b) {                                                      \
    return binary(op_##name, a, b, DTypes::dtypes == DTypes::floating, DTypes::dtypes == DTypes::all); \
  }                                                                                                    \
  Tensor name(const Tensor& a, Scalar b) { return name(a, wrap_scalar(a, b)); }                        \
  Tensor name(Scalar a, const Tensor& b) { return name(wrap_scalar(b, a), b); }                        \
  FRUGAL_IF_##inplace(                                                                                 \
      Tensor& name##_(Tensor& self, const Tensor& other) {                                             \
        if (DTypes::dtypes == DTypes::floating) check_floating(#name "_", self);                       \
        return inplace(op_##name, self, other);                                                        \
      } Tensor& name##_(Tensor& self, Scalar other) {                                                  \
        return name##_(self, scalar_tensor(other, self.options()));                                    \
      })
#define FRUGAL_OPS_COMPARE(name, F)                                                  \
  Tensor name(const Tensor& a, const Tensor& b) { return compare(op_##name, a, b); } \
  Tensor name(const Tensor& a, Scalar b) { return compare(op_##name, a, wrap_scalar(a, b)); }
FRUGAL_UNARY_OP_LIST(FRUGAL_OPS_UNARY)
FRUGAL_UNARY_PARAM_OP_LIST(FRUGAL_OPS_UNARY_PARAM)
FRUGAL_BINARY_OP_LIST(FRUGAL_OPS_BINARY)
FRUGAL_COMPARE_OP_LIST(FRUGAL_OPS_COMPARE)
#undef FRUGAL_OPS_UNARY
#undef FRUGAL_OPS_UNARY_PARAM
#undef FRUGAL_OPS_BINARY
#undef FRUGAL_OPS_COMPARE

Tensor clamp_min(const Tensor& x, Scalar min) { return clamp(x, min, INFINITY); }
Tensor clamp_max(const Tensor& x, Scalar max) { return clamp(x, -INFINITY, max); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  memory::OpScope op_scope("where", cond, a, b);  // Note [op names in the history]
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
  memory::OpScope op_scope("cast", x);  // Note [op names in the history]
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
  memory::OpScope op_scope("copy_", self, src);  // Note [op names in the history]
  check_defined(src, "copy_", "source");
  check_writable(self, "copy_");
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
  check_writable(self, "fill_");
  op_fill.get(self.device(), self.dtype())(make_loop({&self}), {value});
  self.storage()->bump_version();
  return self;
}

}  // namespace frugal::ops
