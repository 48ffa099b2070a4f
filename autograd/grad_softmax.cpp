// Differentiable softmax and log_softmax, each beside its backward rule (the attention probabilities'
// fused softmax is in grad_attention.cpp).
#include "amp/autocast.h"
#include "autograd/functions.h"

namespace frugal {

using autograd::Grads;
using autograd::Node;
using autograd::recorded;

// Both run in f32 under autocast (Note [autocast policy], amp/autocast.h).
Tensor softmax(const Tensor& x_in, int64_t dim) {  // dx = y (g - sum(g y))
  const Tensor x = amp::autocast("softmax", x_in)[0];
  Tensor y = ops::softmax(x, dim);
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
  const Tensor x = amp::autocast("log_softmax", x_in)[0];
  Tensor y = ops::log_softmax(x, dim);
  if (Node* n = recorded("log_softmax", {&x}, y)) {
    n->save_output(y);
    n->backward = [dim](const Grads& s, const Tensor& g) -> Grads {
      return {sub(g, mul(exp(s[0]), sum(g, {dim}, true)))};
    };
  }
  return y;
}

}  // namespace frugal
