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

// The Tensor methods: thin calls into the functions above (one hop of dispatch).
Tensor Tensor::view(const Shape& shape) const { return frugal::view(*this, shape); }
Tensor Tensor::reshape(const Shape& shape) const { return frugal::reshape(*this, shape); }
Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  return frugal::flatten(*this, start_dim, end_dim);
}
Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const { return frugal::transpose(*this, dim0, dim1); }
Tensor Tensor::t() const {
  FRUGAL_CHECK_SHAPE(dim() <= 2, "t: expected a tensor of at most 2 dims, got shape ", shape(),
                     "; use transpose(dim0, dim1)");
  return dim() < 2 ? *this : transpose(0, 1);
}
Tensor Tensor::permute(const Shape& dims) const { return frugal::permute(*this, dims); }
Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  return frugal::narrow(*this, dim, start, length);
}
Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  return frugal::slice(*this, dim, start, end, step);
}
Tensor Tensor::select(int64_t dim, int64_t index) const { return frugal::select(*this, dim, index); }
Tensor Tensor::expand(const Shape& shape) const { return frugal::expand(*this, shape); }
Tensor Tensor::squeeze() const { return frugal::squeeze(*this); }
Tensor Tensor::squeeze(int64_t dim) const { return frugal::squeeze(*this, dim); }
Tensor Tensor::unsqueeze(int64_t dim) const { return frugal::unsqueeze(*this, dim); }
Tensor Tensor::as_strided(const Shape& shape, const Shape& strides, int64_t element_offset) const {
  const auto& m = autograd_meta();
  FRUGAL_CHECK(!(autograd::grad_mode_enabled() && m && (m->requires_grad || m->grad_fn)),
               "as_strided: not differentiable; the tensor (shape ", this->shape(),
               ") requires grad: use view, reshape, slice or expand, or detach() first");
  return ops::as_strided(*this, shape, strides, element_offset);
}
Tensor Tensor::contiguous() const { return frugal::contiguous(*this); }
Tensor Tensor::clone() const { return frugal::clone(*this); }
Tensor Tensor::to(DType t) const { return t == dtype() ? *this : cast(*this, t); }
Tensor Tensor::to(Device d) const { return frugal::to(*this, d); }

Tensor Tensor::operator-() const { return frugal::neg(*this); }
Tensor Tensor::sum() const { return frugal::sum(*this); }
Tensor Tensor::mean() const { return frugal::mean(*this); }
Tensor Tensor::sum(const Shape& dims, bool keepdim) const { return frugal::sum(*this, dims, keepdim); }
Tensor Tensor::mean(const Shape& dims, bool keepdim) const { return frugal::mean(*this, dims, keepdim); }
Tensor Tensor::matmul(const Tensor& other) const { return frugal::matmul(*this, other); }

}  // namespace frugal
