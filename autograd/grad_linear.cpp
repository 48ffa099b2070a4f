// The differentiable fused linear layer, beside its backward rule, which calls the backward op of core/ops.h
// (first order only: the rule is not itself recorded). nn::functional::linear runs it where it applies and
// keeps the composite (matmul, add) as linear_composite, its test reference.
#include "autograd/functions.h"

namespace frugal {

using autograd::forward_only;
using autograd::Grads;
using autograd::Node;
using autograd::recorded;

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  Tensor y = forward_only([&] { return ops::linear(x, weight, bias); });
  if (Node* n = recorded("linear", {&x, &weight, &bias}, y)) {
    const bool need_x = autograd::needs_grad({&x}), need_w = autograd::needs_grad({&weight}),
               need_b = autograd::needs_grad({&bias});
    // Save only what the needed gradients read: d x reads the weight, d weight reads x, d bias neither.
    if (need_x) n->save(weight);
    if (need_w) n->save(x);
    n->backward = [=](const Grads& s, const Tensor& g) -> Grads {
      const Tensor w = need_x ? s[0] : Tensor(), xs = need_w ? s[need_x ? 1 : 0] : Tensor();
      ops::LinearGrads d = ops::linear_backward(g, xs, w, need_x, need_w, need_b);
      return {d.dx, d.dweight, d.dbias};
    };
  }
  return y;
}

}  // namespace frugal
