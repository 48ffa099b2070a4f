// Row-wise sparse gradients (Note [sparse gradients] in autograd/sparse.h): coalescing, accumulation into a
// leaf, densifying. Sorting happens on the host: the indices are few and small next to the rows they name.
#include "autograd/sparse.h"

#include "autograd/nn_ops.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/estimate.h"
#include "core/memory.h"
#include "core/op_table_sparse.h"
#include "core/ops.h"

namespace frugal::autograd {

SparseGrad sparse_grad(const Tensor& t) {
  return t.autograd_meta() ? t.autograd_meta()->sparse_grad : SparseGrad();
}

SparseGrad coalesce(const Tensor& indices, const Tensor& values, int64_t rows) {
  FRUGAL_CHECK(indices.defined() && values.defined(), "coalesce: the indices or the values are undefined");
  FRUGAL_CHECK_DTYPE(indices.dtype() == DType::I64 || indices.dtype() == DType::I32,
                     "coalesce: the indices must be i64 or i32, got ", dtype_name(indices.dtype()));
  FRUGAL_CHECK_SHAPE(indices.dim() == 1 && values.dim() == 2 && values.size(0) == indices.size(0),
                     "coalesce: expected indices [n] and values [n, dim], got shapes ", indices.shape(),
                     " and ", values.shape());
  if (indices.device().is_meta()) {  // Note [data-dependent sizes in a dry run]: every row distinct
    memory::detail::read_allocations(indices, DType::I64);  // to_vector's, below
    const int64_t distinct = std::min(indices.size(0), rows);
    const Tensor src = values.contiguous();
    SparseGrad out;
    out.rows = rows;
    out.indices = empty({distinct}, TensorOptions(DType::I64).device(values.device()));
    out.values = empty({distinct, values.size(1)}, values.options());
    return out;
  }
  const std::vector<int64_t> idx = indices.to_vector<int64_t>();
  for (int64_t i : idx)
    FRUGAL_CHECK_INDEX(i >= 0 && i < rows, "coalesce: index ", i, " is out of range for ", rows,
                       " rows; valid indices are [0, ", rows - 1, "]");
  // A stable sort keeps equal rows in their original order, so the sums do not depend on the sort.
  std::vector<int64_t> order(idx.size());
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return idx[size_t(a)] < idx[size_t(b)]; });
  std::vector<int64_t> unique, starts;
  for (size_t k = 0; k < order.size(); ++k) {
    const int64_t i = idx[size_t(order[k])];
    if (unique.empty() || unique.back() != i) {
      unique.push_back(i);
      starts.push_back(int64_t(k));
    }
  }
  starts.push_back(int64_t(order.size()));

  const Tensor src = values.contiguous();
  const int64_t dim = values.size(1);
  SparseGrad out;
  out.rows = rows;
  out.indices = tensor(unique).to(values.device());
  out.values = empty({int64_t(unique.size()), dim}, values.options());
  if (out.values.numel() > 0) {
    // The kernel reads order and starts where it runs: on a device, from copies there.
    const bool host = values.device().is_cpu();
    const Tensor order_t = host ? Tensor() : tensor(order).to(values.device());
    const Tensor starts_t = host ? Tensor() : tensor(starts).to(values.device());
    SegmentSumArgs a;
    a.values = src.raw_data();
    a.order = host ? order.data() : order_t.data<int64_t>();
    a.starts = host ? starts.data() : starts_t.data<int64_t>();
    a.out = out.values.raw_data();
    a.segments = int64_t(unique.size());
    a.dim = dim;
    op_segment_sum_rows.get(values.device(), values.dtype())(a);
  }
  return out;
}

void accumulate_sparse_grad(AutogradMeta& meta, const Tensor& indices, const Tensor& values, int64_t rows) {
  NoGradGuard no_grad;
  FRUGAL_CHECK(!meta.grad.defined(), "sparse gradient: the tensor already has a dense gradient (shape ",
               meta.grad.shape(),
               "); a weight used both by an Embedding with sparse(true) and by other ops cannot mix the two; "
               "use sparse(false)");
  SparseGrad& held = meta.sparse_grad;
  if (held.defined()) {
    FRUGAL_CHECK_SHAPE(held.rows == rows && held.values.size(1) == values.size(1),
                       "sparse gradient: new rows of [", rows, ", ", values.size(1),
                       "] do not fit the held gradient of [", held.rows, ", ", held.values.size(1), "]");
    held = coalesce(ops::cat({held.indices, indices.to(DType::I64)}), ops::cat({held.values, values}), rows);
  } else {
    held = coalesce(indices, values, rows);
  }
  static const uint32_t kGradientsTag = memory::intern_tag("gradients");
  held.indices.storage()->retag(kGradientsTag);
  held.values.storage()->retag(kGradientsTag);
}

Tensor to_dense(const SparseGrad& grad) {
  FRUGAL_CHECK(grad.defined(), "to_dense: the sparse gradient is undefined (no backward has written it)");
  const int64_t nnz = grad.values.size(0), dim = grad.values.size(1);
  Tensor dense = zeros({grad.rows, dim}, grad.values.options());
  if (nnz == 0) return dense;
  const Tensor index = grad.indices.unsqueeze(1).expand({nnz, dim}).contiguous();
  return ops::scatter_add(dense, 0, index, grad.values);
}

// The embedding with a sparse gradient (Note [sparse gradients]): its node hands the weight's rows straight
// to the weight's sparse slot and returns no gradient to the engine. flat: i64 [n]; pad: -1 for none.
Tensor embedding_sparse(const Tensor& flat, const Tensor& weight, int64_t pad) {
  FRUGAL_CHECK(weight.is_leaf(),
               "embedding: a sparse gradient needs the weight to be a leaf (a parameter), "
               "but it was produced by ",
               weight.grad_fn_name(), "; use sparse(false)");
  Tensor y = ops::index_select(weight, 0, flat);
  if (Node* n = recorded("embedding_sparse", {&weight}, y)) {
    n->save(flat);
    std::weak_ptr<AutogradMeta> target = weight.autograd_meta();
    const int64_t rows = weight.size(0);
    n->backward = [target, rows, pad](const Grads& s, const Tensor& g) -> Grads {
      Tensor index = s[0], values = g;
      if (pad >= 0) {  // the padding row gets no gradient: its entries are left out (as PyTorch does)
        Tensor kept;
        if (index.device().is_meta()) {  // Note [data-dependent sizes in a dry run]: no padding, all kept
          memory::detail::read_allocations(index, DType::I64);
          kept = empty({index.numel()}, TensorOptions(DType::I64).device(g.device()));
        } else {
          std::vector<int64_t> keep;
          const std::vector<int64_t> idx = index.to_vector<int64_t>();
          for (size_t i = 0; i < idx.size(); ++i)
            if (idx[i] != pad) keep.push_back(int64_t(i));
          kept = tensor(keep).to(g.device());
        }
        index = ops::index_select(index, 0, kept);
        values = ops::index_select(values, 0, kept);
      }
      if (auto meta = target.lock()) accumulate_sparse_grad(*meta, index, values, rows);
      return {Tensor()};
    };
  }
  return y;
}

}  // namespace frugal::autograd
