// Differentiable indexing and joining (index_select, gather, scatter_add, cat, stack), each beside its rule.
#include "autograd/functions.h"

namespace frugal {

using autograd::Grads;
using autograd::Node;
using autograd::recorded;

namespace {
// x's shape with the dims other than `dim` cut to those of `like` (gather's index may be smaller than x).
Shape cut_to(const Shape& x, const Shape& like, int dim) {
  Shape s = like;
  s[dim] = x[dim];
  return s;
}

// Note [16-bit index gradients]: the gradients of index_select (the embedding's) and gather add together
// the entries of g whose index repeats. For f16 and bf16 they accumulate in f32 (compute_dtype) and are
// rounded once, as the GEMMs and the reductions accumulate: added in the 16-bit dtype, a row stopped growing
// once it was 256 times the values added to it (a bf16 embedding row of a token seen 300 times, each with
// gradient 1, summed to 256).

// A zero tensor of `shape` with `part` written at its start (part's shape fits inside).
Tensor zero_padded(const Tensor& part, const Shape& shape) {
  if (part.shape() == shape) return part;
  Tensor out = zeros(shape, part.options());
  Tensor view = out;
  for (int d = 0; d < shape.size(); ++d) view = view.narrow(d, 0, part.shape()[d]);
  view.copy_(part);
  return out;
}
}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor y = ops::index_select(x, dim, index);
  if (Node* n = recorded("index_select", {&x}, y)) {
    n->save(index);
    const Shape xs = x.shape();
    const int d = x.dim() ? wrap_dim(dim, x.dim(), "index_select") : 0;
    n->backward = [xs, d](const Grads& s, const Tensor& g) -> Grads {
      if (xs.size() == 0) return {g.reshape(xs)};
      // One row add per index (ops::index_add): first order only, unlike a scatter_add of an expanded index,
      // whose per-element index costs more than the adds.
      const DType acc = compute_dtype(g.dtype());  // Note [16-bit index gradients]
      const Tensor sum =
          ops::index_add(zeros(xs, g.options().dtype(acc)), d, s[0].reshape({-1}), ops::to(g, acc));
      return {ops::to(sum, g.dtype())};
    };
  }
  return y;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor y = ops::gather(x, dim, index);
  if (Node* n = recorded("gather", {&x}, y)) {
    n->save(index);
    const Shape xs = x.shape();
    const int d = wrap_dim(dim, x.dim(), "gather");
    n->backward = [xs, d](const Grads& s, const Tensor& g) -> Grads {
      const DType acc = compute_dtype(g.dtype());  // Note [16-bit index gradients]
      const Tensor part =
          scatter_add(zeros(cut_to(xs, s[0].shape(), d), g.options().dtype(acc)), d, s[0], g.to(acc));
      return {zero_padded(part.to(g.dtype()), xs)};
    };
  }
  return y;
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  Tensor y = ops::scatter_add(x, dim, index, src);
  if (Node* n = recorded("scatter_add", {&x, &src}, y)) {
    n->save(index);
    const Shape ss = src.shape();
    const int d = wrap_dim(dim, x.dim(), "scatter_add");
    n->backward = [ss, d](const Grads& s, const Tensor& g) -> Grads {
      return {g, zero_padded(gather(g, d, s[0]), ss)};
    };
  }
  return y;
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  Tensor y = ops::cat(tensors, dim);
  if (autograd::needs_grad(tensors)) {
    Node& n = autograd::record("cat", tensors, y);
    const int d = wrap_dim(dim, tensors[0].dim(), "cat");
    std::vector<std::pair<int64_t, DType>> parts;  // size along dim and dtype of each input
    for (const Tensor& t : tensors) parts.emplace_back(t.shape()[d], t.dtype());
    n.backward = [parts, d](const Grads&, const Tensor& g) -> Grads {
      Grads out;
      int64_t offset = 0;
      for (auto [len, dt] : parts) {
        out.push_back(g.narrow(d, offset, len).to(dt));
        offset += len;
      }
      return out;
    };
  }
  return y;
}

// Composite: its gradient comes from unsqueeze and cat.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  FRUGAL_CHECK(!tensors.empty() && tensors[0].defined(), "stack: expected at least one defined tensor");
  const int d = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  parts.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    FRUGAL_CHECK(tensors[i].defined(), "stack: tensor ", i, " is undefined");
    FRUGAL_CHECK_SHAPE(tensors[i].shape() == tensors[0].shape(), "stack: tensor ", i, " has shape ",
                       tensors[i].shape(), " but tensor 0 has shape ", tensors[0].shape(),
                       "; all shapes must be equal");
    parts.push_back(unsqueeze(tensors[i], d));
  }
  return cat(parts, d);
}

}  // namespace frugal
