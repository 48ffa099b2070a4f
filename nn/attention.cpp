// The fused attention-probabilities op (forward and its backward rule, kernels in kernels/cpu/attention.cpp)
// with its composite reference, and the CausalSelfAttention and TransformerBlock modules.
#include "nn/attention.h"

#include <cmath>

#include "core/op_table.h"
#include "nn/functional.h"

namespace frugal::nn {

using autograd::Grads;
using autograd::Node;

namespace functional {

namespace {
void check_scores(const Tensor& scores, const char* op) {
  FRUGAL_CHECK(scores.defined(), op, ": the scores tensor is undefined");
  FRUGAL_CHECK_DTYPE(is_floating(scores.dtype()), op,
                     ": expected floating scores (f32, f64, f16, bf16), got ", dtype_name(scores.dtype()),
                     " (shape ", scores.shape(), ")");
  FRUGAL_CHECK_SHAPE(scores.dim() >= 2 && scores.size(-1) == scores.size(-2), op,
                     ": expected scores [..., T, T] (queries x keys, square), got shape ", scores.shape());
}
}  // namespace

// Under autocast it takes and returns its input's dtype (the widest-input rule): the kernel computes in f32
// already, and the probabilities stay in the low dtype for the product with v (Note [autocast policy],
// amp/autocast.h).
Tensor attention_scores_softmax(const Tensor& scores, double scale, bool causal) {
  const char* op = "attention_scores_softmax";
  check_scores(scores, op);
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
  if (Node* n = autograd::recorded(op, {&scores}, y)) {
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

Tensor attention_scores_softmax_composite(const Tensor& scores, double scale, bool causal) {
  check_scores(scores, "attention_scores_softmax_composite");
  Tensor s = mul(scores, scale);
  if (causal) {
    const int64_t t = scores.size(-1);
    const Tensor above = ops::gt(arange(t).unsqueeze(0), arange(t).unsqueeze(1));  // [T, T]: key > query
    s = where(above, scalar_tensor(-INFINITY, s.dtype()), s);
  }
  return softmax(s, -1);
}

}  // namespace functional

namespace F = functional;

CausalSelfAttention::CausalSelfAttention(int64_t d_model_, int64_t n_heads_, double dropout_)
    : Module("CausalSelfAttention"), d_model(d_model_), n_heads(n_heads_), dropout(dropout_) {
  FRUGAL_CHECK(d_model > 0 && n_heads > 0 && d_model % n_heads == 0,
               "CausalSelfAttention: d_model must be a positive multiple of n_heads, got d_model ", d_model,
               " and n_heads ", n_heads);
  FRUGAL_CHECK(dropout >= 0 && dropout < 1, "CausalSelfAttention: dropout must be in [0, 1), got ", dropout);
  qkv = register_module("qkv", std::make_shared<Linear>(d_model, 3 * d_model));
  proj = register_module("proj", std::make_shared<Linear>(d_model, d_model));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  FRUGAL_CHECK_SHAPE(x.defined() && x.dim() == 3 && x.size(2) == d_model,
                     "CausalSelfAttention: expected x [B, T, ", d_model, "], got shape ",
                     x.defined() ? x.shape() : Shape{});
  const int64_t b = x.size(0), t = x.size(1), hd = d_model / n_heads;
  // [B, T, 3d] -> [3, B, H, T, hd]: q, k, v as strided views, no copy.
  const Tensor heads = qkv->forward(x).view({b, t, 3, n_heads, hd}).permute({2, 0, 3, 1, 4});
  const Tensor q = heads.select(0, 0), k = heads.select(0, 1), v = heads.select(0, 2);
  Tensor att = F::attention_scores_softmax(matmul(q, k.transpose(-1, -2)), 1.0 / std::sqrt(double(hd)),
                                           /*causal=*/true);  // [B, H, T, T]
  att = F::dropout(att, dropout, is_training());
  const Tensor y = matmul(att, v).transpose(1, 2).reshape({b, t, d_model});  // merge heads
  return F::dropout(proj->forward(y), dropout, is_training());
}

TransformerBlock::TransformerBlock(int64_t d_model, int64_t n_heads, double dropout_, const GELUOptions& gelu)
    : Module("TransformerBlock"), dropout(dropout_) {
  ln1 = register_module("ln1", std::make_shared<LayerNorm>(Shape{d_model}));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(d_model, n_heads, dropout));
  ln2 = register_module("ln2", std::make_shared<LayerNorm>(Shape{d_model}));
  fc = register_module("fc", std::make_shared<Linear>(d_model, 4 * d_model));
  act = register_module("act", std::make_shared<GELU>(gelu));
  fc_proj = register_module("fc_proj", std::make_shared<Linear>(4 * d_model, d_model));
}

Tensor TransformerBlock::forward(const Tensor& x) {
  const Tensor h = add(x, attn->forward(ln1->forward(x)));
  const Tensor m = fc_proj->forward(act->forward(fc->forward(ln2->forward(h))));
  return add(h, F::dropout(m, dropout, is_training()));
}

}  // namespace frugal::nn
