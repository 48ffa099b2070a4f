// optim::SGD: stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay, as
// torch.optim.SGD computes it:
//   d = grad + weight_decay * param
//   buf = d on the first step, else momentum * buf + (1 - dampening) * d
//   d = nesterov ? d + momentum * buf : buf        (when momentum != 0)
//   param -= lr * d
//
//   optim::SGD opt(model->parameters(), optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
//   opt.zero_grad(); loss.backward(); opt.step();
#pragma once

#include "optimizer.h"

namespace frugal::optim {

class SGDOptions : public OptimizerOptions {
 public:
  explicit SGDOptions(double lr) : lr_(lr) {}
  FRUGAL_ARG(double, lr) = 0;
  FRUGAL_ARG(double, momentum) = 0;
  FRUGAL_ARG(double, dampening) = 0;
  FRUGAL_ARG(bool, nesterov) = false;
  FRUGAL_ARG(double, weight_decay) = 0;
  // f32 copies of f16/bf16 parameters (Note [master weights], optim/optimizer.h).
  FRUGAL_ARG(bool, master_weights) = false;

 public:
  std::unique_ptr<OptimizerOptions> clone() const override { return std::make_unique<SGDOptions>(*this); }
  bool get_master_weights() const override { return master_weights_; }
  double get_lr() const override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }
  std::vector<HyperParam> hyperparams() override;
  void validate() const override;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SGDOptions& options);
  SGD(std::vector<ParamGroup> groups, const SGDOptions& defaults);

 protected:
  void update(const OptimizerOptions& options, Tensor& param, const Tensor& grad, ParamState& state) override;
  std::vector<std::string> state_names(const OptimizerOptions& options, const Tensor& param) const override;
};

}  // namespace frugal::optim
