// nn::functional: the stateless forms of the layers (linear, dropout, norms, embedding) and the losses. Most
// are composites of differentiable ops (their gradients come from autograd/); cross_entropy on [N, C] logits
// runs the fused one-pass kernel (op_cross_entropy, kernels/cpu/cross_entropy.cpp).
//
//   namespace F = frugal::nn::functional;
//   Tensor logits = F::linear(x, w, b);                       // x [N, in], w [out, in], b [out]
//   Tensor loss = F::cross_entropy(logits, labels);           // labels: i64 [N]
//   Tensor l2 = F::mse_loss(pred, target, F::Reduction::Sum);
#pragma once

#include <cstdint>
#include <optional>

#include "../autograd/functions.h"
#include "../core/rng.h"

namespace frugal::nn::functional {

// How a loss reduces its per-element values. BatchMean (sum / batch size) is kl_div's only.
enum class Reduction { None, Mean, Sum, BatchMean };
const char* reduction_name(Reduction r);

// ---- Layers ----

// y = x @ weight^T + bias; x [..., in], weight [out, in], bias [out] or undefined. One fused GEMM
// (frugal::linear) when the three share a dtype that has a GEMM kernel, the composite otherwise.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});
// The same from matmul and add (x [M, in] or batched): the reference the fused op is tested against.
Tensor linear_composite(const Tensor& x, const Tensor& weight, const Tensor& bias = {});
// relu(linear(x, weight, bias)) as one fused op (frugal::linear_relu: the bias added inside the GEMM where
// the device can, the ReLU applied in place, y kept for the backward's mask) under the same conditions,
// relu(linear_composite(...)) otherwise; a NaN comes through as relu lets it. nn::Sequential runs it for a
// Linear followed by a ReLU.
Tensor linear_relu(const Tensor& x, const Tensor& weight, const Tensor& bias = {});
// linear(gelu(x), weight, bias) (approximate "tanh": gelu_tanh), keeping x and not gelu(x) for the backward,
// which computes it again (frugal::gelu_linear, Note [gelu_linear keeps the GELU's input]) under the same
// conditions as linear's fused op, the composed ops otherwise. The transformer block's MLP runs it.
Tensor gelu_linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
                   const std::string& approximate = "none");

// Zeroes each element with probability p and scales the rest by 1 / (1 - p) when training; x itself
// otherwise. Drawn from the default generator, so recompute segments replay the same mask.
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true);

// Normalises over the trailing dims named by normalized_shape: (x - mean) / sqrt(var + eps) * weight + bias
// (biased variance; weight and bias of normalized_shape, or undefined). f16/bf16 inputs compute in f32. Runs
// the fused op (frugal::layer_norm, autograd/functions.h).
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);
// linear(layer_norm(x, normalized_shape, ln_weight, ln_bias, eps), weight, bias), keeping x and not the
// norm's output for the backward, which computes it again (frugal::layer_norm_linear): where normalized_shape
// is x's last dim, with linear's fused op's conditions; the two layers otherwise. Under autocast (x in f32
// after its cast) it keeps the norm's x-hat in the low dtype instead of x, and the norm's output is made from
// that rounded x-hat (Note [layer norm before a Linear under autocast], autograd/grad_linear.cpp). The
// transformer block's norms before their Linears and nn::GPT's last norm before its head run it.
Tensor layer_norm_linear(const Tensor& x, const Shape& normalized_shape, const Tensor& ln_weight,
                         const Tensor& ln_bias, double eps, const Tensor& weight, const Tensor& bias = {});
// The same, composed from mean, var, rsqrt, mul and add: the reference the fused op is tested against.
Tensor layer_norm_composite(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {},
                            const Tensor& bias = {}, double eps = 1e-5);

// Batch norm over x [N, C, ...] per channel. Training: batch statistics over every dim but C (biased variance
// to normalise), and running_mean / running_var (if defined) updated in place as
// r = (1 - momentum) r + momentum s, with the unbiased variance. Not training: the running statistics. Runs
// the fused op (core/batch_norm.h) where x's device has its kernels, a composite of mean, var and elementwise
// ops elsewhere; f16/bf16 inputs compute in f32.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight = {}, const Tensor& bias = {}, bool training = false,
                  double momentum = 0.1, double eps = 1e-5);

// Rows of weight [num_embeddings, dim] at the integer indices `input` (any shape): input.shape + [dim]. The
// row padding_idx gets no gradient. The weight's gradient is dense, or with `sparse` (the weight then must be
// a leaf) row-wise sparse: autograd::sparse_grad(weight) (Note [sparse gradients], autograd/sparse.h).
Tensor embedding(const Tensor& input, const Tensor& weight, std::optional<int64_t> padding_idx = std::nullopt,
                 bool sparse = false);

// ---- Losses ----
// Every loss checks shapes and dtypes and throws an Error naming the op and what it was given.

// Softmax cross-entropy of logits [N, C] (or [N, C, d...], or [C] with a 0-d target) against class indices
// (i64, [N] or [N, d...]), as PyTorch defines it: targets equal to ignore_index contribute nothing and Mean
// divides by the number of the others; label smoothing eps mixes the one-hot target with the uniform
// distribution: loss = (1 - eps) * nll + eps * mean_j(-log p_j). Runs the fused kernel.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction = Reduction::Mean,
                     int64_t ignore_index = -100, double label_smoothing = 0.0);
// The same loss composed from log_softmax, gather and masks: the reference the fused kernel is tested
// against.
Tensor cross_entropy_composite(const Tensor& logits, const Tensor& target,
                               Reduction reduction = Reduction::Mean, int64_t ignore_index = -100,
                               double label_smoothing = 0.0);
// The fused op itself: per-row losses [N] of logits [N, C] (f32 for f16/bf16 logits), 0 at ignored rows.
Tensor cross_entropy_rows(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                          double label_smoothing = 0.0);

// Negative log-likelihood of log-probabilities [N, C] (or [N, C, d...]) at class indices: -input[n,
// target[n]].
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, Reduction reduction = Reduction::Mean,
                int64_t ignore_index = -100);
// (input - target)^2 and |input - target|; shapes must match.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
// KL divergence with input as log-probabilities: target * (log target - input) (0 where target is 0), or
// exp(target) * (target - input) when log_target. BatchMean divides the sum by input.size(0), which is the
// true KL divergence per sample; Mean divides by the element count, as PyTorch does.
Tensor kl_div(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean,
              bool log_target = false);
// Knowledge distillation (Hinton, Vinyals and Dean, 2015): a student imitates a teacher's softened
// distribution as well as the labels,
//   alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * cross_entropy(student, y),
// with the KL divergence per sample (batchmean) and the cross-entropy's mean. T^2 keeps the soft term's
// gradient at the hard term's scale whatever T is. Logits [N, C], targets i64 [N]; the teacher's logits
// are detached (the teacher is not trained); temperature > 0, alpha in [0, 1]. No defaults: the best pair
// depends on the teacher and the student (examples/distill measures some).
Tensor distillation_loss(const Tensor& student_logits, const Tensor& teacher_logits, const Tensor& targets,
                         double temperature, double alpha);
// Binary cross-entropy on logits, in the stable form
//   (1 - t) x + (1 + (pos_weight - 1) t) (log(1 + exp(-|x|)) + max(-x, 0));
// pos_weight (optional) broadcasts against the last dim (one weight per class).
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        Reduction reduction = Reduction::Mean, const Tensor& pos_weight = {});

}  // namespace frugal::nn::functional
