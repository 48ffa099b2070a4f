// nn::functional layers (linear, dropout, layer_norm, batch_norm, embedding): composites of differentiable
// ops, so their gradients come from autograd/ and recompute segments replay them, except where a fused op
// runs: linear, layer_norm, batch_norm and the sparse embedding (autograd/grad_linear.cpp, grad_norm.cpp,
// grad_batch_norm.cpp, sparse.cpp hold their rules); linear and layer_norm keep their composites as
// linear_composite and layer_norm_composite. Losses are in nn/functional_losses.cpp.
#include "nn/functional.h"

#include "amp/autocast.h"
#include "autograd/nn_ops.h"
#include "core/batch_norm.h"
#include "core/op_table_linalg.h"

namespace frugal::nn::functional {

namespace {
// f16/bf16 normalisation computes in f32 (PyTorch does the same); other dtypes as they are.
Tensor in_compute_dtype(const Tensor& x) { return x.to(compute_dtype(x.dtype())); }
}  // namespace

namespace {

// Where the fused GEMM ops apply: x, the weight and the bias (if any) in one floating dtype (no promotion) on
// one device, which has a GEMM kernel for it.
// (An x of dtype t on device d, in the second form.)
bool gemm_fusable(DType t, Device d, const Tensor& weight, const Tensor& bias) {
  return t == weight.dtype() && (!bias.defined() || bias.dtype() == t) && is_floating(t) &&
         weight.device() == d && (!bias.defined() || bias.device() == d) && op_gemm.has(d, t);
}
bool gemm_fusable(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return gemm_fusable(x.dtype(), x.device(), weight, bias);
}

// The fused ops take x [M, in]: leading dims are folded into one so that one GEMM runs forward and one per
// operand backward, and y [M, out] gets them back. M is the leading dims' product, not -1: with no input
// features, -1 could be any number, and reshape refuses it.
Tensor fold_rows(const Tensor& x) {
  if (x.dim() == 2) return x;
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  return x.reshape({rows, x.size(-1)});
}
Tensor unfold_rows(const Tensor& y, const Tensor& x) {
  if (x.dim() == 2) return y;
  Shape s = x.shape();
  s[s.size() - 1] = y.size(-1);
  return y.reshape(s);
}

// What runs around the GEMM: nothing, a ReLU after it, or a GELU (exact or tanh) before it.
enum class Around { kNone, kRelu, kGeluBefore, kGeluTanhBefore };

// linear, linear then ReLU, or GELU then linear: checks, autocast and leading dims shared.
Tensor linear_impl(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, Around around) {
  FRUGAL_CHECK(x_in.defined() && weight_in.defined(), "linear: the input or the weight is undefined");
  // Under autocast, all three in its dtype, cast before the weight is transposed so that the weight's cast is
  // the cached one (Note [autocast policy], amp/autocast.h).
  const auto in = amp::autocast("linear", x_in, weight_in, bias_in);
  const Tensor &x = in[0], &weight = in[1], &bias = in[2];
  FRUGAL_CHECK_SHAPE(weight.dim() == 2, "linear: the weight must be 2-D [out, in], got shape ",
                     weight.shape());
  FRUGAL_CHECK_SHAPE(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input shape ", x.shape(),
                     " does not fit weight shape ", weight.shape(), "; the input's last dim must be ",
                     weight.size(1));
  FRUGAL_CHECK_SHAPE(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
                     "linear: the bias must have shape [", weight.size(0), "], got ",
                     bias.defined() ? bias.shape() : Shape{});
  const Tensor x2 = fold_rows(x);
  const bool fused = gemm_fusable(x, weight, bias);
  Tensor y;
  const bool tanh = around == Around::kGeluTanhBefore;
  switch (around) {
    case Around::kNone:
      y = fused ? frugal::linear(x2, weight, bias) : linear_composite(x2, weight, bias);
      break;
    case Around::kRelu:
      y = fused ? frugal::linear_relu(x2, weight, bias) : relu(linear_composite(x2, weight, bias));
      break;
    case Around::kGeluBefore:
    case Around::kGeluTanhBefore:
      y = fused ? frugal::gelu_linear(x2, weight, bias, tanh)
                : linear_composite(tanh ? gelu_tanh(x2) : gelu(x2), weight, bias);
      break;
  }
  return unfold_rows(y, x);
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_impl(x, weight, bias, Around::kNone);
}

Tensor linear_relu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_impl(x, weight, bias, Around::kRelu);
}

Tensor gelu_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const std::string& approximate) {
  FRUGAL_CHECK(approximate == "none" || approximate == "tanh",
               "gelu_linear: approximate must be \"none\" or \"tanh\", got \"", approximate, "\"");
  return linear_impl(x, weight, bias, approximate == "tanh" ? Around::kGeluTanhBefore : Around::kGeluBefore);
}

Tensor linear_composite(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  Tensor y = matmul(x, weight.t());
  return bias.defined() ? add(y, bias) : y;
}

Tensor dropout(const Tensor& x, double p, bool training) {
  FRUGAL_CHECK(x.defined(), "dropout: the input is undefined");
  FRUGAL_CHECK(p >= 0 && p <= 1, "dropout: p must be in [0, 1], got ", p);
  FRUGAL_CHECK_DTYPE(is_floating(x.dtype()), "dropout: expected a floating input, got ",
                     dtype_name(x.dtype()), " (shape ", x.shape(), ")");
  if (!training || p == 0) return x;
  if (p == 1) return mul(x, 0.0);
  // Note [recompute and RNG]: the mask comes from the default generator, whose state a recompute segment
  // saves and restores, so the segment's second run draws the same mask.
  const Tensor u = rand(x.shape(), x.dtype() == DType::F64 ? DType::F64 : DType::F32);
  return where(ge(u, p), mul(x, 1.0 / (1.0 - p)), scalar_tensor(0, x.dtype()));
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  return frugal::layer_norm(x, normalized_shape, weight, bias, eps);
}

Tensor layer_norm_linear(const Tensor& x_in, const Shape& normalized_shape, const Tensor& ln_weight_in,
                         const Tensor& ln_bias_in, double eps, const Tensor& weight_in,
                         const Tensor& bias_in) {
  // One op where it applies: over the last dim, everything well formed and gemm_fusable, the norm's
  // parameters in x's dtype on its device; under autocast (dtype L) the norm's inputs in f32 and the
  // Linear's in L, as the two layers would cast them, and the op in its rounded form (Note [layer norm
  // before a Linear under autocast], autograd/grad_linear.cpp) where the device has its kernels. Otherwise
  // the two layers, with their own checks and errors.
  const auto norm = amp::autocast("layer_norm", x_in, ln_weight_in, ln_bias_in);
  const auto lin = amp::autocast("linear", weight_in, bias_in);
  const Tensor &x = norm[0], &ln_weight = norm[1], &ln_bias = norm[2], &weight = lin[0], &bias = lin[1];
  auto norm_param = [&](const Tensor& p) {
    return !p.defined() ||
           (p.dtype() == x.dtype() && p.device() == x.device() && p.shape() == normalized_shape);
  };
  std::optional<DType> rounded;
  if (amp::is_autocast_enabled()) rounded = amp::autocast_dtype();
  const bool fused =
      x.defined() && weight.defined() && x.dim() >= 1 && normalized_shape == Shape{x.size(-1)} &&
      norm_param(ln_weight) && norm_param(ln_bias) && weight.dim() == 2 && weight.size(1) == x.size(-1) &&
      (!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0))) &&
      (rounded ? x.dtype() == DType::F32 && ops::has_layer_norm_rounded(x.device(), x.dtype()) &&
                     gemm_fusable(*rounded, x.device(), weight, bias)
               : gemm_fusable(x, weight, bias));
  if (!fused)
    return functional::linear(functional::layer_norm(x, normalized_shape, ln_weight, ln_bias, eps), weight,
                              bias);
  return unfold_rows(frugal::layer_norm_linear(fold_rows(x), ln_weight, ln_bias, eps, weight, bias, rounded),
                     x);
}

Tensor layer_norm_composite(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight_in,
                            const Tensor& bias_in, double eps) {
  FRUGAL_CHECK(x_in.defined(), "layer_norm: the input is undefined");
  // In f32 under autocast, so it returns f32 (Note [autocast policy], amp/autocast.h).
  const auto in = amp::autocast("layer_norm", x_in, weight_in, bias_in);
  const Tensor &x = in[0], &weight = in[1], &bias = in[2];
  FRUGAL_CHECK_DTYPE(is_floating(x.dtype()), "layer_norm: expected a floating input, got ",
                     dtype_name(x.dtype()), " (shape ", x.shape(), ")");
  const int k = normalized_shape.size();
  bool fits = k >= 1 && x.dim() >= k;
  for (int i = 0; fits && i < k; ++i) fits = x.shape()[x.dim() - k + i] == normalized_shape[i];
  FRUGAL_CHECK_SHAPE(fits, "layer_norm: input shape ", x.shape(), " does not end with normalized_shape ",
                     normalized_shape);
  FRUGAL_CHECK_SHAPE(!weight.defined() || weight.shape() == normalized_shape, "layer_norm: weight shape ",
                     weight.defined() ? weight.shape() : Shape{}, " must equal normalized_shape ",
                     normalized_shape);
  FRUGAL_CHECK_SHAPE(!bias.defined() || bias.shape() == normalized_shape, "layer_norm: bias shape ",
                     bias.defined() ? bias.shape() : Shape{}, " must equal normalized_shape ",
                     normalized_shape);
  Shape dims;
  for (int i = 0; i < k; ++i) dims.push_back(x.dim() - k + i);
  const Tensor xf = in_compute_dtype(x);
  const Tensor mu = mean(xf, dims, true);
  const Tensor v = var(xf, dims, 0, true);
  Tensor y = mul(sub(xf, mu), rsqrt(add(v, eps)));
  if (weight.defined()) y = mul(y, weight);
  if (bias.defined()) y = add(y, bias);
  return y.to(x.dtype());
}

Tensor batch_norm(const Tensor& x_in, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight_in, const Tensor& bias_in, bool training, double momentum,
                  double eps) {
  FRUGAL_CHECK(x_in.defined(), "batch_norm: the input is undefined");
  // In f32 under autocast, so it returns f32 (Note [autocast policy], amp/autocast.h).
  const auto in = amp::autocast("batch_norm", x_in, weight_in, bias_in);
  const Tensor &x = in[0], &weight = in[1], &bias = in[2];
  FRUGAL_CHECK_DTYPE(is_floating(x.dtype()), "batch_norm: expected a floating input, got ",
                     dtype_name(x.dtype()), " (shape ", x.shape(), ")");
  FRUGAL_CHECK_SHAPE(x.dim() >= 2,
                     "batch_norm: expected an input [N, C, ...] with at least 2 dims, got shape ", x.shape());
  const int64_t c = x.size(1);
  auto check_param = [&](const Tensor& t, const char* name) {
    FRUGAL_CHECK_SHAPE(!t.defined() || t.shape() == Shape{c}, "batch_norm: ", name, " must have shape [", c,
                       "] for input shape ", x.shape(), ", got ", t.defined() ? t.shape() : Shape{});
  };
  check_param(running_mean, "running_mean");
  check_param(running_var, "running_var");
  check_param(weight, "weight");
  check_param(bias, "bias");
  FRUGAL_CHECK(training || (running_mean.defined() && running_var.defined()),
               "batch_norm: without training, running_mean and running_var must be defined");
  const int64_t n = x.numel() / std::max<int64_t>(c, 1);
  if (training)
    FRUGAL_CHECK_SHAPE(n > 1,
                       "batch_norm: expected more than 1 value per channel when training, got input shape ",
                       x.shape());
  if (op_batch_norm.has(x.device(), compute_dtype(x.dtype())))
    return autograd::batch_norm_fused(x, running_mean, running_var, weight, bias, training, momentum, eps, n);
  // The composite, on devices without the fused kernels.
  Shape dims{0}, bshape = Shape::filled(x.dim(), 1);
  for (int d = 2; d < x.dim(); ++d) dims.push_back(d);
  bshape[1] = c;
  const Tensor xf = in_compute_dtype(x);
  Tensor mu, v;
  if (training) {
    mu = mean(xf, dims, true);
    v = var(xf, dims, 0, true);
    if (running_mean.defined()) {
      NoGradGuard no_grad;
      Tensor rm = running_mean, rv = running_var;
      ops::mul_(rm, 1 - momentum);
      ops::add_(rm, ops::mul(mu.detach().reshape({c}), momentum));
      ops::mul_(rv, 1 - momentum);
      ops::add_(rv, ops::mul(v.detach().reshape({c}), momentum * double(n) / double(n - 1)));
    }
  } else {
    mu = running_mean.reshape(bshape).to(xf.dtype());
    v = running_var.reshape(bshape).to(xf.dtype());
  }
  Tensor y = mul(sub(xf, mu), rsqrt(add(v, eps)));
  if (weight.defined()) y = mul(y, weight.reshape(bshape));
  if (bias.defined()) y = add(y, bias.reshape(bshape));
  return y.to(x.dtype());
}

Tensor embedding(const Tensor& input, const Tensor& weight, std::optional<int64_t> padding_idx, bool sparse) {
  FRUGAL_CHECK(input.defined() && weight.defined(), "embedding: the input or the weight is undefined");
  FRUGAL_CHECK_SHAPE(weight.dim() == 2, "embedding: the weight must be 2-D [num_embeddings, dim], got shape ",
                     weight.shape());
  FRUGAL_CHECK_DTYPE(input.dtype() == DType::I64 || input.dtype() == DType::I32,
                     "embedding: the indices must be i64 or i32, got ", dtype_name(input.dtype()), " (shape ",
                     input.shape(), ")");
  const int64_t num = weight.size(0);
  const Tensor flat = input.reshape({-1});
  if (flat.numel() > 0) {
    const auto [lo, hi] = ops::integer_range(flat);  // one wait on a GPU
    FRUGAL_CHECK_INDEX(lo >= 0 && hi < num, "embedding: index ", lo < 0 ? lo : hi, " is out of range for ",
                       num, " embeddings (weight shape ", weight.shape(), "); valid indices are [0, ",
                       num - 1, "]");
  }
  Shape out_shape = input.shape();
  out_shape.push_back(weight.size(1));
  const int64_t pad = padding_idx ? (*padding_idx < 0 ? *padding_idx + num : *padding_idx) : -1;
  if (padding_idx)
    FRUGAL_CHECK_INDEX(pad >= 0 && pad < num, "embedding: padding_idx ", *padding_idx,
                       " is out of range for ", num, " embeddings");
  if (sparse)
    return autograd::embedding_sparse(flat.to(DType::I64).contiguous(), weight, pad).reshape(out_shape);
  Tensor y = index_select(weight, 0, flat);
  if (padding_idx) {
    // The padding row's value passes through, its gradient does not.
    const Tensor is_pad = ops::eq(flat, double(pad)).unsqueeze(1);
    y = where(is_pad, y.detach(), y);
  }
  return y.reshape(out_shape);
}

}  // namespace frugal::nn::functional
