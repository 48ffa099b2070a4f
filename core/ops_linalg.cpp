// matmul (with NumPy's 1-D rules and broadcast batch dims) and softmax / log-softmax.
#include "core/memory_history.h"
#include "core/op_table_linalg.h"
#include "core/op_table_softmax.h"
#include "core/ops.h"

namespace frugal::ops {

namespace {

// Strides (row, col) of a matrix view usable by the GEMM kernels: one of them must be 1. Returns false when a
// copy is needed.
bool gemm_strides(const Tensor& t, int64_t rows, int64_t cols, int64_t& rs, int64_t& cs) {
  rs = t.stride(-2);
  cs = t.stride(-1);
  if (cols == 1) cs = 1;  // a size-1 dim's stride is free: pick the one the kernel wants
  if (rows == 1) rs = cols;
  if (cs == 1 && rs >= cols) return true;
  if (rows == 1 || cols == 1) return false;
  return rs == 1 && cs >= rows;
}

// The single batch stride of t's leading dims (all but the last two), or false when they do not step as one.
bool batch_stride(const Tensor& t, int64_t& stride) {
  stride = 0;
  bool first = true;
  for (int d = t.dim() - 3; d >= 0; --d) {
    if (t.shape()[d] == 1) continue;
    if (first) {
      stride = t.strides()[d];
      first = false;
    } else {
      int64_t inner = 1;
      for (int j = d + 1; j < t.dim() - 2; ++j) inner *= t.shape()[j];
      if (t.strides()[d] != stride * inner) return false;
    }
  }
  return true;
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  memory::OpScope op_scope("matmul", a_in, b_in);  // Note [op names in the history]
  FRUGAL_CHECK(a_in.defined() && b_in.defined(), "matmul: an input tensor is undefined");
  FRUGAL_CHECK(a_in.dim() >= 1 && b_in.dim() >= 1, "matmul: both operands need at least 1 dim, got shapes ",
               a_in.shape(), " and ", b_in.shape());
  FRUGAL_CHECK_DTYPE(a_in.dtype() == b_in.dtype(), "matmul: dtypes differ (", dtype_name(a_in.dtype()),
                     " with shape ", a_in.shape(), " and ", dtype_name(b_in.dtype()), " with shape ",
                     b_in.shape(), "); convert one with .to(dtype)");
  FRUGAL_CHECK_T(DeviceError, a_in.device() == b_in.device(), "matmul: tensors on different devices (",
                 a_in.device(), " and ", b_in.device(), ")");
  const DType dt = a_in.dtype();
  FRUGAL_CHECK_DTYPE(is_floating(dt), "matmul: expected a floating dtype (f32, f64, f16, bf16), got ",
                     dtype_name(dt), " for shapes ", a_in.shape(), " and ", b_in.shape());
  // On a device without a native 16-bit GEMM, the 16-bit floats compute in f32, which is what they accumulate
  // in anyway (DESIGN.md, Precision); the result is rounded back once.
  if ((dt == DType::F16 || dt == DType::BF16) && !op_gemm.has(a_in.device(), dt))
    return ops::to(matmul(ops::to(a_in, DType::F32), ops::to(b_in, DType::F32)), dt);

  // 1-D operands become a row (a) or a column (b), removed again from the result.
  const Tensor a = a_in.dim() == 1 ? ops::unsqueeze(a_in, 0) : a_in;
  const Tensor b = b_in.dim() == 1 ? ops::unsqueeze(b_in, 1) : b_in;
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  FRUGAL_CHECK_SHAPE(b.size(-2) == k, "matmul: shapes ", a_in.shape(), " and ", b_in.shape(),
                     " cannot be multiplied (inner sizes ", k, " and ", b.size(-2), " differ)");
  Shape a_batch(std::vector<int64_t>(a.shape().begin(), a.shape().end() - 2));
  Shape b_batch(std::vector<int64_t>(b.shape().begin(), b.shape().end() - 2));
  const Shape batch = broadcast_shapes(a_batch, b_batch, "matmul");

  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor out = empty(out_shape, a.options());
  Shape a_full = batch, b_full = batch;
  a_full.push_back(m);
  a_full.push_back(k);
  b_full.push_back(k);
  b_full.push_back(n);
  Tensor ae = ops::expand(a, a_full), be = ops::expand(b, b_full);

  GemmArgs g;
  g.batch = batch.numel();
  g.m = m;
  g.n = n;
  g.k = k;
  if (!batch_stride(ae, g.a_batch) || !gemm_strides(ae, m, k, g.a_row, g.a_col)) {
    ae = ops::contiguous(ae);
    batch_stride(ae, g.a_batch);
    gemm_strides(ae, m, k, g.a_row, g.a_col);
  }
  if (!batch_stride(be, g.b_batch) || !gemm_strides(be, k, n, g.b_row, g.b_col)) {
    be = ops::contiguous(be);
    batch_stride(be, g.b_batch);
    gemm_strides(be, k, n, g.b_row, g.b_col);
  }
  g.a = ae.raw_data();
  g.b = be.raw_data();
  g.c = out.raw_data();
  g.c_row = n;
  g.c_batch = m * n;
  if (out.numel() > 0) {
    if (k == 0)
      ops::fill_(out, 0);
    else {
      // Each operand's elements once, a broadcast one (batch stride 0) once for the whole batch.
      const double a_elems = double(g.a_batch == 0 ? 1 : g.batch) * double(g.m * g.k),
                   b_elems = double(g.b_batch == 0 ? 1 : g.batch) * double(g.k * g.n);
      detail::count_flops(a.device(), 2.0 * double(g.batch) * double(g.m) * double(g.n) * double(g.k),
                          (a_elems + b_elems) * double(out.element_size()));
      op_gemm.get(a.device(), dt)(g);
    }
  }
  if (a_in.dim() == 1) out = ops::squeeze(out, -2);
  if (b_in.dim() == 1) out = ops::squeeze(out, -1);
  return out;
}

namespace {
Tensor softmax_impl(const Tensor& x, int64_t dim, bool log) {
  memory::OpScope op_scope(log ? "log_softmax" : "softmax", x);  // Note [op names in the history]
  const char* op = log ? "log_softmax" : "softmax";
  FRUGAL_CHECK(x.defined(), op, ": the input tensor is undefined");
  FRUGAL_CHECK_DTYPE(is_floating(x.dtype()), op, ": expected a floating dtype (f32, f64, f16, bf16), got ",
                     dtype_name(x.dtype()), " (shape ", x.shape(), ")");
  const int d = wrap_dim(dim, x.dim(), op);
  const bool last = x.dim() == 0 || d == x.dim() - 1;
  const Tensor xt = ops::contiguous(last ? x : ops::transpose(x, d, -1));
  Tensor out = empty(xt.shape(), xt.options());
  SoftmaxArgs args;
  args.in = xt.raw_data();
  args.out = out.raw_data();
  args.cols = x.dim() == 0 ? 1 : xt.size(-1);
  args.rows = args.cols ? xt.numel() / args.cols : 0;
  args.log = log;
  if (xt.numel() > 0) op_softmax.get(x.device(), x.dtype())(args);
  return last ? out : ops::transpose(out, d, -1);
}
}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, true); }

}  // namespace frugal::ops
