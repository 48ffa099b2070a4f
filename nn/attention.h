// Causal self-attention and the pre-norm transformer block (as in nanoGPT / GPT-2), plus the fused op they
// run: softmax of scaled, causally masked attention scores in one pass (kernels/cpu/attention.cpp), and the
// whole attention of packed q, k, v in one op (kernels/cpu/self_attention.cpp). Not here: the whole model
// (nn/gpt.h).
//
//   namespace F = frugal::nn::functional;
//   Tensor p = F::attention_scores_softmax(matmul(q, k.transpose(-1, -2)), 1 / std::sqrt(64.0), true);
//   nn::CausalSelfAttention attn(128, 4);
//   Tensor y = attn(x);  // x, y: [B, T, 128]
//   nn::TransformerBlock block(128, 4);
//   Tensor h = block(x);  // x + attn(ln1(x)), then h + mlp(ln2(h))
#pragma once

#include <memory>

#include "layers.h"
#include "module.h"
#include "module_holder.h"

namespace frugal::nn {

namespace functional {

// softmax(scale * scores + mask, -1) for scores [..., T, T] (floating; f16/bf16 computed in f32), where mask
// is -inf above the diagonal (key j > query i) when causal and 0 otherwise; those probabilities are exactly
// 0. One fused op: the scaled and masked scores are never stored. Its gradient is first order only.
Tensor attention_scores_softmax(const Tensor& scores, double scale, bool causal);
// The same from mul, where and softmax: the reference the fused op is tested against.
Tensor attention_scores_softmax_composite(const Tensor& scores, double scale, bool causal);

// Multi-head self-attention of q, k, v packed in qkv [B, T, 3 d] (as one Linear d -> 3d gives them: q, k, v
// in that order along the last dim, each split into n_heads heads of d / n_heads): per head softmax(scale q
// k^T), masked as attention_scores_softmax masks it, times v; the heads merged into y [B, T, d]. One fused
// op each way (no head split or merge copies), first order only. For the backward it keeps qkv and, on
// the CPU, each query row's softmax max and 1 / sum [B, H, T, 2], from which the backward computes the
// probabilities again, bit for bit (Note [attention keeps row statistics] in autograd/grad_attention.cpp);
// elsewhere the probabilities [B, H, T, T], for f16/bf16 in their own dtype (computing y from them before
// the rounding), as the composite does. f16/bf16 compute in f32.
Tensor self_attention(const Tensor& qkv, int64_t n_heads, double scale, bool causal);
// The same from views, matmul and attention_scores_softmax: the reference the fused op is tested against.
Tensor self_attention_composite(const Tensor& qkv, int64_t n_heads, double scale, bool causal);

}  // namespace functional

// lin(ln(x)) and lin(act(x)) as one op that keeps x only (F::layer_norm_linear, F::gelu_linear; Note
// [gelu_linear keeps the GELU's input]) where the modules are exactly LayerNorm, GELU and Linear, so that no
// override of forward is skipped (as Sequential's linear_relu); their forwards one after the other otherwise.
// The transformer block and nn::GPT's head run them.
Tensor layer_norm_then_linear(LayerNormImpl& ln, LinearImpl& lin, const Tensor& x);
Tensor gelu_then_linear(GELUImpl& act, LinearImpl& lin, const Tensor& x);

// Multi-head causal self-attention over x [B, T, d_model]: one Linear d -> 3d gives q, k, v, split into
// n_heads heads of d_model / n_heads; each head attends to positions <= its own with scale 1/sqrt(head dim);
// the heads are merged and projected by Linear d -> d. Dropout (when > 0 and training) applies to the
// attention probabilities and to the output, as in nanoGPT.
class CausalSelfAttentionImpl : public Module {
 public:
  CausalSelfAttentionImpl(int64_t d_model, int64_t n_heads, double dropout = 0);
  Tensor forward(const Tensor& x) override;
  // forward(ln(x)), the norm and the qkv Linear as one op that keeps x and not ln(x)
  // (layer_norm_then_linear): what TransformerBlock runs.
  Tensor forward_normed(LayerNormImpl& ln, const Tensor& x);

  int64_t d_model, n_heads;
  double dropout;
  Linear qkv{nullptr}, proj{nullptr};

 private:
  Tensor attend(const Tensor& x, const Tensor& qkv_out);  // the rest of forward, from qkv's output
};
FRUGAL_MODULE(CausalSelfAttention);

// Pre-norm block: x + attn(ln1(x)), then x + mlp(ln2(x)) with mlp = Linear d -> 4d, GELU (exact by
// default, as nn.GELU()), Linear 4d -> d, and dropout on the mlp's output (when > 0 and training).
class TransformerBlockImpl : public Module {
 public:
  TransformerBlockImpl(int64_t d_model, int64_t n_heads, double dropout = 0,
                       const GELUOptions& gelu = GELUOptions());
  Tensor forward(const Tensor& x) override;

  double dropout;
  LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  Linear fc{nullptr}, fc_proj{nullptr};
  GELU act{nullptr};
};
FRUGAL_MODULE(TransformerBlock);

}  // namespace frugal::nn
