// The differentiable fused attention ops, each beside its backward rule: the attention probabilities
// (kernels/cpu/attention.cpp) and the whole attention of packed q, k, v (kernels/cpu/self_attention.cpp).
// nn::functional::attention_scores_softmax and self_attention check the arguments and call them; their
// composite references stay in nn/attention.cpp.
#include <array>

#include "autograd/nn_ops.h"
#include "autograd/replay.h"
#include "core/memory_history.h"
#include "core/op_table_attention.h"
#include "core/parallel.h"

namespace frugal::autograd {

namespace {
// `products` products of [t, hd] by [hd, t] (or [t, t] by [t, hd]) shapes a head, twice their multiply-adds,
// half of them under a causal mask (Note [counted work in a dry run], core/estimate.cpp).
double attention_flops(const SelfAttentionArgs& a, int products) {
  return 2.0 * products * double(a.batch) * double(a.heads) * double(a.t) * double(a.t) * double(a.head_dim) *
         (a.causal ? 0.5 : 1.0);
}
}  // namespace

Tensor attention_scores_softmax(const Tensor& scores, double scale, bool causal) {
  const char* op = "attention_scores_softmax";
  memory::OpScope op_scope(op, scores);  // Note [op names in the history]
  const Tensor x = ops::contiguous(scores.detach());
  Tensor y = empty(x.shape(), x.options());
  AttentionSoftmaxArgs a;
  a.x = x.raw_data();
  a.y = y.raw_data();
  a.t = x.size(-1);
  a.rows = a.t ? x.numel() / a.t : 0;
  a.scale = scale;
  a.causal = causal;
  if (a.rows > 0) op_attention_softmax.get(x.device(), x.dtype())(a);
  if (Node* n = recorded(op, {&scores}, y)) {
    n->save_output(y);
    n->backward = [scale, causal](const Grads& s, const Tensor& g) -> Grads {
      const Tensor& y = s[0];
      const Tensor dy = ops::contiguous(g.dtype() == y.dtype() ? g : ops::cast(g, y.dtype()));
      Tensor dx = empty(y.shape(), y.options());
      AttentionSoftmaxArgs b;
      b.y = y.raw_data();
      b.dy = dy.raw_data();
      b.dx = dx.raw_data();
      b.t = y.size(-1);
      b.rows = b.t ? y.numel() / b.t : 0;
      b.scale = scale;
      b.causal = causal;
      if (b.rows > 0) op_attention_softmax_backward.get(y.device(), y.dtype())(b);
      return {dx};
    };
  }
  return y;
}

// Note [attention keeps row statistics]
// Backward needs each head's probabilities P = softmax(s Q K^T), [T, T] a head: the largest tensor attention
// keeps (W3: 2 MiB a block at batch 32, a tenth of its step's peak), where its input qkv is only 3 d a
// token. Where the device has the stats forms (the CPU), the forward keeps instead each row's max m and
// 1 / l, l its sum of exp(s S - m): 2 numbers a row in the compute type, and the backward computes P again
// from q and k, one more T x T x hd product and T^2 exps a head (W3's step: within noise, 1.02x). The kernels
// repeat the forward's own operations on the same operands at the same alignment, so the P they make is
// the one the forward made, bit for bit: y and d qkv are the probs forms' exactly (FlashAttention keeps the
// same statistic for the same reason, and recomputes in tiles; at T = 64 one head's P fits in L1). Elsewhere
// (CUDA) the probabilities are kept, in f16/bf16 where the device has the low-probs forms.
Tensor self_attention(const Tensor& qkv, int64_t n_heads, int64_t hd, double scale, bool causal) {
  const char* op = "self_attention";
  memory::OpScope op_scope(op, qkv);  // Note [op names in the history]
  const DType dt = qkv.dtype();
  const TensorOptions compute = qkv.options().dtype(compute_dtype(dt));
  const Tensor x = ops::contiguous(qkv.detach());
  const int64_t b = x.size(0), t = x.size(1), d = n_heads * hd;
  // Row statistics instead of the probabilities where the device can (Note [attention keeps row
  // statistics]); else, for f16/bf16, the probabilities in that dtype where it can (op_table_attention.h).
  const bool stats =
      op_self_attention_stats.has(x.device(), dt) && op_self_attention_backward_stats.has(x.device(), dt);
  const bool low_probs = !stats && op_self_attention_low_probs.has(x.device(), dt) &&
                         op_self_attention_backward_low_probs.has(x.device(), dt);
  OpTable<SelfAttentionKernel>& forward_table = stats       ? op_self_attention_stats
                                                : low_probs ? op_self_attention_low_probs
                                                            : op_self_attention;
  OpTable<SelfAttentionKernel>& backward_table = stats       ? op_self_attention_backward_stats
                                                 : low_probs ? op_self_attention_backward_low_probs
                                                             : op_self_attention_backward;
  SelfAttentionArgs a;
  a.batch = b;
  a.t = t;
  a.heads = n_heads;
  a.head_dim = hd;
  a.scale = scale;
  a.causal = causal;
  // The output and the probabilities (or their row statistics), which a recompute segment's policy may keep
  // (Note [selective recompute]).
  std::array<Tensor, 2> results = detail::replayable(op, [&] {
    const Tensor p = stats ? empty({b, n_heads, t, 2}, compute)
                           : empty({b, n_heads, t, t}, low_probs ? x.options() : compute);
    Tensor out = empty({b, t, d}, x.options());
    SelfAttentionArgs f = a;
    f.qkv = x.raw_data();
    (stats ? f.stats : f.probs) = p.raw_data();
    f.y = out.raw_data();
    f.threads = num_threads();
    const Tensor workspace =
        empty({f.threads, self_attention_workspace(f, dt, false, stats || low_probs)}, compute);
    f.workspace = workspace.raw_data();
    // The scores, then P V.
    frugal::detail::count_flops(x.device(), attention_flops(f, 2), double(x.nbytes()));
    if (out.numel() > 0) forward_table.get(x.device(), dt)(f);
    return std::array<Tensor, 2>{out, p};
  });
  Tensor& y = results[0];
  const Tensor& probs = results[1];
  if (Node* n = recorded(op, {&qkv}, y)) {
    n->save(x);
    n->save(probs);
    n->backward = [a, compute, stats, in_scratch = stats || low_probs, backward = &backward_table](
                      const Grads& s, const Tensor& g) -> Grads {
      const Tensor& x = s[0];
      const Tensor dy = ops::contiguous(g.dtype() == x.dtype() ? g : ops::cast(g, x.dtype()));
      Tensor dqkv = empty(x.shape(), x.options());
      SelfAttentionArgs b = a;
      b.threads = num_threads();
      const Tensor workspace =
          empty({b.threads, self_attention_workspace(b, x.dtype(), true, in_scratch)}, compute);
      b.qkv = x.raw_data();
      (stats ? b.stats : b.probs) = s[1].raw_data();
      b.dy = dy.raw_data();
      b.dqkv = dqkv.raw_data();
      b.workspace = workspace.raw_data();
      // dV, dP, dQ and dK, and the scores again where only their row statistics were kept.
      frugal::detail::count_flops(x.device(), attention_flops(b, stats ? 5 : 4),
                                  double(x.nbytes() + dy.nbytes()));
      if (dqkv.numel() > 0) backward->get(x.device(), x.dtype())(b);
      return {dqkv};
    };
  }
  return y;
}

}  // namespace frugal::autograd
