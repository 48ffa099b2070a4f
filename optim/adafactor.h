// optim::Adafactor, as torch.optim.Adafactor (foreach=False) computes it: Adam-like steps whose second moment
// of a matrix is kept factored, one number per row and one per column (O(m + n) floats, not O(m n)), with a
// step size relative to the parameter's own RMS and no first moment. Per step t of a parameter P:
//   G = grad (-grad with maximize)
//   beta2_t = 1 - t^beta2_decay;   rho = min(lr, 1 / sqrt(t));   alpha = max(eps2, RMS(P)) * rho
//   P *= 1 - lr * weight_decay                                        (decoupled, scaled by lr)
//   P of rank >= 2, [..., m, n] (leading dims are a batch of matrices):
//     row_var = lerp(row_var, mean over n of G², 1 - beta2_t)          [..., m, 1]
//     col_var = lerp(col_var, mean over m of G², 1 - beta2_t)          [..., 1, n]
//     V = row_var col_var / max(mean over m of row_var, eps1)         (each element; never stored)
//   P of rank < 2: variance = lerp(variance, G², 1 - beta2_t);  V = variance
//   U = G / sqrt(max(V, eps1²));   P -= alpha / max(1, RMS(U) / d) * U
// eps1 unset means the machine epsilon of the dtype the update runs in (f32 for master weights).
//
//   optim::Adafactor opt(model->parameters(), optim::AdafactorOptions());  // lr 1e-2 is rho's ceiling
//   optim::Adafactor opt2(params, optim::AdafactorOptions(1e-2).weight_decay(0.01).eps1(1e-30));
//   opt.zero_grad(); loss.backward(); opt.step();
//
// The update is a plain loop on the CPU that allocates nothing (Note [a failed step changes nothing],
// optim/optimizer.h): it walks the parameter three times (RMS(P); the variances and RMS(U); the update), as
// torch needs RMS(U) before it can apply U, and recomputes U rather than keeping it.
#pragma once

#include <optional>

#include "optimizer.h"

namespace frugal::optim {

class AdafactorOptions : public OptimizerOptions {
 public:
  explicit AdafactorOptions(double lr = 1e-2) : lr_(lr) {}
  // The ceiling of the relative step size rho (and the scale of weight decay), not a step size itself.
  FRUGAL_ARG(double, lr) = 1e-2;
  FRUGAL_ARG(double, beta2_decay) = -0.8;
  // torch's eps = (eps1, eps2): eps1 floors the variance estimate (unset: the dtype's machine epsilon),
  // eps2 floors RMS(P) in the step size.
  FRUGAL_ARG(std::optional<double>, eps1) = std::nullopt;
  FRUGAL_ARG(double, eps2) = 1e-3;
  // The clipping threshold of RMS(U).
  FRUGAL_ARG(double, d) = 1.0;
  FRUGAL_ARG(double, weight_decay) = 0;
  FRUGAL_ARG(bool, maximize) = false;
  // f32 copies of f16/bf16 parameters (Note [master weights], optim/optimizer.h).
  FRUGAL_ARG(bool, master_weights) = false;

 public:
  std::unique_ptr<OptimizerOptions> clone() const override {
    return std::make_unique<AdafactorOptions>(*this);
  }
  double get_lr() const override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }
  bool get_master_weights() const override { return master_weights_; }
  std::vector<HyperParam> hyperparams() override;
  void validate() const override;
};

class Adafactor : public Optimizer {
 public:
  Adafactor(std::vector<Tensor> params, const AdafactorOptions& options = AdafactorOptions());
  Adafactor(std::vector<ParamGroup> groups, const AdafactorOptions& defaults);

 protected:
  void update(const OptimizerOptions& options, Tensor& param, const Tensor& grad, ParamState& state) override;
  // "row_var" and "col_var" for a parameter of rank >= 2 (torch's keepdim shapes [..., m, 1], [..., 1, n]),
  // "variance" (the parameter's shape) otherwise.
  std::vector<std::string> state_names(const OptimizerOptions& options, const Tensor& param) const override;
  Shape state_shape(const OptimizerOptions& options, const std::string& name,
                    const Tensor& param) const override;
  void check_param(const Tensor& param, int64_t index) const override;
};

}  // namespace frugal::optim
