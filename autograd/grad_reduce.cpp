// Differentiable reductions (sum, mean, max, min, their forms along a dim with indices, var), each beside
// its backward rule.
#include "amp/autocast.h"
#include "autograd/functions.h"

namespace frugal {

using autograd::Grads;
using autograd::Node;
using autograd::recorded;

namespace {

// The reduced dims of a reduction over `dims` (empty = all) of a tensor with `ndim` dims, as a mask.
std::vector<bool> reduced(const Shape& dims, int ndim) {
  std::vector<bool> m(size_t(ndim), dims.empty());
  for (int64_t d : dims) m[size_t(wrap_dim(d, ndim, "reduce"))] = true;
  return m;
}

// A reduction's output (or its gradient) with the reduced dims put back as size 1, so it broadcasts to x.
Tensor keep_dims(const Tensor& t, const Shape& x_shape, const std::vector<bool>& mask) {
  Shape s = x_shape;
  for (int d = 0; d < s.size(); ++d)
    if (mask[size_t(d)]) s[d] = 1;
  return t.reshape(s);
}

int64_t count(const Shape& x_shape, const std::vector<bool>& mask) {
  int64_t n = 1;
  for (int d = 0; d < x_shape.size(); ++d)
    if (mask[size_t(d)]) n *= x_shape[d];
  return n;
}

}  // namespace

// sum, mean and var run in f32 under autocast (Note [autocast policy], amp/autocast.h).
Tensor sum(const Tensor& x_in, const Shape& dims, bool keepdim) {
  const Tensor x = amp::autocast("sum", x_in)[0];
  Tensor y = ops::sum(x, dims, keepdim);
  if (Node* n = recorded("sum", {&x}, y)) {
    const Shape xs = x.shape();
    const auto mask = reduced(dims, x.dim());
    n->backward = [xs, mask](const Grads&, const Tensor& g) -> Grads {
      return {expand(keep_dims(g, xs, mask), xs).contiguous()};
    };
  }
  return y;
}

Tensor mean(const Tensor& x_in, const Shape& dims, bool keepdim) {
  const Tensor x = amp::autocast("mean", x_in)[0];
  Tensor y = ops::mean(x, dims, keepdim);
  if (Node* n = recorded("mean", {&x}, y)) {
    const Shape xs = x.shape();
    const auto mask = reduced(dims, x.dim());
    const double inv = 1.0 / double(std::max<int64_t>(count(xs, mask), 1));
    n->backward = [xs, mask, inv](const Grads&, const Tensor& g) -> Grads {
      return {expand(mul(keep_dims(g, xs, mask), inv), xs).contiguous()};
    };
  }
  return y;
}

namespace {
// max / min: the gradient goes to the elements equal to the result, split evenly among ties.
Tensor extreme(const char* name, const Tensor& x, const Shape& dims, bool keepdim, bool is_max) {
  Tensor y = is_max ? ops::max(x, dims, keepdim) : ops::min(x, dims, keepdim);
  if (Node* n = recorded(name, {&x}, y)) {
    n->save(x);
    n->save_output(y);
    const auto mask = reduced(dims, x.dim());
    n->backward = [mask, dims](const Grads& s, const Tensor& g) -> Grads {
      const Tensor& v = s[0];
      const Tensor hit = eq(v, keep_dims(s[1], v.shape(), mask)).to(v.dtype());
      const Tensor ties = sum(hit, dims, true);
      return {div(mul(hit, keep_dims(g, v.shape(), mask)), ties)};
    };
  }
  return y;
}
}  // namespace

Tensor max(const Tensor& x, const Shape& dims, bool keepdim) {
  return extreme("max", x, dims, keepdim, true);
}
Tensor min(const Tensor& x, const Shape& dims, bool keepdim) {
  return extreme("min", x, dims, keepdim, false);
}

namespace {
// max / min along one dim: the gradient goes to the returned index only (scattered into zeros of x's shape).
ValuesIndices extreme_dim(const char* name, const Tensor& x, int64_t dim, bool keepdim, bool is_max) {
  ValuesIndices r = is_max ? ops::max_dim(x, dim, keepdim) : ops::min_dim(x, dim, keepdim);
  if (Node* n = recorded(name, {&x}, r.values)) {
    n->save(r.indices);
    const Shape xs = x.shape();
    const int d = wrap_dim(dim, x.dim(), name);
    n->backward = [xs, d, keepdim](const Grads& s, const Tensor& g) -> Grads {
      if (xs.size() == 0) return {g};  // a 0-d x is its own maximum
      const Tensor index = keepdim ? s[0] : s[0].unsqueeze(d);
      const Tensor gk = keepdim ? g : g.unsqueeze(d);
      return {scatter_add(zeros(xs, g.options()), d, index, gk)};
    };
  }
  return r;
}
}  // namespace

ValuesIndices max_dim(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_dim("max", x, dim, keepdim, true);
}
ValuesIndices min_dim(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_dim("min", x, dim, keepdim, false);
}

Tensor var(const Tensor& x_in, const Shape& dims, int64_t correction,
           bool keepdim) {  // d = 2 (x - mean) / (n - c)
  const Tensor x = amp::autocast("var", x_in)[0];
  Tensor y = ops::var(x, dims, correction, keepdim);
  if (Node* n = recorded("var", {&x}, y)) {
    n->save(x);
    const auto mask = reduced(dims, x.dim());
    const double scale = 2.0 / double(count(x.shape(), mask) - correction);
    n->backward = [mask, dims, scale](const Grads& s, const Tensor& g) -> Grads {
      const Tensor& v = s[0];
      const Tensor centred = sub(v, mean(v, dims, true));
      return {mul(mul(centred, keep_dims(g, v.shape(), mask)), scale)};
    };
  }
  return y;
}

}  // namespace frugal
