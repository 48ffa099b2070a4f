// Differentiable fused batch normalisation (the forward ops and kernels: core/batch_norm.h), beside its
// backward rule. nn::functional::batch_norm checks the arguments and calls it where the device has the
// kernels.
#include "autograd/nn_ops.h"
#include "core/batch_norm.h"

namespace frugal::autograd {

// The fused batch norm (core/batch_norm.h) beside its backward rule (first order only: the rule is not itself
// recorded); arguments checked by nn::functional::batch_norm. The running statistics are updated as the
// composite does, the biased variance recovered from invstd as 1 / invstd^2 - eps. n: values per channel.
Tensor batch_norm_fused(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                        const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps,
                        int64_t n) {
  ops::BatchNormResult r = ops::batch_norm(x, weight, bias, running_mean, running_var, training, eps);
  if (training && running_mean.defined()) {
    NoGradGuard no_grad;
    Tensor rm = running_mean, rv = running_var;
    const Tensor var = ops::sub(ops::div(frugal::ones_like(r.invstd), ops::mul(r.invstd, r.invstd)), eps);
    ops::mul_(rm, 1 - momentum);
    ops::add_(rm, ops::mul(r.mean, momentum));
    ops::mul_(rv, 1 - momentum);
    ops::add_(rv, ops::mul(var, momentum * double(n) / double(n - 1)));
  }
  if (Node* node = recorded("batch_norm", {&x, &weight, &bias}, r.y)) {
    const bool need_x = needs_grad({&x}), need_w = needs_grad({&weight}), need_b = needs_grad({&bias});
    node->save(x);
    node->save(r.mean);
    node->save(r.invstd);
    if (weight.defined()) node->save(weight);
    const DType w_dtype = weight.defined() ? weight.dtype() : x.dtype();
    const DType b_dtype = bias.defined() ? bias.dtype() : x.dtype();
    node->backward = [=](const Grads& s, const Tensor& g) -> Grads {
      const Tensor w = s.size() > 3 ? s[3] : Tensor();
      ops::BatchNormGrads d =
          ops::batch_norm_backward(g, s[0], w, s[1], s[2], training, eps, need_x, need_w, need_b);
      if (d.dweight.defined() && d.dweight.dtype() != w_dtype) d.dweight = ops::cast(d.dweight, w_dtype);
      if (d.dbias.defined() && d.dbias.dtype() != b_dtype) d.dbias = ops::cast(d.dbias, b_dtype);
      return {d.dx, d.dweight, d.dbias};
    };
  }
  return r.y;
}

}  // namespace frugal::autograd
