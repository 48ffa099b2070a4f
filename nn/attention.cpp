// The fused attention ops' checks (their forward and backward rules are in autograd/grad_attention.cpp) with
// their composite references, and the CausalSelfAttention and TransformerBlock modules.
#include "nn/attention.h"

#include <cmath>
#include <typeinfo>

#include "autograd/nn_ops.h"
#include "nn/functional.h"

namespace frugal::nn {

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
  return autograd::attention_scores_softmax(scores, scale, causal);
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

namespace {
// Checks qkv [B, T, 3 d] against n_heads and returns the head dim d / n_heads.
int64_t check_qkv(const Tensor& qkv, int64_t n_heads, const char* op) {
  FRUGAL_CHECK(qkv.defined(), op, ": the qkv tensor is undefined");
  FRUGAL_CHECK_DTYPE(is_floating(qkv.dtype()), op, ": expected a floating qkv (f32, f64, f16, bf16), got ",
                     dtype_name(qkv.dtype()), " (shape ", qkv.shape(), ")");
  FRUGAL_CHECK(n_heads > 0, op, ": n_heads must be positive, got ", n_heads);
  FRUGAL_CHECK_SHAPE(qkv.dim() == 3 && qkv.size(2) % (3 * n_heads) == 0, op,
                     ": expected qkv [B, T, 3 d] with d a multiple of n_heads = ", n_heads, ", got shape ",
                     qkv.shape());
  return qkv.size(2) / (3 * n_heads);
}
}  // namespace

Tensor self_attention(const Tensor& qkv, int64_t n_heads, double scale, bool causal) {
  const char* op = "self_attention";
  const int64_t hd = check_qkv(qkv, n_heads, op);
  return autograd::self_attention(qkv, n_heads, hd, scale, causal);
}

Tensor self_attention_composite(const Tensor& qkv, int64_t n_heads, double scale, bool causal) {
  const int64_t hd = check_qkv(qkv, n_heads, "self_attention_composite");
  const int64_t b = qkv.size(0), t = qkv.size(1), d = n_heads * hd;
  // [B, T, 3d] -> [3, B, H, T, hd]: q, k, v as strided views.
  const Tensor heads = qkv.reshape({b, t, 3, n_heads, hd}).permute({2, 0, 3, 1, 4});
  const Tensor q = heads.select(0, 0), k = heads.select(0, 1), v = heads.select(0, 2);
  const Tensor att = attention_scores_softmax(matmul(q, k.transpose(-1, -2)), scale, causal);  // [B, H, T, T]
  return matmul(att, v).transpose(1, 2).reshape({b, t, d});                                    // merge heads
}

}  // namespace functional

namespace F = functional;

CausalSelfAttentionImpl::CausalSelfAttentionImpl(int64_t d_model_, int64_t n_heads_, double dropout_)
    : Module("CausalSelfAttention"), d_model(d_model_), n_heads(n_heads_), dropout(dropout_) {
  FRUGAL_CHECK(d_model > 0 && n_heads > 0 && d_model % n_heads == 0,
               "CausalSelfAttention: d_model must be a positive multiple of n_heads, got d_model ", d_model,
               " and n_heads ", n_heads);
  FRUGAL_CHECK(dropout >= 0 && dropout < 1, "CausalSelfAttention: dropout must be in [0, 1), got ", dropout);
  qkv = register_module("qkv", Linear(d_model, 3 * d_model));
  proj = register_module("proj", Linear(d_model, d_model));
}

Tensor CausalSelfAttentionImpl::forward(const Tensor& x) {
  FRUGAL_CHECK_SHAPE(x.defined() && x.dim() == 3 && x.size(2) == d_model,
                     "CausalSelfAttention: expected x [B, T, ", d_model, "], got shape ",
                     x.defined() ? x.shape() : Shape{});
  return attend(x, qkv->forward(x));
}

Tensor layer_norm_then_linear(LayerNormImpl& ln, LinearImpl& lin, const Tensor& x) {
  if (typeid(ln) != typeid(LayerNormImpl) || typeid(lin) != typeid(LinearImpl))
    return lin.forward(ln.forward(x));
  lin.apply_masks();
  return F::layer_norm_linear(x, ln.options.normalized_shape(), ln.weight, ln.bias, ln.options.eps(),
                              lin.weight, lin.bias);
}

Tensor gelu_then_linear(GELUImpl& act, LinearImpl& lin, const Tensor& x) {
  if (typeid(act) != typeid(GELUImpl) || typeid(lin) != typeid(LinearImpl))
    return lin.forward(act.forward(x));
  lin.apply_masks();
  return F::gelu_linear(x, lin.weight, lin.bias, act.options.approximate());
}

Tensor CausalSelfAttentionImpl::forward_normed(LayerNormImpl& ln, const Tensor& x) {
  FRUGAL_CHECK_SHAPE(x.defined() && x.dim() == 3 && x.size(2) == d_model,
                     "CausalSelfAttention: expected x [B, T, ", d_model, "], got shape ",
                     x.defined() ? x.shape() : Shape{});
  return attend(x, layer_norm_then_linear(ln, *qkv, x));
}

Tensor CausalSelfAttentionImpl::attend(const Tensor& x, const Tensor& qkv_out) {
  const int64_t b = x.size(0), t = x.size(1), hd = d_model / n_heads;
  const double scale = 1.0 / std::sqrt(double(hd));
  Tensor y;
  if (dropout > 0 && is_training()) {
    // Dropout on the probabilities needs them as a tensor: the composite path.
    const Tensor heads = qkv_out.view({b, t, 3, n_heads, hd}).permute({2, 0, 3, 1, 4});
    const Tensor q = heads.select(0, 0), k = heads.select(0, 1), v = heads.select(0, 2);
    Tensor att = F::attention_scores_softmax(matmul(q, k.transpose(-1, -2)), scale, /*causal=*/true);
    att = F::dropout(att, dropout, is_training());
    y = matmul(att, v).transpose(1, 2).reshape({b, t, d_model});  // merge heads
  } else {
    y = F::self_attention(qkv_out, n_heads, scale, /*causal=*/true);
  }
  return F::dropout(proj->forward(y), dropout, is_training());
}

TransformerBlockImpl::TransformerBlockImpl(int64_t d_model, int64_t n_heads, double dropout_,
                                           const GELUOptions& gelu)
    : Module("TransformerBlock"), dropout(dropout_) {
  ln1 = register_module("ln1", LayerNorm(Shape{d_model}));
  attn = register_module("attn", CausalSelfAttention(d_model, n_heads, dropout));
  ln2 = register_module("ln2", LayerNorm(Shape{d_model}));
  fc = register_module("fc", Linear(d_model, 4 * d_model));
  act = register_module("act", GELU(gelu));
  fc_proj = register_module("fc_proj", Linear(4 * d_model, d_model));
}

Tensor TransformerBlockImpl::forward(const Tensor& x) {
  // Each norm with the Linear after it, and fc_proj(act(.)), as ops that keep their inputs only.
  const Tensor h = add(x, attn->forward_normed(*ln1, x));
  const Tensor m = gelu_then_linear(*act, *fc_proj, layer_norm_then_linear(*ln2, *fc, h));
  return add(h, F::dropout(m, dropout, is_training()));
}

}  // namespace frugal::nn
