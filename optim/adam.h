// optim::Adam and optim::AdamW, as torch.optim.Adam / AdamW (non-fused) compute them; per step t:
//   Adam:  g = grad + weight_decay * param          AdamW: param *= 1 - lr * weight_decay
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   v_max = max(v_max, v)                           (amsgrad; then used in place of v)
//   param -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// (the CPU kernel multiplies sqrt(v) by 1 / sqrt(1 - beta2^t): the update's last bit may differ from
// PyTorch's; kernels/cpu/optim.cpp)
//
//   optim::Adam opt(model->parameters(), optim::AdamOptions(1e-3).betas({0.9, 0.98}));
//   optim::AdamW opt_w(model->parameters(), optim::AdamWOptions(1e-3).weight_decay(0.1));
//   opt.zero_grad(); loss.backward(); opt.step();
#pragma once

#include <utility>

#include "optimizer.h"

namespace frugal::optim {

using Betas = std::pair<double, double>;  // (beta1, beta2)

// The options of Adam and AdamW (they differ in how weight decay applies and in its default).
template <typename Self>
class AdamOptionsBase : public OptimizerOptions {
 public:
  std::unique_ptr<OptimizerOptions> clone() const override {
    return std::make_unique<Self>(static_cast<const Self&>(*this));
  }
  double get_lr() const override { return static_cast<const Self&>(*this).lr(); }
  void set_lr(double lr) override { static_cast<Self&>(*this).lr(lr); }
  bool get_master_weights() const override { return static_cast<const Self&>(*this).master_weights(); }
};

class AdamOptions : public AdamOptionsBase<AdamOptions> {
 public:
  explicit AdamOptions(double lr = 1e-3) : lr_(lr) {}
  FRUGAL_ARG(double, lr) = 1e-3;
  FRUGAL_ARG(Betas, betas) = std::make_pair(0.9, 0.999);
  FRUGAL_ARG(double, eps) = 1e-8;
  FRUGAL_ARG(double, weight_decay) = 0;
  FRUGAL_ARG(bool, amsgrad) = false;
  // f32 copies of f16/bf16 parameters (Note [master weights], optim/optimizer.h).
  FRUGAL_ARG(bool, master_weights) = false;

 public:
  std::vector<HyperParam> hyperparams() override;
  void validate() const override;
};

class AdamWOptions : public AdamOptionsBase<AdamWOptions> {
 public:
  explicit AdamWOptions(double lr = 1e-3) : lr_(lr) {}
  FRUGAL_ARG(double, lr) = 1e-3;
  FRUGAL_ARG(Betas, betas) = std::make_pair(0.9, 0.999);
  FRUGAL_ARG(double, eps) = 1e-8;
  FRUGAL_ARG(double, weight_decay) = 1e-2;
  FRUGAL_ARG(bool, amsgrad) = false;
  // f32 copies of f16/bf16 parameters (Note [master weights], optim/optimizer.h).
  FRUGAL_ARG(bool, master_weights) = false;

 public:
  std::vector<HyperParam> hyperparams() override;
  void validate() const override;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, const AdamOptions& options);
  Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults);

 protected:
  void update(const OptimizerOptions& options, Tensor& param, const Tensor& grad, ParamState& state) override;
  std::vector<std::string> state_names(const OptimizerOptions& options, const Tensor& param) const override;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options);
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& defaults);

 protected:
  void update(const OptimizerOptions& options, Tensor& param, const Tensor& grad, ParamState& state) override;
  std::vector<std::string> state_names(const OptimizerOptions& options, const Tensor& param) const override;
};

}  // namespace frugal::optim
