// The differentiable fused linear layer (and linear_relu, the same with a ReLU after it), beside their
// backward rules, which call the backward ops of core/ops.h (first order only: the rules are not themselves
// recorded). nn::functional::linear runs it where it applies and keeps the composite (matmul, add) as
// linear_composite, its test reference; nn::functional::linear_relu likewise with
// relu(linear_composite(...)).
#include "autograd/functions.h"
#include "autograd/replay.h"

namespace frugal {

using autograd::Grads;
using autograd::Node;
using autograd::recorded;

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  // Kept by a recompute segment whose policy says so (Note [selective recompute]).
  Tensor y = autograd::detail::replayable("linear", [&] { return ops::linear(x, weight, bias); });
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

Tensor linear_relu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  Tensor y = autograd::detail::replayable("linear_relu", [&] { return ops::linear_relu(x, weight, bias); });
  if (Node* n = recorded("linear_relu", {&x, &weight, &bias}, y)) {
    const bool need_x = autograd::needs_grad({&x}), need_w = autograd::needs_grad({&weight}),
               need_b = autograd::needs_grad({&bias});
    // The output for the ReLU's mask (the next layer keeps it as its input anyway), then as linear.
    n->save_output(y);
    if (need_x) n->save(weight);
    if (need_w) n->save(x);
    n->backward = [=](const Grads& s, const Tensor& g) -> Grads {
      const Tensor w = need_x ? s[1] : Tensor(), xs = need_w ? s[need_x ? 2 : 1] : Tensor();
      // d y is the engine's alone when nothing else shares its storage (not a gradient the caller passed
      // in, nor one retained): d z may overwrite it, saving a new buffer and its first touch.
      const bool own = g.is_unique() && g.is_contiguous() && g.nbytes() == g.storage()->nbytes();
      ops::LinearGrads d = ops::linear_relu_backward(g, xs, w, s[0], need_x, need_w, need_b, own);
      return {d.dx, d.dweight, d.dbias};
    };
  }
  return y;
}

// Note [gelu_linear keeps the GELU's input]
// In an MLP, linear(gelu(h)) keeps two tensors of the hidden width for the backward: h (for gelu') and
// gelu(h) (for the weight's gradient), 4 d a token each, half of what a transformer block keeps. gelu(h) is
// one elementwise pass from h, so this op keeps h alone: its forward makes gelu(h) as a temporary that the
// GEMM reads and drops, and its backward makes it again for d weight (in the same pass as d h where it can:
// Note [gelu_linear's backward in one pass over x]). The results are those of the ops the composed layers
// run (ops::gelu, ops::linear, ops::linear_backward, ops::gelu_backward) on the same operands, so y and the
// gradients are theirs bit for bit, for one GELU evaluation more a step (W3: 4 MiB a block less at the
// peak). layer_norm_linear does the same for a LayerNorm before a Linear (the block's two, and
// the GPT's last norm before its head): it keeps the norm's input x, and its backward runs the norm again
// (y, mean and rstd, the forward's bit for bit) for the Linear's weight gradient and the norm's backward.
// Under autocast the norm before a Linear runs as its own form (Note [layer norm before a Linear under
// autocast]).
//
// Note [gelu_linear's backward in one pass over x]: where both d x and d weight are wanted, the backward
// computes d h = d y w first, then gelu(h) and d x = d h gelu'(h) in one pass (ops::gelu_and_backward_,
// d x over d h; one pass on the CPU, two kernels still on CUDA), then d weight from gelu(h). Two passes over
// h (gelu again, then gelu_backward) would read h twice and compute erf twice: h is a saved activation, long
// out of the caches, and erf the costly part (2 MiB a block in bf16: the second read was about 3.5% of a W6
// step, in the bf16 conversion of the reads). The fused pass gives both ops' results bit for bit, so nothing
// else changes, and the step's peak neither: at most two tensors of h's size live at once, as before (gelu(h)
// with d h). The erf form only: the tanh form's forward and backward compute their tanh's argument in
// different orders, so their t differ.
//
// Note [layer norm before a Linear under autocast]: under autocast (dtype L) the two layers unfused keep
// x-hat in L (Note [layer norm saves x-hat]) and the Linear its input cast to L: two tensors of x's numel in
// L, where the f32 x alone would be as large. layer_norm_linear with `rounded` = L keeps x-hat in L only. Its
// norm makes the Linear's input from x-hat as rounded to L, y = L(L(x-hat) w + b) (ops::layer_norm_rounded),
// so that the backward makes that input again from the kept x-hat bit for bit (ops::layer_norm_affine): the
// Linear's gradients are those of the input the forward used. The forward then differs from the unfused
// layers' by one rounding of x-hat to L before the affine map, an error of L's size, like the x-hat the
// norm's backward reads in both forms. The norm's backward is the x-hat one; d x-hat reaches it in f32, as
// through the unfused layers' cast. W6 (W3 under bf16) keeps 4.5 MiB less: 9 norms before Linears.
Tensor gelu_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, bool tanh) {
  auto act = [tanh](const Tensor& h) { return tanh ? ops::gelu_tanh(h) : ops::gelu(h); };
  Tensor y = autograd::detail::replayable("gelu_linear", [&] { return ops::linear(act(x), weight, bias); });
  if (Node* n = recorded("gelu_linear", {&x, &weight, &bias}, y)) {
    const bool need_x = autograd::needs_grad({&x}), need_w = autograd::needs_grad({&weight}),
               need_b = autograd::needs_grad({&bias});
    if (need_x || need_w) n->save(x);
    if (need_x) n->save(weight);
    n->backward = [=](const Grads& s, const Tensor& g) -> Grads {
      const Tensor xs = need_x || need_w ? s[0] : Tensor(), w = need_x ? s[1] : Tensor();
      if (need_x && need_w && !tanh && ops::has_gelu_and_backward(xs)) {
        // Note [gelu_linear's backward in one pass over x]
        ops::LinearGrads d = ops::linear_backward(g, Tensor(), w, true, false, need_b);
        const Tensor a = ops::gelu_and_backward_(d.dx, xs);
        d.dweight = ops::linear_backward(g, a, Tensor(), false, true, false).dweight;
        return {d.dx, d.dweight, d.dbias};
      }
      ops::LinearGrads d = ops::linear_backward(g, need_w ? act(xs) : Tensor(), w, need_x, need_w, need_b);
      Tensor dx;
      if (need_x) dx = tanh ? ops::gelu_tanh_backward(d.dx, xs) : ops::gelu_backward(d.dx, xs);
      return {dx, d.dweight, d.dbias};
    };
  }
  return y;
}

Tensor layer_norm_linear(const Tensor& x, const Tensor& ln_weight, const Tensor& ln_bias, double eps,
                         const Tensor& weight, const Tensor& bias, std::optional<DType> rounded) {
  const Shape normalized{x.size(-1)};
  // y; the rounded form's x-hat and rstd (kept instead of x), which a recompute segment keeping this op
  // hands out again with y.
  Tensor y, xhat, rstd;
  if (!rounded) {
    y = autograd::detail::replayable("layer_norm_linear", [&] {
      return ops::linear(ops::layer_norm(x, normalized, ln_weight, ln_bias, eps).y, weight, bias);
    });
  } else {
    const std::array<Tensor, 3> out = autograd::detail::replayable("layer_norm_linear", [&] {
      ops::LayerNormResult r = ops::layer_norm_rounded(x, normalized, ln_weight, ln_bias, eps, *rounded);
      Tensor lin = ops::linear(r.y, weight, bias);
      return std::array<Tensor, 3>{lin, r.xhat, r.rstd};
    });
    y = out[0];
    xhat = out[1];
    rstd = out[2];
  }
  if (Node* n = recorded("layer_norm_linear", {&x, &ln_weight, &ln_bias, &weight, &bias}, y)) {
    const bool need_x = autograd::needs_grad({&x}), need_lw = autograd::needs_grad({&ln_weight}),
               need_lb = autograd::needs_grad({&ln_bias}), need_w = autograd::needs_grad({&weight}),
               need_b = autograd::needs_grad({&bias});
    const bool need_norm = need_x || need_lw || need_lb;  // a gradient reaches the norm's output
    // x, the norm's weight and bias where defined, and the Linear's weight where a gradient reaches the
    // norm's output (parameters cost nothing to keep).
    // (Nothing when only the Linear's bias needs a gradient.)
    // (The rounded form: x-hat instead of x, and rstd where the norm's backward runs; Note [layer norm before
    // a Linear under autocast].)
    const bool norm_again = need_w || need_norm;
    const bool has_lw = ln_weight.defined() && norm_again, has_lb = ln_bias.defined() && norm_again;
    if (norm_again) n->save(rounded ? xhat : x);
    if (need_norm && rounded) n->save(rstd);
    if (has_lw) n->save(ln_weight);
    if (has_lb) n->save(ln_bias);
    if (need_norm) n->save(weight);
    const DType x_dtype = x.dtype();
    const DType lw_dtype = has_lw ? ln_weight.dtype() : x_dtype,
                lb_dtype = has_lb ? ln_bias.dtype() : x_dtype;
    n->backward = [=](const Grads& s, const Tensor& g) -> Grads {
      if (!norm_again)
        return {Tensor(), Tensor(), Tensor(), Tensor(),
                ops::linear_backward(g, Tensor(), Tensor(), false, false, need_b).dbias};
      size_t i = rounded && need_norm ? 2 : 1;
      const Tensor& xs = s[0];  // x, or the rounded form's x-hat
      const Tensor lw = has_lw ? s[i++] : Tensor(), lb = has_lb ? s[i++] : Tensor(),
                   w = need_norm ? s[i++] : Tensor();
      // The norm again: its output (and mean and rstd) are the forward's, bit for bit.
      ops::LayerNormResult r;
      if (rounded) {
        if (need_w) r.y = ops::layer_norm_affine(xs, x_dtype, lw, lb);
      } else {
        r = ops::layer_norm(xs, normalized, lw, lb, eps);
      }
      ops::LinearGrads d = ops::linear_backward(g, need_w ? r.y : Tensor(), w, need_norm, need_w, need_b);
      r.y = Tensor();  // done with: not alive through the norm's backward
      Tensor dx, dlw, dlb;
      if (need_norm) {
        ops::LayerNormGrads ln = rounded ? ops::layer_norm_backward_xhat(d.dx, xs, x_dtype, normalized, lw,
                                                                         s[1], need_x, need_lw, need_lb)
                                         : ops::layer_norm_backward(d.dx, xs, normalized, lw, r.mean, r.rstd,
                                                                    need_x, need_lw, need_lb);
        dx = ln.dx;
        dlw = ln.dweight.defined() && ln.dweight.dtype() != lw_dtype ? ops::cast(ln.dweight, lw_dtype)
                                                                     : ln.dweight;
        dlb = ln.dbias.defined() && ln.dbias.dtype() != lb_dtype ? ops::cast(ln.dbias, lb_dtype) : ln.dbias;
      }
      return {dx, dlw, dlb, d.dweight, d.dbias};
    };
  }
  return y;
}

}  // namespace frugal
