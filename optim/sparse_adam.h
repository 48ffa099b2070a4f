// optim::SparseAdam, as torch.optim.SparseAdam computes it: a lazy Adam for parameters with row-wise sparse
// gradients (nn::Embedding with sparse(true); Note [sparse gradients], autograd/sparse.h). Only the rows in
// the gradient move: their exp_avg, exp_avg_sq and values. Per step t of the parameter (t counts the steps at
// which it had a gradient), for each element of those rows:
//   m += (1 - beta1) * (g - m)
//   v += (1 - beta2) * (g * g - v)
//   param -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps)
// It refuses dense gradients (use Adam for the rest of the model); Adam, AdamW and SGD refuse sparse ones.
//
//   nn::Embedding emb(nn::EmbeddingOptions(50000, 256).sparse(true));
//   optim::SparseAdam sparse_opt(emb->parameters(), optim::SparseAdamOptions(1e-3).betas({0.9, 0.999}));
//   optim::Adam dense_opt(head->parameters(), optim::AdamOptions(1e-3));
//   sparse_opt.zero_grad(); dense_opt.zero_grad(); loss.backward(); sparse_opt.step(); dense_opt.step();
#pragma once

#include "adam.h"

namespace frugal::optim {

class SparseAdamOptions : public AdamOptionsBase<SparseAdamOptions> {
 public:
  explicit SparseAdamOptions(double lr = 1e-3) : lr_(lr) {}
  FRUGAL_ARG(double, lr) = 1e-3;
  FRUGAL_ARG(Betas, betas) = std::make_pair(0.9, 0.999);
  FRUGAL_ARG(double, eps) = 1e-8;
  // f32 copies of f16/bf16 parameters (Note [master weights], optim/optimizer.h).
  FRUGAL_ARG(bool, master_weights) = false;

 public:
  std::vector<HyperParam> hyperparams() override;
  void validate() const override;
};

class SparseAdam : public Optimizer {
 public:
  SparseAdam(std::vector<Tensor> params, const SparseAdamOptions& options);
  SparseAdam(std::vector<ParamGroup> groups, const SparseAdamOptions& defaults);

 protected:
  bool takes_sparse_grads() const override { return true; }
  void update(const OptimizerOptions& options, Tensor& param, const Tensor& grad, ParamState& state) override;
  void update_sparse(const OptimizerOptions& options, Tensor& param, const SparseGrad& grad,
                     ParamState& state) override;
  std::vector<std::string> state_names(const OptimizerOptions& options, const Tensor& param) const override;
};

}  // namespace frugal::optim
