// The fused differentiable ops behind nn::functional's layers and losses, each beside its backward rule:
// batch norm (autograd/grad_batch_norm.cpp), softmax + cross-entropy (grad_loss.cpp), the attention
// probabilities and the whole self-attention (grad_attention.cpp), the embedding with a sparse gradient
// (sparse.cpp). They take arguments nn::functional has already checked: call nn::functional, which also
// falls back to a composite where a device lacks the fused kernels.
//
//   Tensor p = autograd::attention_scores_softmax(scores, 0.125, /*causal=*/true);  // scores [..., T, T]
//   p.sum().backward();
#pragma once

#include <cstdint>

#include "functions.h"

namespace frugal::autograd {

// Batch norm of x [N, C, ...] with the fused kernels; updates the running statistics when training (n: values
// per channel). First order only.
Tensor batch_norm_fused(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                        const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps,
                        int64_t n);
// The unreduced softmax cross-entropy of logits [N, C] and i64 targets [N] (f32 loss for f16/bf16 logits).
Tensor cross_entropy_rows(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                          double label_smoothing);
// softmax(scale scores) over the last dim of scores [..., T, T], keys after the query masked when causal.
Tensor attention_scores_softmax(const Tensor& scores, double scale, bool causal);
// The whole attention of qkv [B, T, 3 d] with n_heads heads of head_dim each: y [B, T, d].
Tensor self_attention(const Tensor& qkv, int64_t n_heads, int64_t head_dim, double scale, bool causal);
// weight's rows at flat (i64 [n]) whose gradient goes to the weight's sparse slot (Note [sparse gradients],
// autograd/sparse.h); pad: the row that gets no gradient, -1 for none.
Tensor embedding_sparse(const Tensor& flat, const Tensor& weight, int64_t pad);

}  // namespace frugal::autograd
