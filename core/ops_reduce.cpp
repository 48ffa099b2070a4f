// Reductions: choose the kept and reduced dims, lay them out for the kernel, and pick the result's dtype.
#include <cmath>

#include "core/memory_history.h"
#include "core/op_table.h"
#include "core/op_table_reduce.h"
#include "core/ops.h"

namespace frugal::ops {

namespace {

// Which dims a reduction removes: `dims` wrapped and deduplicated; empty means all.
std::array<bool, kMaxDims> reduced_mask(const Tensor& x, const Shape& dims, const char* op) {
  std::array<bool, kMaxDims> mask{};
  if (dims.empty()) {
    mask.fill(true);
    return mask;
  }
  for (int64_t d : dims) {
    const int w = wrap_dim(d, x.dim(), op);
    FRUGAL_CHECK_INDEX(!mask[w], op, ": dim ", d, " appears more than once in ", dims);
    mask[w] = true;
  }
  return mask;
}

// Appends (size, stride) to a dim list, merging with the previous dim when the two step as one run.
void push_dim(int& n, int64_t* sizes, int64_t* strides, int64_t size, int64_t stride) {
  if (size == 1) return;
  if (n > 0 && strides[n - 1] == stride * size) {
    sizes[n - 1] *= size;
    strides[n - 1] = stride;
    return;
  }
  sizes[n] = size;
  strides[n] = stride;
  ++n;
}

Tensor reduce(OpTable<ReduceKernel>& table, const Tensor& x, const Shape& dims, bool keepdim, DType out_dtype,
              double correction = 0) {
  memory::OpScope op_scope(table.name(), x);  // Note [op names in the history]
  const char* op = table.name();
  FRUGAL_CHECK(x.defined(), op, ": the input tensor is undefined");
  const auto mask = reduced_mask(x, dims, op);
  ReduceArgs args;
  Shape out_shape;
  for (int d = 0; d < x.dim(); ++d) {
    if (mask[d]) {
      if (keepdim) out_shape.push_back(1);
      push_dim(args.red_ndim, args.red_sizes, args.red_strides, x.shape()[d], x.strides()[d]);
      args.n_reduce *= x.shape()[d];
    } else {
      out_shape.push_back(x.shape()[d]);
      push_dim(args.kept_ndim, args.kept_sizes, args.kept_strides, x.shape()[d], x.strides()[d]);
    }
  }
  Tensor out = empty(out_shape, x.options().dtype(out_dtype));
  args.n_out = out.numel();
  if (args.n_out == 0) return out;
  const bool empty_ok = &table == &op_sum || &table == &op_var;
  FRUGAL_CHECK_SHAPE(args.n_reduce > 0 || empty_ok, op, ": cannot reduce over a dim of size 0 (shape ",
                     x.shape(), ", dims ", dims, "); the result would have no value");
  args.in = static_cast<const char*>(x.raw_data());
  args.out = static_cast<char*>(out.raw_data());
  args.correction = correction;
  table.get(x.device(), x.dtype())(args);
  return out;
}

DType sum_dtype(DType t) { return is_floating(t) ? t : DType::I64; }

void check_floating(const Tensor& x, const char* op) {
  FRUGAL_CHECK(x.defined(), op, ": the input tensor is undefined");
  FRUGAL_CHECK_DTYPE(is_floating(x.dtype()), op, ": expected a floating dtype (f32, f64, f16, bf16), got ",
                     dtype_name(x.dtype()), " (shape ", x.shape(), "); convert first, e.g. x.to(DType::F32)");
}

Tensor arg_reduce(OpTable<ReduceKernel>& table, const Tensor& x, int64_t dim, bool keepdim) {
  memory::OpScope op_scope(table.name(), x);  // Note [op names in the history]
  FRUGAL_CHECK(x.defined(), table.name(), ": the input tensor is undefined");
  return reduce(table, x, {int64_t(wrap_dim(dim, x.dim(), table.name()))}, keepdim, DType::I64);
}

}  // namespace

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim) {
  FRUGAL_CHECK(x.defined(), "sum: the input tensor is undefined");
  return reduce(op_sum, x, dims, keepdim, sum_dtype(x.dtype()));
}

Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  memory::OpScope op_scope("mean", x);  // Note [op names in the history]
  check_floating(x, "mean");
  Tensor s = reduce(op_sum, x, dims, keepdim, x.dtype());
  const int64_t n = s.numel() ? x.numel() / s.numel() : 0;
  return div(s, double(n));
}

Tensor max(const Tensor& x, const Shape& dims, bool keepdim) {
  FRUGAL_CHECK(x.defined(), "max: the input tensor is undefined");
  return reduce(op_max, x, dims, keepdim, x.dtype());
}

Tensor min(const Tensor& x, const Shape& dims, bool keepdim) {
  FRUGAL_CHECK(x.defined(), "min: the input tensor is undefined");
  return reduce(op_min, x, dims, keepdim, x.dtype());
}

Tensor var(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim) {
  memory::OpScope op_scope("var", x);  // Note [op names in the history]
  check_floating(x, "var");
  FRUGAL_CHECK(correction >= 0, "var: correction must be non-negative, got ", correction);
  return reduce(op_var, x, dims, keepdim, x.dtype(), double(correction));
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) { return arg_reduce(op_argmax, x, dim, keepdim); }
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) { return arg_reduce(op_argmin, x, dim, keepdim); }
ValuesIndices max_dim(const Tensor& x, int64_t dim, bool keepdim) {
  FRUGAL_CHECK(x.defined(), "max: the input tensor is undefined");
  const int64_t d = wrap_dim(dim, x.dim(), "max");
  return {reduce(op_max, x, {d}, keepdim, x.dtype()), arg_reduce(op_argmax, x, d, keepdim)};
}

ValuesIndices min_dim(const Tensor& x, int64_t dim, bool keepdim) {
  FRUGAL_CHECK(x.defined(), "min: the input tensor is undefined");
  const int64_t d = wrap_dim(dim, x.dim(), "min");
  return {reduce(op_min, x, {d}, keepdim, x.dtype()), arg_reduce(op_argmin, x, d, keepdim)};
}

Tensor argmax(const Tensor& x) { return arg_reduce(op_argmax, ops::reshape(x, {-1}), 0, false); }
Tensor argmin(const Tensor& x) { return arg_reduce(op_argmin, ops::reshape(x, {-1}), 0, false); }

}  // namespace frugal::ops
