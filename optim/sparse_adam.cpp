// optim::SparseAdam: option checks, the per-parameter step count and bias corrections, and the row update
// through the fused kernel (op_sparse_adam_step, kernels/cpu/sparse.cpp).
#include "optim/sparse_adam.h"

#include <cmath>

#include "autograd/graph.h"
#include "core/memory_history.h"
#include "core/op_table_sparse.h"

namespace frugal::optim {

std::vector<HyperParam> SparseAdamOptions::hyperparams() {
  return {{"lr", &lr_}, {"beta1", &betas_.first}, {"beta2", &betas_.second}, {"eps", &eps_}};
}

void SparseAdamOptions::validate() const {
  FRUGAL_CHECK(lr_ >= 0, "SparseAdamOptions: invalid learning rate ", lr_, "; it must be >= 0");
  FRUGAL_CHECK(eps_ >= 0, "SparseAdamOptions: invalid eps ", eps_, "; it must be >= 0");
  FRUGAL_CHECK(betas_.first >= 0 && betas_.first < 1, "SparseAdamOptions: invalid beta1 ", betas_.first,
               "; betas must lie in [0, 1)");
  FRUGAL_CHECK(betas_.second >= 0 && betas_.second < 1, "SparseAdamOptions: invalid beta2 ", betas_.second,
               "; betas must lie in [0, 1)");
}

SparseAdam::SparseAdam(std::vector<Tensor> params, const SparseAdamOptions& options)
    : SparseAdam(std::vector<ParamGroup>{ParamGroup(std::move(params))}, options) {}
SparseAdam::SparseAdam(std::vector<ParamGroup> groups, const SparseAdamOptions& defaults)
    : Optimizer("SparseAdam", std::move(groups), defaults.clone()) {}

std::vector<std::string> SparseAdam::state_names(const OptimizerOptions&, const Tensor&) const {
  return {"exp_avg", "exp_avg_sq"};
}

void SparseAdam::update(const OptimizerOptions&, Tensor&, const Tensor&, ParamState&) {
  FRUGAL_ASSERT(false, "SparseAdam::update: step() passes dense gradients to SparseAdam");
}

void SparseAdam::update_sparse(const OptimizerOptions& options, Tensor& param, const SparseGrad& grad,
                               ParamState& state) {
  memory::OpScope op("sparse_adam", param);  // Note [op names in the history]
  const auto& o = static_cast<const SparseAdamOptions&>(options);
  state.initialized = true;
  ++state.step;  // every step the parameter has a gradient, even one with no rows (as PyTorch)
  Tensor& exp_avg = state.tensors["exp_avg"];
  Tensor& exp_avg_sq = state.tensors["exp_avg_sq"];
  if (!exp_avg.defined()) exp_avg = new_state(param);
  if (!exp_avg_sq.defined()) exp_avg_sq = new_state(param);
  const Tensor values = grad.values.contiguous();
  const Tensor indices = grad.indices.contiguous();
  SparseAdamStepArgs a;
  a.param = param.raw_data();
  a.exp_avg = exp_avg.raw_data();
  a.exp_avg_sq = exp_avg_sq.raw_data();
  a.indices = indices.data<int64_t>();
  a.values = values.raw_data();
  a.nnz = values.size(0);
  a.dim = values.size(1);
  a.beta1 = o.betas().first;
  a.beta2 = o.betas().second;
  a.eps = o.eps();
  // As torch.optim.SparseAdam: the corrections are python floats folded into one step size.
  const double bias_correction1 = 1 - std::pow(a.beta1, double(state.step));
  const double bias_correction2 = 1 - std::pow(a.beta2, double(state.step));
  a.step_size = o.lr() * std::sqrt(bias_correction2) / bias_correction1;
  if (a.nnz > 0) op_sparse_adam_step.get(param.device(), param.dtype())(a);
}

}  // namespace frugal::optim
