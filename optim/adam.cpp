// optim::Adam and AdamW: option checks, bias corrections, and the per-parameter update through the fused
// kernel (op_adam_step).
#include "optim/adam.h"

#include <cmath>

#include "core/memory_history.h"
#include "core/op_table_optim.h"

namespace frugal::optim {

namespace {

void validate_adam(const char* what, double lr, const Betas& betas, double eps, double wd) {
  FRUGAL_CHECK(lr >= 0, what, ": invalid learning rate ", lr, "; it must be >= 0");
  FRUGAL_CHECK(eps >= 0, what, ": invalid eps ", eps, "; it must be >= 0");
  FRUGAL_CHECK(betas.first >= 0 && betas.first < 1, what, ": invalid beta1 ", betas.first,
               "; betas must lie in [0, 1)");
  FRUGAL_CHECK(betas.second >= 0 && betas.second < 1, what, ": invalid beta2 ", betas.second,
               "; betas must lie in [0, 1)");
  FRUGAL_CHECK(wd >= 0, what, ": invalid weight_decay ", wd, "; it must be >= 0");
}

std::vector<std::string> adam_state_names(bool amsgrad) {
  if (amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"exp_avg", "exp_avg_sq"};
}

// One Adam/AdamW step of a parameter; make_state gives a zeroed, tagged state tensor for the first.
template <typename O>
void adam_update(const O& o, bool decoupled, Tensor& param, const Tensor& grad,
                 std::map<std::string, Tensor>& tensors, int64_t& step, Tensor (*make_state)(const Tensor&)) {
  auto state = [&](const std::string& name) {
    Tensor& t = tensors[name];
    if (!t.defined()) t = make_state(param);
    return t.raw_data();
  };
  ++step;
  AdamStepArgs a;
  a.param = param.raw_data();
  a.grad = grad.raw_data();
  a.exp_avg = state("exp_avg");
  a.exp_avg_sq = state("exp_avg_sq");
  // amsgrad may be switched on between steps: its buffer then starts from zeros, as in PyTorch.
  if (o.amsgrad()) a.max_exp_avg_sq = state("max_exp_avg_sq");
  a.n = param.numel();
  a.lr = o.lr();
  a.beta1 = o.betas().first;
  a.beta2 = o.betas().second;
  a.eps = o.eps();
  a.weight_decay = o.weight_decay();
  a.decoupled_weight_decay = decoupled;
  a.amsgrad = o.amsgrad();
  // As torch.optim.Adam (non-fused): the corrections are python floats, the step size lr / bc1.
  const double bias_correction1 = 1 - std::pow(a.beta1, double(step));
  const double bias_correction2 = 1 - std::pow(a.beta2, double(step));
  a.step_size = a.lr / bias_correction1;
  a.bias_correction2_sqrt = std::sqrt(bias_correction2);
  op_adam_step.get(param.device(), param.dtype())(a);
}

}  // namespace

std::vector<HyperParam> AdamOptions::hyperparams() {
  return {{"lr", &lr_},   {"beta1", &betas_.first},         {"beta2", &betas_.second},
          {"eps", &eps_}, {"weight_decay", &weight_decay_}, {"amsgrad", nullptr, &amsgrad_}};
}
void AdamOptions::validate() const { validate_adam("AdamOptions", lr_, betas_, eps_, weight_decay_); }

std::vector<HyperParam> AdamWOptions::hyperparams() {
  return {{"lr", &lr_},   {"beta1", &betas_.first},         {"beta2", &betas_.second},
          {"eps", &eps_}, {"weight_decay", &weight_decay_}, {"amsgrad", nullptr, &amsgrad_}};
}
void AdamWOptions::validate() const { validate_adam("AdamWOptions", lr_, betas_, eps_, weight_decay_); }

Adam::Adam(std::vector<Tensor> params, const AdamOptions& options)
    : Adam(std::vector<ParamGroup>{ParamGroup(std::move(params))}, options) {}
Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults)
    : Optimizer("Adam", std::move(groups), defaults.clone()) {}

std::vector<std::string> Adam::state_names(const OptimizerOptions& options, const Tensor&) const {
  return adam_state_names(static_cast<const AdamOptions&>(options).amsgrad());
}

void Adam::update(const OptimizerOptions& options, Tensor& param, const Tensor& grad, ParamState& state) {
  memory::OpScope op("adam", param);  // Note [op names in the history]: its state is made inside
  state.initialized = true;
  adam_update(static_cast<const AdamOptions&>(options), false, param, grad, state.tensors, state.step,
              &Optimizer::new_state);
}

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : AdamW(std::vector<ParamGroup>{ParamGroup(std::move(params))}, options) {}
AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& defaults)
    : Optimizer("AdamW", std::move(groups), defaults.clone()) {}

std::vector<std::string> AdamW::state_names(const OptimizerOptions& options, const Tensor&) const {
  return adam_state_names(static_cast<const AdamWOptions&>(options).amsgrad());
}

void AdamW::update(const OptimizerOptions& options, Tensor& param, const Tensor& grad, ParamState& state) {
  memory::OpScope op("adamw", param);  // Note [op names in the history]
  state.initialized = true;
  adam_update(static_cast<const AdamWOptions&>(options), true, param, grad, state.tensors, state.step,
              &Optimizer::new_state);
}

}  // namespace frugal::optim
