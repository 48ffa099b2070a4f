// Differentiable softmax and log_softmax, each beside its backward rule (the attention probabilities'
// fused softmax is in grad_attention.cpp).
#include "amp/autocast.h"
#include "autograd/functions.h"
#include "core/op_table_softmax.h"

namespace frugal {

using autograd::Grads;
using autograd::Node;
using autograd::recorded;

namespace {
// The input's gradient from the output y and its gradient g. Along the last dim of contiguous tensors, one
// kernel and no temporary of y's size (op_softmax_backward); otherwise, and for a g of another dtype, the
// same formula through the ops.
Tensor softmax_backward(const Tensor& y, const Tensor& g, int64_t dim, bool log) {
  const bool last = y.dim() == 0 || wrap_dim(dim, y.dim(), log ? "log_softmax" : "softmax") == y.dim() - 1;
  if (last && y.is_contiguous() && g.is_contiguous() && g.dtype() == y.dtype() && g.device() == y.device() &&
      g.shape() == y.shape()) {
    Tensor dx = empty(y.shape(), y.options());
    SoftmaxBackwardArgs a;
    a.y = y.raw_data();
    a.grad = g.raw_data();
    a.dx = dx.raw_data();
    a.cols = y.dim() == 0 ? 1 : y.size(-1);
    a.rows = a.cols ? y.numel() / a.cols : 0;
    a.log = log;
    if (y.numel() > 0) op_softmax_backward.get(y.device(), y.dtype())(a);
    return dx;
  }
  return log ? sub(g, mul(exp(y), sum(g, {dim}, true))) : mul(y, sub(g, sum(mul(g, y), {dim}, true)));
}
}  // namespace

// Both run in f32 under autocast (Note [autocast policy], amp/autocast.h).
Tensor softmax(const Tensor& x_in, int64_t dim) {  // dx = y (g - sum(g y))
  const Tensor x = amp::autocast("softmax", x_in)[0];
  Tensor y = ops::softmax(x, dim);
  if (Node* n = recorded("softmax", {&x}, y)) {
    n->save_output(y);
    n->backward = [dim](const Grads& s, const Tensor& g) -> Grads {
      return {softmax_backward(s[0], g, dim, false)};
    };
  }
  return y;
}

Tensor log_softmax(const Tensor& x_in, int64_t dim) {  // dx = g - exp(y) sum(g)
  const Tensor x = amp::autocast("log_softmax", x_in)[0];
  Tensor y = ops::log_softmax(x, dim);
  if (Node* n = recorded("log_softmax", {&x}, y)) {
    n->save_output(y);
    n->backward = [dim](const Grads& s, const Tensor& g) -> Grads {
      return {softmax_backward(s[0], g, dim, true)};
    };
  }
  return y;
}

}  // namespace frugal
