// Differentiable reductions, matmul and softmax, each beside its backward rule.
#include "autograd/autocast_casts.h"
#include "autograd/functions.h"

namespace frugal {

using autograd::autocast_f32;
using autograd::autocast_lower;
using autograd::forward_only;
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

// sum, mean, var, softmax and log_softmax run in f32 under autocast, matmul in its low dtype (Note [autocast
// policy], amp/autocast.h).
Tensor sum(const Tensor& x_in, const Shape& dims, bool keepdim) {
  const Tensor x = autocast_f32(x_in);
  Tensor y = forward_only([&] { return ops::sum(x, dims, keepdim); });
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
  const Tensor x = autocast_f32(x_in);
  Tensor y = forward_only([&] { return ops::mean(x, dims, keepdim); });
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
  Tensor y = forward_only([&] { return is_max ? ops::max(x, dims, keepdim) : ops::min(x, dims, keepdim); });
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

Tensor var(const Tensor& x_in, const Shape& dims, int64_t correction,
           bool keepdim) {  // d = 2 (x - mean) / (n - c)
  const Tensor x = autocast_f32(x_in);
  Tensor y = forward_only([&] { return ops::var(x, dims, correction, keepdim); });
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

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = autocast_lower(a_in), b = autocast_lower(b_in);
  Tensor y = forward_only([&] { return ops::matmul(a, b); });
  if (Node* n = recorded("matmul", {&a, &b}, y)) {
    n->save(a);
    n->save(b);
    n->backward = [](const Grads& s, const Tensor& g) -> Grads {
      // With 1-D operands made 2-D as in the forward: dA = g B^T, dB = A^T g, then broadcast batch dims
      // summed.
      const Tensor& a = s[0];
      const Tensor& b = s[1];
      const Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
      const Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
      Tensor g2 = a.dim() == 1 ? g.unsqueeze(g.dim() - (b.dim() == 1 ? 0 : 1)) : g;
      if (b.dim() == 1) g2 = g2.unsqueeze(-1);
      const Tensor da = autograd::sum_to(matmul(g2, b2.transpose(-1, -2)), a2.shape()).reshape(a.shape());
      const Tensor db = autograd::sum_to(matmul(a2.transpose(-1, -2), g2), b2.shape()).reshape(b.shape());
      return {da, db};
    };
  }
  return y;
}

Tensor softmax(const Tensor& x_in, int64_t dim) {  // dx = y (g - sum(g y))
  const Tensor x = autocast_f32(x_in);
  Tensor y = forward_only([&] { return ops::softmax(x, dim); });
  if (Node* n = recorded("softmax", {&x}, y)) {
    n->save_output(y);
    n->backward = [dim](const Grads& s, const Tensor& g) -> Grads {
      const Tensor& y = s[0];
      return {mul(y, sub(g, sum(mul(g, y), {dim}, true)))};
    };
  }
  return y;
}

Tensor log_softmax(const Tensor& x_in, int64_t dim) {  // dx = g - exp(y) sum(g)
  const Tensor x = autocast_f32(x_in);
  Tensor y = forward_only([&] { return ops::log_softmax(x, dim); });
  if (Node* n = recorded("log_softmax", {&x}, y)) {
    n->save_output(y);
    n->backward = [dim](const Grads& s, const Tensor& g) -> Grads {
      return {sub(g, mul(exp(s[0]), sum(g, {dim}, true)))};
    };
  }
  return y;
}

}  // namespace frugal
