// Differentiable fused layer normalisation, beside its backward rule, which calls the backward op of
// core/ops.h (first order only: the rule is not itself recorded). The composite it replaces,
// nn::functional::layer_norm_composite, is its test reference. Under autocast it keeps x-hat in the low
// dtype instead of its f32 input (Note [layer norm saves x-hat]).
#include <optional>

#include "amp/autocast.h"
#include "autograd/functions.h"

namespace frugal {

using autograd::Grads;
using autograd::Node;
using autograd::recorded;

// Note [layer norm saves x-hat]: the backward of layer norm needs only x-hat = (x - mean) rstd, rstd, the
// weight and the incoming gradient g (dx = rstd (g w - mean(g w) - x-hat mean(g w x-hat)), dweight = sum g
// x-hat, dbias = sum g). Outside autocast it keeps x, mean and rstd, as PyTorch does: x is usually alive
// anyway and x-hat would be a second tensor of its size. Under autocast (dtype L), where layer norm runs in
// f32 (Note [autocast policy], amp/autocast.h), its input is the f32 residual stream of a transformer, which
// nothing else keeps for backward; there it keeps x-hat rounded to L instead (and rstd): half the bytes. A
// rounded x would not do: x - mean cancels, and the rounding error of x, relative to x, becomes an error
// relative to x - mean that is as large as x's offset is large against its spread. x-hat has mean 0 and
// variance 1, so rounding it costs L's relative error uniformly, like rounding the GEMM inputs next to it.
// The forward's y is the same bit for bit either way. Devices without the x-hat kernels
// (ops::has_layer_norm_xhat) keep x.

namespace {

Tensor layer_norm_impl(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                       const Tensor& bias, double eps, std::optional<DType> xhat_dtype) {
  ops::LayerNormResult r = ops::layer_norm(x, normalized_shape, weight, bias, eps, xhat_dtype);
  if (Node* n = recorded("layer_norm", {&x, &weight, &bias}, r.y)) {
    const bool need_x = autograd::needs_grad({&x}), need_w = autograd::needs_grad({&weight}),
               need_b = autograd::needs_grad({&bias});
    // x, mean and rstd give x-hat (or x-hat itself and rstd); the weight scales the gradient reaching x-hat.
    if (xhat_dtype) {
      n->save(r.xhat);
      n->save(r.rstd);
    } else {
      n->save(x);
      n->save(r.mean);
      n->save(r.rstd);
    }
    if (weight.defined()) n->save(weight);
    const DType x_dtype = x.dtype();
    const DType w_dtype = weight.defined() ? weight.dtype() : x_dtype;
    const DType b_dtype = bias.defined() ? bias.dtype() : x_dtype;
    const size_t n_stats = xhat_dtype ? 2 : 3;
    n->backward = [=](const Grads& s, const Tensor& g) -> Grads {
      const Tensor w = s.size() > n_stats ? s[n_stats] : Tensor();
      ops::LayerNormGrads d = n_stats == 2 ? ops::layer_norm_backward_xhat(g, s[0], x_dtype, normalized_shape,
                                                                           w, s[1], need_x, need_w, need_b)
                                           : ops::layer_norm_backward(g, s[0], normalized_shape, w, s[1],
                                                                      s[2], need_x, need_w, need_b);
      if (d.dweight.defined() && d.dweight.dtype() != w_dtype) d.dweight = ops::cast(d.dweight, w_dtype);
      if (d.dbias.defined() && d.dbias.dtype() != b_dtype) d.dbias = ops::cast(d.dbias, b_dtype);
      return {d.dx, d.dweight, d.dbias};
    };
  }
  return r.y;
}

}  // namespace

Tensor layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight_in,
                  const Tensor& bias_in, double eps) {
  // In f32 under autocast, so it returns f32 (Note [autocast policy], amp/autocast.h).
  const auto in = amp::autocast("layer_norm", x_in, weight_in, bias_in);
  const Tensor &x = in[0], &weight = in[1], &bias = in[2];
  std::optional<DType> xhat_dtype;  // Note [layer norm saves x-hat]
  if (amp::is_autocast_enabled() && x.defined() && x.dtype() == DType::F32 &&
      autograd::needs_grad({&x, &weight, &bias}) && ops::has_layer_norm_xhat(x.device(), x.dtype()))
    xhat_dtype = amp::autocast_dtype();
  return layer_norm_impl(x, normalized_shape, weight, bias, eps, xhat_dtype);
}

namespace autograd {

Tensor layer_norm_saving_xhat(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight_in,
                              const Tensor& bias_in, double eps, DType xhat_dtype) {
  const auto in = amp::autocast("layer_norm", x_in, weight_in, bias_in);
  const Tensor &x = in[0], &weight = in[1], &bias = in[2];
  return layer_norm_impl(x, normalized_shape, weight, bias, eps, xhat_dtype);
}

}  // namespace autograd

}  // namespace frugal
