// Indexing and joining: index_select, gather, scatter_add, index_add, cat, one_hot.
#include <limits>

#include "core/memory_history.h"
#include "core/op_table.h"
#include "core/op_table_index.h"
#include "core/ops.h"

namespace frugal::ops {

namespace {

// index as contiguous i64 with every value checked against [-size, size) and negatives wrapped.
Tensor checked_index(const char* op, const Tensor& index, int64_t size, const Tensor& x, int64_t dim) {
  FRUGAL_CHECK(index.defined(), op, ": the index tensor is undefined");
  FRUGAL_CHECK_DTYPE(index.dtype() == DType::I64 || index.dtype() == DType::I32, op,
                     ": the index must be i64 or i32, got ", dtype_name(index.dtype()), " (shape ",
                     index.shape(), ")");
  FRUGAL_CHECK_T(DeviceError, index.device() == x.device(), op, ": the index is on ", index.device(),
                 " but the tensor is on ", x.device());
  Tensor idx = ops::contiguous(ops::to(index, DType::I64));
  if (idx.numel() == 0) return idx;
  const auto [lo, hi] = integer_range(idx);
  FRUGAL_CHECK_INDEX(lo >= -size && hi < size, op, ": index ", (lo < -size ? lo : hi),
                     " is out of range for dim ", dim, " of size ", size, " (tensor shape ", x.shape(),
                     "); valid indices are [", -size, ", ", size - 1, "]");
  if (lo < 0) idx = where(lt(idx, 0.0), add(idx, double(size)), idx);
  return idx;
}

void split_at(const Shape& shape, int d, int64_t& outer, int64_t& inner) {
  outer = inner = 1;
  for (int i = 0; i < d; ++i) outer *= shape[i];
  for (int i = d + 1; i < shape.size(); ++i) inner *= shape[i];
}

// The checks scatter_add and index_add share: every tensor defined, src of x's dtype and on x's device.
void check_src(const char* op, const Tensor& x, const Tensor& index, const Tensor& src) {
  FRUGAL_CHECK(x.defined() && index.defined() && src.defined(), op, ": an input tensor is undefined");
  FRUGAL_CHECK_DTYPE(src.dtype() == x.dtype(), op, ": src dtype ", dtype_name(src.dtype()),
                     " differs from the input's ", dtype_name(x.dtype()));
  FRUGAL_CHECK_T(DeviceError, src.device() == x.device(), op, ": src is on ", src.device(),
                 " but the input is on ", x.device(), "; move one with .to(device)");
}

// A copy of x with the contiguous src's slices summed in at dim d of `loop_shape` (index's shape for
// scatter_add, src's for index_add) by the op's kernel.
Tensor add_into_copy(const OpTable<IndexKernel>& op, const Tensor& x, const Shape& loop_shape, int d,
                     const Tensor& idx, const Tensor& srcs, int64_t size, int64_t n_index) {
  Tensor out = ops::clone(x);
  IndexArgs a;
  split_at(loop_shape, d, a.outer, a.inner);
  a.src = srcs.raw_data();
  a.index = idx.data<int64_t>();
  a.out = out.raw_data();
  a.dim_size = size;
  a.n_index = n_index;
  if (loop_shape.numel() > 0) op.get(x.device(), x.dtype())(a);
  return out;
}

}  // namespace

// Note [index bounds on a GPU]
// The index ops check every index on the host before a kernel runs (checked_index; embedding and the
// class-index losses do the same with integer_range), so that a bad index is a clear IndexError naming the
// op, the value and the size, thrown where the op is called, and no kernel ever reads or writes out of
// bounds. On a GPU that costs a wait for the device per op: the {min, max} pair comes back in one copy after
// one reduction (max over [~x, x]; ~v = -1 - v never overflows, unlike -v), one wait instead of the two of a
// min and a max read separately. The CPU keeps its two reductions: it waits for nothing, and they are cheaper
// than building [~x, x].
// Not done yet (a debt): PyTorch checks inside its CUDA kernels and reports through an asynchronous device
// assert. The frugal equivalent: the CUDA index kernels skip an out-of-range element and record the first
// (position, value) in a per-device error word, raised as IndexError at the next point that waits for the
// device anyway (a copy to the host, item(), cuda_synchronize()). It needs the op layer to know that the
// kernel in the table checks for itself (the stand-in GPU of tests/cuda/gpu_test.h puts the CPU kernels,
// which trust their indices, in the CUDA slots) and the wrap of negative indices moved into the kernels.
std::pair<int64_t, int64_t> integer_range(const Tensor& x) {
  FRUGAL_CHECK(x.defined() && x.numel() > 0, "integer_range: expected a non-empty tensor");
  FRUGAL_CHECK_DTYPE(is_integral(x.dtype()), "integer_range: expected an integer tensor, got ",
                     dtype_name(x.dtype()));
  if (x.device().is_cpu()) return {min(x).item<int64_t>(), max(x).item<int64_t>()};
  if (x.device().is_meta()) {  // the cpu's line above, allocation for allocation (item() casts), with the
    const Tensor lo =
        min(x);  // indices in range (Note [data-dependent sizes in a dry run], core/estimate.cpp)
    (void)contiguous(cast(lo, DType::I64));
    const Tensor hi = max(x);
    (void)contiguous(cast(hi, DType::I64));
    return {0, 0};
  }
  const Tensor flat = ops::reshape(ops::to(x, DType::I64), {1, x.numel()});
  const Tensor ends = ops::to(max(cat({sub(full({1, 1}, -1, flat.options()), flat), flat}, 0), {1}), kCPU);
  const int64_t* e = ends.data<int64_t>();
  return {-1 - e[0], e[1]};
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  memory::OpScope op_scope("index_select", x, index);  // Note [op names in the history]
  FRUGAL_CHECK(x.defined(), "index_select: the input tensor is undefined");
  const int d = wrap_dim(dim, x.dim(), "index_select");
  FRUGAL_CHECK_SHAPE(index.defined() && index.dim() <= 1,
                     "index_select: the index must be 0-d or 1-d, got shape ",
                     index.defined() ? index.shape() : Shape{});
  // A 0-d tensor is one value: its index names that value once (the output has x's shape, one element).
  FRUGAL_CHECK_SHAPE(x.dim() > 0 || index.numel() == 1,
                     "index_select: the index of a 0-d tensor must hold one value, got ", index.numel());
  const int64_t size = x.dim() ? x.shape()[d] : 1;
  const Tensor idx = checked_index("index_select", index, size, x, dim);
  const Tensor xc = ops::contiguous(x);
  Shape out_shape = x.shape();
  if (x.dim()) out_shape[d] = idx.numel();
  Tensor out = empty(out_shape, x.options());
  IndexArgs a;
  split_at(x.shape(), d, a.outer, a.inner);
  a.x = xc.raw_data();
  a.index = idx.data<int64_t>();
  a.out = out.raw_data();
  a.dim_size = size;
  a.n_index = idx.numel();
  if (out.numel() > 0) op_index_select.get(x.device(), x.dtype())(a);
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  memory::OpScope op_scope("gather", x, index);  // Note [op names in the history]
  FRUGAL_CHECK(x.defined() && index.defined(), "gather: an input tensor is undefined");
  const int d = wrap_dim(dim, x.dim(), "gather");
  FRUGAL_CHECK_SHAPE(index.dim() == x.dim(), "gather: the index (shape ", index.shape(),
                     ") must have as many dims as the input (shape ", x.shape(), ")");
  Tensor xs = x;
  for (int i = 0; i < x.dim(); ++i) {
    if (i == d) continue;
    FRUGAL_CHECK_SHAPE(index.shape()[i] <= x.shape()[i], "gather: index shape ", index.shape(),
                       " is larger than input shape ", x.shape(), " at dim ", i);
    xs = ops::narrow(xs, i, 0, index.shape()[i]);
  }
  const int64_t size = x.dim() ? x.shape()[d] : 1;
  const Tensor idx = checked_index("gather", index, size, x, dim);
  xs = ops::contiguous(xs);
  Tensor out = empty(index.shape(), x.options());
  IndexArgs a;
  split_at(index.shape(), d, a.outer, a.inner);
  a.x = xs.raw_data();
  a.index = idx.data<int64_t>();
  a.out = out.raw_data();
  a.dim_size = size;
  a.n_index = index.dim() ? index.shape()[d] : 1;
  if (out.numel() > 0) op_gather.get(x.device(), x.dtype())(a);
  return out;
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  memory::OpScope op_scope("scatter_add", x, index, src);  // Note [op names in the history]
  check_src("scatter_add", x, index, src);
  const int d = wrap_dim(dim, x.dim(), "scatter_add");
  FRUGAL_CHECK_SHAPE(index.dim() == x.dim() && src.dim() == x.dim(), "scatter_add: input (shape ", x.shape(),
                     "), index (shape ", index.shape(), ") and src (shape ", src.shape(),
                     ") must have the same number of dims");
  Tensor srcs = src;
  for (int i = 0; i < x.dim(); ++i) {
    FRUGAL_CHECK_SHAPE(index.shape()[i] <= src.shape()[i] && (i == d || index.shape()[i] == x.shape()[i]),
                       "scatter_add: index shape ", index.shape(), " must match the input shape ", x.shape(),
                       " outside dim ", d, " and not exceed the src shape ", src.shape());
    srcs = ops::narrow(srcs, i, 0, index.shape()[i]);
  }
  const int64_t size = x.dim() ? x.shape()[d] : 1;
  const Tensor idx = checked_index("scatter_add", index, size, x, dim);
  return add_into_copy(op_scatter_add, x, index.shape(), d, idx, ops::contiguous(srcs), size,
                       index.dim() ? index.shape()[d] : 1);
}

Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  memory::OpScope op_scope("index_add", x, index, src);  // Note [op names in the history]
  check_src("index_add", x, index, src);
  const int d = x.dim() ? wrap_dim(dim, x.dim(), "index_add") : 0;
  FRUGAL_CHECK_SHAPE(index.dim() <= 1, "index_add: the index must be 0-d or 1-d, got shape ", index.shape());
  FRUGAL_CHECK_SHAPE(x.dim() > 0 || index.numel() == 1,
                     "index_add: the index of a 0-d tensor must hold one value, got ", index.numel());
  Shape expected = x.shape();
  if (x.dim()) expected[d] = index.numel();
  FRUGAL_CHECK_SHAPE(src.shape() == expected, "index_add: src shape ", src.shape(),
                     " must be the input shape ", x.shape(), " with dim ", d, " of the index's size ",
                     index.numel(), ", i.e. ", expected);
  const int64_t size = x.dim() ? x.shape()[d] : 1;
  const Tensor idx = checked_index("index_add", index, size, x, dim);
  if (x.dim() > 0 && !op_index_add.has(x.device(), x.dtype())) {
    // A device without an index_add kernel (the CUDA backend today): scatter_add of the index expanded over
    // src, the same sums through a per-element index.
    Shape view;
    for (int i = 0; i < src.dim(); ++i) view.push_back(i == d ? idx.numel() : 1);
    return scatter_add(x, d, ops::expand(ops::reshape(idx, view), src.shape()), src);
  }
  return add_into_copy(op_index_add, x, src.shape(), d, idx, ops::contiguous(src), size, idx.numel());
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  memory::OpScope op_scope("cat");  // Note [op names in the history]
  FRUGAL_CHECK(!tensors.empty(), "cat: expected at least one tensor");
  const Tensor& first = tensors[0];
  FRUGAL_CHECK(first.defined(), "cat: tensor 0 is undefined");
  FRUGAL_CHECK_SHAPE(first.dim() > 0, "cat: cannot concatenate 0-d tensors; use stack");
  const int d = wrap_dim(dim, first.dim(), "cat");
  Shape shape = first.shape();
  DType dt = first.dtype();
  shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    FRUGAL_CHECK(t.defined(), "cat: tensor ", i, " is undefined");
    FRUGAL_CHECK_T(DeviceError, t.device() == first.device(), "cat: tensor ", i, " is on ", t.device(),
                   " but tensor 0 is on ", first.device());
    bool same = t.dim() == first.dim();
    for (int j = 0; same && j < t.dim(); ++j) same = j == d || t.shape()[j] == first.shape()[j];
    FRUGAL_CHECK_SHAPE(same, "cat: tensor ", i, " has shape ", t.shape(), " but tensor 0 has shape ",
                       first.shape(), "; sizes must match except in dim ", dim);
    shape[d] += t.shape()[d];
    dt = promote_types(dt, t.dtype());
  }
  Tensor out = empty(shape, first.options().dtype(dt));
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    Tensor part = ops::narrow(out, d, offset, t.shape()[d]);
    copy_(part, t);
    offset += t.shape()[d];
  }
  return out;
}

Tensor one_hot(const Tensor& index, int64_t num_classes) {
  memory::OpScope op_scope("one_hot", index);  // Note [op names in the history]
  FRUGAL_CHECK(index.defined(), "one_hot: the index tensor is undefined");
  FRUGAL_CHECK_DTYPE(is_integral(index.dtype()), "one_hot: the index must be an integer tensor, got ",
                     dtype_name(index.dtype()));
  const auto [lo, hi] = index.numel() ? integer_range(index) : std::pair<int64_t, int64_t>{0, -1};
  if (num_classes < 0) {
    FRUGAL_CHECK_INDEX(hi < std::numeric_limits<int64_t>::max(), "one_hot: the largest class value, ", hi,
                       ", leaves no class count to infer; pass num_classes");
    num_classes = hi + 1;
  }
  FRUGAL_CHECK_INDEX(lo >= 0 && hi < num_classes, "one_hot: class values must be in [0, ", num_classes,
                     "), got values in [", lo, ", ", hi, "]");
  const Tensor classes =
      arange(0, double(num_classes), 1, TensorOptions(index.dtype()).device(index.device()));
  return ops::to(eq(ops::unsqueeze(index, -1), classes), DType::I64);
}

}  // namespace frugal::ops
