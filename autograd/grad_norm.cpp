// Differentiable fused layer normalisation, beside its backward rule, which calls the backward op of
// core/ops.h (first order only: the rule is not itself recorded). The composite it replaces,
// nn::functional::layer_norm_composite, is its test reference.
#include "autograd/autocast_casts.h"
#include "autograd/functions.h"

namespace frugal {

using autograd::forward_only;
using autograd::Grads;
using autograd::Node;
using autograd::recorded;

Tensor layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight_in,
                  const Tensor& bias_in, double eps) {
  // In f32 under autocast, so it returns f32 (Note [autocast policy], amp/autocast.h).
  const Tensor x = autograd::autocast_f32(x_in), weight = autograd::autocast_f32(weight_in),
               bias = autograd::autocast_f32(bias_in);
  ops::LayerNormResult r =
      forward_only([&] { return ops::layer_norm(x, normalized_shape, weight, bias, eps); });
  if (Node* n = recorded("layer_norm", {&x, &weight, &bias}, r.y)) {
    const bool need_x = autograd::needs_grad({&x}), need_w = autograd::needs_grad({&weight}),
               need_b = autograd::needs_grad({&bias});
    // x, mean and rstd give x-hat; the weight scales the gradient reaching x-hat.
    n->save(x);
    n->save(r.mean);
    n->save(r.rstd);
    if (weight.defined()) n->save(weight);
    const DType w_dtype = weight.defined() ? weight.dtype() : x.dtype();
    const DType b_dtype = bias.defined() ? bias.dtype() : x.dtype();
    n->backward = [=](const Grads& s, const Tensor& g) -> Grads {
      const Tensor w = s.size() > 3 ? s[3] : Tensor();
      ops::LayerNormGrads d =
          ops::layer_norm_backward(g, s[0], normalized_shape, w, s[1], s[2], need_x, need_w, need_b);
      if (d.dweight.defined() && d.dweight.dtype() != w_dtype) d.dweight = ops::cast(d.dweight, w_dtype);
      if (d.dbias.defined() && d.dbias.dtype() != b_dtype) d.dbias = ops::cast(d.dbias, b_dtype);
      return {d.dx, d.dweight, d.dbias};
    };
  }
  return r.y;
}

}  // namespace frugal
