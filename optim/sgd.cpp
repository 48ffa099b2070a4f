// optim::SGD: option checks and the per-parameter update through the fused kernel (op_sgd_step).
#include "optim/sgd.h"

#include "core/memory_history.h"
#include "core/op_table_optim.h"

namespace frugal::optim {

std::vector<HyperParam> SGDOptions::hyperparams() {
  return {{"lr", &lr_},
          {"momentum", &momentum_},
          {"dampening", &dampening_},
          {"nesterov", nullptr, &nesterov_},
          {"weight_decay", &weight_decay_}};
}

void SGDOptions::validate() const {
  FRUGAL_CHECK(lr_ >= 0, "SGDOptions: invalid learning rate ", lr_, "; it must be >= 0");
  FRUGAL_CHECK(momentum_ >= 0, "SGDOptions: invalid momentum ", momentum_, "; it must be >= 0");
  FRUGAL_CHECK(weight_decay_ >= 0, "SGDOptions: invalid weight_decay ", weight_decay_, "; it must be >= 0");
  FRUGAL_CHECK(!nesterov_ || (momentum_ > 0 && dampening_ == 0),
               "SGDOptions: nesterov momentum requires a momentum > 0 and zero dampening (got momentum ",
               momentum_, ", dampening ", dampening_, ")");
}

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options)
    : SGD(std::vector<ParamGroup>{ParamGroup(std::move(params))}, options) {}
SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& defaults)
    : Optimizer("SGD", std::move(groups), defaults.clone()) {}

std::vector<std::string> SGD::state_names(const OptimizerOptions& options, const Tensor&) const {
  if (static_cast<const SGDOptions&>(options).momentum() == 0) return {};
  return {"momentum_buffer"};
}

void SGD::update(const OptimizerOptions& options, Tensor& param, const Tensor& grad, ParamState& state) {
  memory::OpScope op("sgd", param);  // Note [op names in the history]
  const auto& o = static_cast<const SGDOptions&>(options);
  SgdStepArgs a;
  a.param = param.raw_data();
  a.grad = grad.raw_data();
  a.n = param.numel();
  a.lr = o.lr();
  a.momentum = o.momentum();
  a.dampening = o.dampening();
  a.weight_decay = o.weight_decay();
  a.nesterov = o.nesterov();
  if (o.momentum() != 0) {
    // The buffer starts as the first gradient, on the first update with momentum (momentum may be switched
    // on later, as in PyTorch); step() has made it already (Note [a failed step changes nothing]).
    Tensor& buf = state.tensors["momentum_buffer"];
    a.first_step = state.step == 0;
    if (!buf.defined()) buf = new_state(param);
    a.momentum_buffer = buf.raw_data();
    state.initialized = true;  // as in PyTorch, plain SGD keeps no state at all
    ++state.step;
  }
  op_sgd_step.get(param.device(), param.dtype())(a);
}

}  // namespace frugal::optim
