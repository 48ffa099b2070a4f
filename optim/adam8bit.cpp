// optim::Adam8bit and AdamW8bit: option checks, which parameters keep f32 moments, the state's names, shapes
// and dtypes, and the per-parameter update through one fused kernel (op_adam8bit_step, or op_adam_step for
// the parameters smaller than min_8bit_size).
#include "optim/adam8bit.h"

#include <cmath>

#include "core/memory_history.h"
#include "core/op_table_optim.h"

namespace frugal::optim {

namespace {

template <typename O>
void validate_adam8bit(const char* what, const O& o) {
  FRUGAL_CHECK(o.lr() >= 0, what, ": invalid learning rate ", o.lr(), "; it must be >= 0");
  FRUGAL_CHECK(o.eps() >= 0, what, ": invalid eps ", o.eps(), "; it must be >= 0");
  FRUGAL_CHECK(o.betas().first >= 0 && o.betas().first < 1, what, ": invalid beta1 ", o.betas().first,
               "; betas must lie in [0, 1)");
  FRUGAL_CHECK(o.betas().second >= 0 && o.betas().second < 1, what, ": invalid beta2 ", o.betas().second,
               "; betas must lie in [0, 1)");
  FRUGAL_CHECK(o.weight_decay() >= 0, what, ": invalid weight_decay ", o.weight_decay(), "; it must be >= 0");
  FRUGAL_CHECK(!o.amsgrad(), what,
               ": amsgrad is not supported with 8-bit moments; use optim::Adam/AdamW for amsgrad");
  FRUGAL_CHECK(o.block_size() >= 64 && o.block_size() <= kAdam8bitMaxBlock && o.block_size() % 64 == 0, what,
               ": invalid block_size ", o.block_size(), "; it must be a multiple of 64 in [64, ",
               kAdam8bitMaxBlock, "] (2048 by default)");
  FRUGAL_CHECK(o.min_8bit_size() >= 0, what, ": invalid min_8bit_size ", o.min_8bit_size(),
               "; it must be >= 0 (parameters with fewer elements keep f32 moments; 0: none do)");
}

std::vector<HyperParam> adam8bit_hyperparams(double& lr, Betas& betas, double& eps, double& wd,
                                             int64_t& block_size, int64_t& min_8bit_size) {
  return {{"lr", &lr},
          {"beta1", &betas.first},
          {"beta2", &betas.second},
          {"eps", &eps},
          {"weight_decay", &wd},
          {"block_size", nullptr, nullptr, nullptr, &block_size},
          {"min_8bit_size", nullptr, nullptr, nullptr, &min_8bit_size}};
}

template <typename O>
bool quantised(const O& o, const Tensor& param) {
  return param.numel() >= o.min_8bit_size();
}

// The state's names; the codes' tensors are named after their code (Note [choosing the code]).
template <typename O>
std::vector<std::string> names_of(const O& o, const Tensor& param) {
  if (!quantised(o, param)) return {"exp_avg", "exp_avg_sq"};
  if (o.code() == Adam8bitCode::Float8)
    return {"exp_avg_e4m3", "exp_avg_absmax", "exp_avg_sq_root_e4m4", "exp_avg_sq_root_absmax"};
  return {"exp_avg_codes", "exp_avg_absmax", "exp_avg_sq_codes", "exp_avg_sq_absmax"};
}

bool is_absmax(const std::string& name) {
  return name == "exp_avg_absmax" || name == "exp_avg_sq_absmax" || name == "exp_avg_sq_root_absmax";
}
bool is_codes(const std::string& name) {
  return name == "exp_avg_codes" || name == "exp_avg_sq_codes" || name == "exp_avg_e4m3" ||
         name == "exp_avg_sq_root_e4m4";
}

template <typename O>
Shape shape_of(const O& o, const std::string& name, const Tensor& param) {
  if (is_absmax(name)) return Shape{(param.numel() + o.block_size() - 1) / o.block_size()};
  return param.shape();
}

// One step of a parameter; step() has made its state (Note [a failed step changes nothing]).
template <typename O>
void adam8bit_update(const O& o, bool decoupled, Tensor& param, const Tensor& grad,
                     std::map<std::string, Tensor>& tensors, int64_t& step) {
  ++step;
  const double bias_correction1 = 1 - std::pow(o.betas().first, double(step));
  const double bias_correction2 = 1 - std::pow(o.betas().second, double(step));
  auto state = [&](const char* name) { return tensors.at(name).raw_data(); };
  if (!quantised(o, param)) {
    // Exactly optim::Adam's / AdamW's update (optim/adam.cpp).
    AdamStepArgs a;
    a.param = param.raw_data();
    a.grad = grad.raw_data();
    a.exp_avg = state("exp_avg");
    a.exp_avg_sq = state("exp_avg_sq");
    a.n = param.numel();
    a.lr = o.lr();
    a.beta1 = o.betas().first;
    a.beta2 = o.betas().second;
    a.eps = o.eps();
    a.weight_decay = o.weight_decay();
    a.decoupled_weight_decay = decoupled;
    a.step_size = a.lr / bias_correction1;
    a.bias_correction2_sqrt = std::sqrt(bias_correction2);
    op_adam_step.get(param.device(), param.dtype())(a);
    return;
  }
  Adam8bitStepArgs a;
  a.param = param.raw_data();
  a.grad = grad.raw_data();
  const bool float8 = o.code() == Adam8bitCode::Float8;
  a.exp_avg_codes = static_cast<uint8_t*>(state(float8 ? "exp_avg_e4m3" : "exp_avg_codes"));
  a.exp_avg_absmax = static_cast<float*>(state("exp_avg_absmax"));
  a.exp_avg_sq_codes = static_cast<uint8_t*>(state(float8 ? "exp_avg_sq_root_e4m4" : "exp_avg_sq_codes"));
  a.exp_avg_sq_absmax = static_cast<float*>(state(float8 ? "exp_avg_sq_root_absmax" : "exp_avg_sq_absmax"));
  a.float8 = float8;
  a.n = param.numel();
  a.block_size = o.block_size();
  a.lr = o.lr();
  a.beta1 = o.betas().first;
  a.beta2 = o.betas().second;
  a.eps = o.eps();
  a.weight_decay = o.weight_decay();
  a.decoupled_weight_decay = decoupled;
  a.step_size = a.lr / bias_correction1;
  a.bias_correction2_sqrt = std::sqrt(bias_correction2);
  if (a.n == 0) return;
  op_adam8bit_step.get(param.device(), param.dtype())(a);
}

}  // namespace

std::vector<HyperParam> Adam8bitOptions::hyperparams() {
  return adam8bit_hyperparams(lr_, betas_, eps_, weight_decay_, block_size_, min_8bit_size_);
}
void Adam8bitOptions::validate() const { validate_adam8bit("Adam8bitOptions", *this); }

std::vector<HyperParam> AdamW8bitOptions::hyperparams() {
  return adam8bit_hyperparams(lr_, betas_, eps_, weight_decay_, block_size_, min_8bit_size_);
}
void AdamW8bitOptions::validate() const { validate_adam8bit("AdamW8bitOptions", *this); }

Adam8bit::Adam8bit(std::vector<Tensor> params, const Adam8bitOptions& options)
    : Adam8bit(std::vector<ParamGroup>{ParamGroup(std::move(params))}, options) {}
Adam8bit::Adam8bit(std::vector<ParamGroup> groups, const Adam8bitOptions& defaults)
    : Optimizer("Adam8bit", std::move(groups), defaults.clone()) {}

std::vector<std::string> Adam8bit::state_names(const OptimizerOptions& options, const Tensor& param) const {
  return names_of(static_cast<const Adam8bitOptions&>(options), param);
}
Shape Adam8bit::state_shape(const OptimizerOptions& options, const std::string& name,
                            const Tensor& param) const {
  return shape_of(static_cast<const Adam8bitOptions&>(options), name, param);
}
DType Adam8bit::state_dtype_of(const std::string& name, const Tensor& param) const {
  return is_codes(name) ? DType::U8 : is_absmax(name) ? DType::F32 : Optimizer::state_dtype_of(name, param);
}

void Adam8bit::update(const OptimizerOptions& options, Tensor& param, const Tensor& grad, ParamState& state) {
  memory::OpScope op("adam8bit", param);  // Note [op names in the history]
  state.initialized = true;
  adam8bit_update(static_cast<const Adam8bitOptions&>(options), false, param, grad, state.tensors,
                  state.step);
}

AdamW8bit::AdamW8bit(std::vector<Tensor> params, const AdamW8bitOptions& options)
    : AdamW8bit(std::vector<ParamGroup>{ParamGroup(std::move(params))}, options) {}
AdamW8bit::AdamW8bit(std::vector<ParamGroup> groups, const AdamW8bitOptions& defaults)
    : Optimizer("AdamW8bit", std::move(groups), defaults.clone()) {}

std::vector<std::string> AdamW8bit::state_names(const OptimizerOptions& options, const Tensor& param) const {
  return names_of(static_cast<const AdamW8bitOptions&>(options), param);
}
Shape AdamW8bit::state_shape(const OptimizerOptions& options, const std::string& name,
                             const Tensor& param) const {
  return shape_of(static_cast<const AdamW8bitOptions&>(options), name, param);
}
DType AdamW8bit::state_dtype_of(const std::string& name, const Tensor& param) const {
  return is_codes(name) ? DType::U8 : is_absmax(name) ? DType::F32 : Optimizer::state_dtype_of(name, param);
}

void AdamW8bit::update(const OptimizerOptions& options, Tensor& param, const Tensor& grad,
                       ParamState& state) {
  memory::OpScope op("adamw8bit", param);  // Note [op names in the history]
  state.initialized = true;
  adam8bit_update(static_cast<const AdamW8bitOptions&>(options), true, param, grad, state.tensors,
                  state.step);
}

}  // namespace frugal::optim
