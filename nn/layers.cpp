// nn layers: construction (parameters, buffers, PyTorch's default initialisation) and forward through
// nn::functional.
#include "nn/layers.h"

#include <cmath>

#include "core/estimate.h"
#include "nn/init.h"

namespace frugal::nn {

namespace F = functional;

LinearImpl::LinearImpl(const LinearOptions& opts) : Module("Linear"), options(opts) {
  FRUGAL_CHECK(opts.in_features() > 0 && opts.out_features() > 0,
               "Linear: in_features and out_features must be positive, got ", opts.in_features(), " and ",
               opts.out_features());
  weight = register_parameter("weight", empty({opts.out_features(), opts.in_features()}));
  if (opts.bias()) bias = register_parameter("bias", empty({opts.out_features()}));
  reset_parameters();
}

void LinearImpl::reset_parameters() {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const double bound = 1.0 / std::sqrt(double(options.in_features()));
    init::uniform_(bias, -bound, bound);
  }
}

Tensor LinearImpl::forward(const Tensor& x) {
  apply_masks();
  return F::linear(x, weight, bias);
}

EmbeddingImpl::EmbeddingImpl(const EmbeddingOptions& opts) : Module("Embedding"), options(opts) {
  FRUGAL_CHECK(opts.num_embeddings() > 0 && opts.embedding_dim() > 0,
               "Embedding: num_embeddings and embedding_dim must be positive, got ", opts.num_embeddings(),
               " and ", opts.embedding_dim());
  if (opts.padding_idx()) {
    const int64_t p = *opts.padding_idx(), n = opts.num_embeddings();
    FRUGAL_CHECK_INDEX(p >= -n && p < n, "Embedding: padding_idx ", p, " is out of range for ", n,
                       " embeddings");
    options.padding_idx(p < 0 ? p + n : p);
  }
  weight = register_parameter("weight", empty({opts.num_embeddings(), opts.embedding_dim()}));
  reset_parameters();
}

void EmbeddingImpl::reset_parameters() {
  init::normal_(weight);
  if (options.padding_idx()) {
    NoGradGuard no_grad;
    weight.select(0, *options.padding_idx()).fill_(0);
  }
}

Tensor EmbeddingImpl::forward(const Tensor& indices) {
  return F::embedding(indices, weight, options.padding_idx(), options.sparse());
}

DropoutImpl::DropoutImpl(const DropoutOptions& opts) : Module("Dropout"), options(opts) {
  FRUGAL_CHECK(opts.p() >= 0 && opts.p() <= 1, "Dropout: p must be in [0, 1], got ", opts.p());
}

Tensor DropoutImpl::forward(const Tensor& x) { return F::dropout(x, options.p(), is_training()); }

FlattenImpl::FlattenImpl(const FlattenOptions& opts) : Module("Flatten"), options(opts) {}

Tensor FlattenImpl::forward(const Tensor& x) { return x.flatten(options.start_dim(), options.end_dim()); }

LayerNormImpl::LayerNormImpl(const LayerNormOptions& opts) : Module("LayerNorm"), options(opts) {
  FRUGAL_CHECK_SHAPE(opts.normalized_shape().size() > 0, "LayerNorm: normalized_shape must not be empty");
  if (opts.elementwise_affine()) {
    weight = register_parameter("weight", empty(opts.normalized_shape()));
    bias = register_parameter("bias", empty(opts.normalized_shape()));
  }
  reset_parameters();
}

void LayerNormImpl::reset_parameters() {
  if (!weight.defined()) return;
  init::ones_(weight);
  init::zeros_(bias);
}

Tensor LayerNormImpl::forward(const Tensor& x) {
  return F::layer_norm(x, options.normalized_shape(), weight, bias, options.eps());
}

BatchNorm2dImpl::BatchNorm2dImpl(const BatchNorm2dOptions& opts) : Module("BatchNorm2d"), options(opts) {
  const int64_t c = opts.num_features();
  FRUGAL_CHECK(c > 0, "BatchNorm2d: num_features must be positive, got ", c);
  if (opts.affine()) {
    weight = register_parameter("weight", empty({c}));
    bias = register_parameter("bias", empty({c}));
  }
  if (opts.track_running_stats()) {
    running_mean = register_buffer("running_mean", zeros({c}));
    running_var = register_buffer("running_var", ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, DType::I64));
  }
  reset_parameters();
}

void BatchNorm2dImpl::reset_running_stats() {
  if (!running_mean.defined()) return;
  init::zeros_(running_mean);
  init::ones_(running_var);
  NoGradGuard no_grad;
  num_batches_tracked.zero_();
}

void BatchNorm2dImpl::reset_parameters() {
  reset_running_stats();
  if (!weight.defined()) return;
  init::ones_(weight);
  init::zeros_(bias);
}

Tensor BatchNorm2dImpl::forward(const Tensor& x) {
  FRUGAL_CHECK(x.defined(), "BatchNorm2d: the input is undefined");
  FRUGAL_CHECK_SHAPE(x.dim() == 4 && x.size(1) == options.num_features(),
                     "BatchNorm2d: expected an input [N, ", options.num_features(), ", H, W], got shape ",
                     x.shape());
  double factor = 0;
  if (is_training() && running_mean.defined()) {
    NoGradGuard no_grad;
    ops::add_(num_batches_tracked, 1.0);
    // A dry run has no batch count to read: 1 (core/estimate.cpp).
    factor = options.momentum() ? *options.momentum()
                                : 1.0 / double(memory::item_or(num_batches_tracked, int64_t(1)));
  }
  // Batch statistics in training, or in eval when there are no running ones (as PyTorch).
  const bool batch_stats = is_training() || !running_mean.defined();
  return F::batch_norm(x, running_mean, running_var, weight, bias, batch_stats, factor, options.eps());
}

GELUImpl::GELUImpl(const GELUOptions& opts) : Module("GELU"), options(opts) {
  FRUGAL_CHECK(opts.approximate() == "none" || opts.approximate() == "tanh",
               "GELU: approximate must be \"none\" or \"tanh\", got \"", opts.approximate(), "\"");
}

Tensor GELUImpl::forward(const Tensor& x) { return options.approximate() == "tanh" ? gelu_tanh(x) : gelu(x); }

}  // namespace frugal::nn
