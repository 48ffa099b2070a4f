// Differentiable views and copies, and the Tensor methods that reach them (declared in core/tensor.h).
#include <numeric>

#include "autograd/functions.h"

namespace frugal {

using autograd::Grads;
using autograd::Node;
using autograd::recorded;

namespace {
// Records y as a function of x whose gradient is `rule(g)` (no saved tensors: views only need shapes).
template <typename Rule>
Tensor shaped(const char* name, const Tensor& x, Tensor y, Rule rule) {
  // core returns x itself for a view that changes nothing (squeeze of a dim not of size 1, transpose of a 0-d
  // tensor): x already carries its own gradient, and it must not be recorded as its own output.
  if (y.is_same(x)) return y;
  if (Node* n = recorded(name, {&x}, y))
    n->backward = [rule](const Grads&, const Tensor& g) -> Grads { return {rule(g)}; };
  return y;
}

// The gradient of a view that picked part of x: zeros with g written where the part was.
template <typename Pick>
Tensor scatter_into(const Shape& shape, const Tensor& g, Pick pick) {
  Tensor out = zeros(shape, g.options());
  Tensor part = pick(out);
  part.copy_(g);
  return out;
}
}  // namespace

Tensor view(const Tensor& x, const Shape& shape) {
  const Shape xs = x.shape();
  return shaped("view", x, ops::view(x, shape), [xs](const Tensor& g) { return g.reshape(xs); });
}
Tensor reshape(const Tensor& x, const Shape& shape) {
  const Shape xs = x.shape();
  return shaped("reshape", x, ops::reshape(x, shape), [xs](const Tensor& g) { return g.reshape(xs); });
}
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  return shaped("transpose", x, ops::transpose(x, dim0, dim1),
                [dim0, dim1](const Tensor& g) { return g.transpose(dim0, dim1); });
}
Tensor permute(const Tensor& x, const Shape& dims) {
  Tensor y = ops::permute(x, dims);
  Shape inverse = Shape::filled(dims.size(), 0);
  for (int i = 0; i < dims.size(); ++i) inverse[wrap_dim(dims[i], dims.size(), "permute")] = i;
  return shaped("permute", x, y, [inverse](const Tensor& g) { return g.permute(inverse); });
}
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  const Shape xs = x.shape();
  return shaped("narrow", x, ops::narrow(x, dim, start, length), [xs, dim, start, length](const Tensor& g) {
    return scatter_into(xs, g, [&](const Tensor& o) { return o.narrow(dim, start, length); });
  });
}
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  const Shape xs = x.shape();
  return shaped("slice", x, ops::slice(x, dim, start, end, step),
                [xs, dim, start, end, step](const Tensor& g) {
                  return scatter_into(xs, g, [&](const Tensor& o) { return o.slice(dim, start, end, step); });
                });
}
Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  const Shape xs = x.shape();
  return shaped("select", x, ops::select(x, dim, index), [xs, dim, index](const Tensor& g) {
    return scatter_into(xs, g, [&](const Tensor& o) { return o.select(dim, index); });
  });
}
Tensor expand(const Tensor& x, const Shape& shape) {
  const Shape xs = x.shape();
  return shaped("expand", x, ops::expand(x, shape),
                [xs](const Tensor& g) { return autograd::sum_to(g, xs); });
}
Tensor squeeze(const Tensor& x) {
  const Shape xs = x.shape();
  return shaped("squeeze", x, ops::squeeze(x), [xs](const Tensor& g) { return g.reshape(xs); });
}
Tensor squeeze(const Tensor& x, int64_t dim) {
  const Shape xs = x.shape();
  return shaped("squeeze", x, ops::squeeze(x, dim), [xs](const Tensor& g) { return g.reshape(xs); });
}
Tensor unsqueeze(const Tensor& x, int64_t dim) {
  const Shape xs = x.shape();
  return shaped("unsqueeze", x, ops::unsqueeze(x, dim), [xs](const Tensor& g) { return g.reshape(xs); });
}
Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  const Shape xs = x.shape();
  return shaped("flatten", x, ops::flatten(x, start_dim, end_dim),
                [xs](const Tensor& g) { return g.reshape(xs); });
}
Tensor contiguous(const Tensor& x) { return x.is_contiguous() ? x : clone(x); }
Tensor clone(const Tensor& x) {
  return shaped("clone", x, ops::clone(x), [](const Tensor& g) { return g; });
}
Tensor to(const Tensor& x, Device device) {
  if (device == x.device()) return x;
  const Device from = x.device();
  return shaped("to", x, ops::to(x, device), [from](const Tensor& g) { return g.to(from); });
}

}  // namespace frugal
