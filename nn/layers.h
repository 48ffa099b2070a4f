// nn layers in the style of PyTorch's C++ frontend: each a Module (XImpl) that registers its parameters
// (with PyTorch's default initialisation) and buffers, configured by an options struct, and runs
// nn::functional; X is its holder (nn/module_holder.h), a shared handle.
//
//   nn::Linear fc(nn::LinearOptions(784, 256).bias(false));  // fc->weight [256, 784]
//   nn::LayerNorm ln(nn::LayerNormOptions({128}).eps(1e-6));
//   nn::BatchNorm2d bn(32);
//   Tensor y = nn::GELU(nn::GELUOptions().approximate("tanh"))(ln(fc(x)));
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "../core/options.h"
#include "functional.h"
#include "module.h"
#include "module_holder.h"

namespace frugal::nn {

struct LinearOptions {
  LinearOptions(int64_t in_features, int64_t out_features)
      : in_features_(in_features), out_features_(out_features) {}
  FRUGAL_ARG(int64_t, in_features);
  FRUGAL_ARG(int64_t, out_features);
  FRUGAL_ARG(bool, bias) = true;
};

// y = x W^T + b; weight [out, in] and bias [out] drawn from U(-1/sqrt(in), 1/sqrt(in)) (PyTorch's
// kaiming_uniform_ with a = sqrt(5)).
class LinearImpl : public Module {
 public:
  LinearImpl(int64_t in_features, int64_t out_features)
      : LinearImpl(LinearOptions(in_features, out_features)) {}
  explicit LinearImpl(const LinearOptions& options);
  Tensor forward(const Tensor& x) override;
  void reset_parameters();
  LinearOptions options;
  Tensor weight, bias;  // bias undefined without bias(true)
};
FRUGAL_MODULE(Linear);

struct EmbeddingOptions {
  EmbeddingOptions(int64_t num_embeddings, int64_t embedding_dim)
      : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {}
  FRUGAL_ARG(int64_t, num_embeddings);
  FRUGAL_ARG(int64_t, embedding_dim);
  FRUGAL_ARG(std::optional<int64_t>, padding_idx);
  // The weight's gradient row-wise sparse (autograd::sparse_grad(weight)), for optim::SparseAdam.
  FRUGAL_ARG(bool, sparse) = false;
};

// A lookup table: integer indices of any shape -> their rows of weight [num, dim], drawn from N(0, 1) (the
// padding row, if any, zero and never trained). The gradient is dense, or with sparse(true) only the rows a
// batch used (Note [sparse gradients], autograd/sparse.h).
class EmbeddingImpl : public Module {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim)
      : EmbeddingImpl(EmbeddingOptions(num_embeddings, embedding_dim)) {}
  explicit EmbeddingImpl(const EmbeddingOptions& options);
  Tensor forward(const Tensor& indices) override;
  void reset_parameters();
  EmbeddingOptions options;
  Tensor weight;
};
FRUGAL_MODULE(Embedding);

struct DropoutOptions {
  DropoutOptions(double p = 0.5) : p_(p) {}  // NOLINT: implicit, as in libtorch (Dropout(0.2))
  FRUGAL_ARG(double, p);
};

// Zeroes elements with probability p and scales the rest by 1 / (1 - p) in training; the identity in eval.
class DropoutImpl : public Module {
 public:
  explicit DropoutImpl(const DropoutOptions& options = {});
  Tensor forward(const Tensor& x) override;
  DropoutOptions options;
};
FRUGAL_MODULE(Dropout);

struct FlattenOptions {
  FRUGAL_ARG(int64_t, start_dim) = 1;
  FRUGAL_ARG(int64_t, end_dim) = -1;
};

// Merges dims start_dim..end_dim into one (a view when possible).
class FlattenImpl : public Module {
 public:
  explicit FlattenImpl(const FlattenOptions& options = {});
  Tensor forward(const Tensor& x) override;
  FlattenOptions options;
};
FRUGAL_MODULE(Flatten);

struct LayerNormOptions {
  explicit LayerNormOptions(Shape normalized_shape) : normalized_shape_(normalized_shape) {}
  FRUGAL_ARG(Shape, normalized_shape);
  FRUGAL_ARG(double, eps) = 1e-5;
  FRUGAL_ARG(bool, elementwise_affine) = true;
};

// Normalises over the trailing normalized_shape dims; weight 1 and bias 0 when elementwise_affine.
class LayerNormImpl : public Module {
 public:
  explicit LayerNormImpl(Shape normalized_shape) : LayerNormImpl(LayerNormOptions(normalized_shape)) {}
  explicit LayerNormImpl(const LayerNormOptions& options);
  Tensor forward(const Tensor& x) override;
  void reset_parameters();
  LayerNormOptions options;
  Tensor weight, bias;
};
FRUGAL_MODULE(LayerNorm);

struct BatchNorm2dOptions {
  BatchNorm2dOptions(int64_t num_features) : num_features_(num_features) {}  // NOLINT: implicit by design
  FRUGAL_ARG(int64_t, num_features);
  FRUGAL_ARG(double, eps) = 1e-5;
  // nullopt: running statistics are the cumulative average over all batches seen.
  FRUGAL_ARG(std::optional<double>, momentum) = 0.1;
  FRUGAL_ARG(bool, affine) = true;
  FRUGAL_ARG(bool, track_running_stats) = true;
};

// Batch norm over [N, C, H, W] per channel. Training: statistics of the batch (over N, H, W), and the running
// ones updated (unbiased variance) with num_batches_tracked counting the steps; eval: the running statistics.
// Inside a recompute segment the update runs again when the segment is recomputed (as in PyTorch).
class BatchNorm2dImpl : public Module {
 public:
  explicit BatchNorm2dImpl(const BatchNorm2dOptions& options);
  Tensor forward(const Tensor& x) override;
  void reset_parameters();
  void reset_running_stats();
  BatchNorm2dOptions options;
  Tensor weight, bias;                                    // undefined without affine
  Tensor running_mean, running_var, num_batches_tracked;  // undefined without track_running_stats
};
FRUGAL_MODULE(BatchNorm2d);

// Activations.
class ReLUImpl : public Module {
 public:
  ReLUImpl() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override { return relu(x); }
};
FRUGAL_MODULE(ReLU);

struct GELUOptions {
  FRUGAL_ARG(std::string, approximate) = "none";  // "none" (the erf form) or "tanh"
};
class GELUImpl : public Module {
 public:
  explicit GELUImpl(const GELUOptions& options = {});
  Tensor forward(const Tensor& x) override;
  GELUOptions options;
};
FRUGAL_MODULE(GELU);

class SiLUImpl : public Module {
 public:
  SiLUImpl() : Module("SiLU") {}
  Tensor forward(const Tensor& x) override { return silu(x); }
};
FRUGAL_MODULE(SiLU);

class TanhImpl : public Module {
 public:
  TanhImpl() : Module("Tanh") {}
  Tensor forward(const Tensor& x) override { return tanh(x); }
};
FRUGAL_MODULE(Tanh);

class SigmoidImpl : public Module {
 public:
  SigmoidImpl() : Module("Sigmoid") {}
  Tensor forward(const Tensor& x) override { return sigmoid(x); }
};
FRUGAL_MODULE(Sigmoid);

}  // namespace frugal::nn
