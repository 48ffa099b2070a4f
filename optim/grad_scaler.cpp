// amp::GradScaler, following torch/amp/grad_scaler.py (PyTorch 2.x): its stages per optimizer, its messages,
// and _amp_update_scale_'s rule.
#include "optim/grad_scaler.h"

#include <cmath>
#include <vector>

#include "autograd/functions.h"
#include "autograd/sparse.h"
#include "core/estimate.h"
#include "core/memory_history.h"
#include "core/op_table_optim.h"

namespace frugal::amp {

GradScaler::GradScaler(const GradScalerOptions& options)
    : options_(options), scale_(float(options.init_scale())) {
  if (!enabled()) return;
  FRUGAL_CHECK(options_.growth_factor() > 1.0, "The growth factor must be > 1.0. (GradScaler: got ",
               options_.growth_factor(), ")");
  FRUGAL_CHECK(options_.backoff_factor() < 1.0, "The backoff factor must be < 1.0. (GradScaler: got ",
               options_.backoff_factor(), ")");
  FRUGAL_CHECK(options_.growth_interval() >= 1, "GradScaler: growth_interval must be >= 1, got ",
               options_.growth_interval());
  FRUGAL_CHECK(options_.init_scale() > 0 && std::isfinite(scale_),
               "GradScaler: init_scale must be positive and finite in f32, got ", options_.init_scale());
}

void GradScaler::check_started(const char* what) const {
  FRUGAL_CHECK(started_, "Attempted ", what,
               " but _scale is None.  This may indicate your script did not use scaler.scale(loss or "
               "outputs) earlier in the iteration.");
}

double GradScaler::get_scale() const { return enabled() ? double(scale_) : 1.0; }

Tensor GradScaler::scale(const Tensor& outputs) {
  if (!enabled()) return outputs;
  FRUGAL_CHECK(outputs.defined(), "GradScaler.scale: the tensor is undefined");
  // Note [stepping in backward] (optim/step_in_backward.h): the updates would take the scaled gradients
  // before any overflow could be seen.
  FRUGAL_CHECK(!autograd::updating_grad_ready_hooks_exist(),
               "GradScaler.scale: parameters step in backward (optim::StepInBackward), which updates each "
               "one before the scaler could see an overflow in the others; use bf16 autocast (no scaler) "
               "or no StepInBackward");
  started_ = true;
  return mul(outputs, double(scale_));
}

void GradScaler::unscale_(optim::Optimizer& opt) {
  if (!enabled()) return;
  check_started("unscale_");
  PerOptimizer& st = per_optimizer_[&opt];
  FRUGAL_CHECK(st.stage != Stage::Unscaled,
               "unscale_() has already been called on this optimizer since the last update().");
  FRUGAL_CHECK(st.stage != Stage::Stepped, "unscale_() is being called after step().");

  // Everything is checked before any gradient changes, so a refusal leaves them as they were.
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  int64_t index = 0;
  for (const optim::ParamGroup& group : opt.param_groups()) {
    for (const Tensor& p : group.params) {
      const SparseGrad sparse = autograd::sparse_grad(p);
      const Tensor g = sparse.defined() ? sparse.values : p.grad();
      if (g.defined()) {
        FRUGAL_CHECK_DTYPE(g.dtype() != DType::F16 || group.options().get_master_weights(),
                           "Attempting to unscale FP16 gradients. (", opt.name(), " parameter ", index,
                           ", shape ", p.shape(),
                           ", is f16 without master weights; keep the parameters in f32 under autocast, "
                           "or give the optimizer master_weights(true))");
        grads.push_back(g);
      }
      ++index;
    }
  }
  // As PyTorch, the reciprocal in f64, then rounded to f32.
  UnscaleArgs a;
  a.inv_scale = float(1.0 / double(scale_));
  st.found_inf_flags.clear();
  st.found_inf.reset();
  for (Tensor& g : grads) {
    memory::OpScope op("unscale", g);  // Note [op names in the history]
    Tensor work = g.is_contiguous() ? g : ops::contiguous(g);
    a.grad = work.raw_data();
    a.n = work.numel();
    a.found_inf = static_cast<float*>(flag_for(st, work.device()).raw_data());
    if (a.n > 0) op_non_finite_check_and_unscale.get(work.device(), work.dtype())(a);
    if (!work.is_same(g))
      ops::copy_(g, work);
    else
      g.storage()->bump_version();
  }
  st.checked = st.checked || !grads.empty();
  st.stage = Stage::Unscaled;
}

// Note [one found_inf per device]
// unscale_ gives each device its own flag, a 0-d f32 tensor there, zeroed when first needed; every
// gradient's kernel on that device ORs into it on the device's stream, and nothing waits for the kernels
// (before, each gradient's check was copied back with a wait of its own). found_inf() reads the flags when
// an answer is needed, one copy and one wait per device, as PyTorch's step does (_maybe_opt_step sums
// found_inf.item() over its found_inf_per_device): by step(), to decide whether the optimizer runs, or by
// update() when unscale_ was called without step(). The answer is kept, so an iteration reads each device's
// flag once per optimizer. (PyTorch's update() also keeps the scale on the device; here it is a host float,
// which needs the answer on the host anyway.)
Tensor& GradScaler::flag_for(PerOptimizer& st, Device device) {
  for (Tensor& f : st.found_inf_flags)
    if (f.device() == device) return f;
  return st.found_inf_flags.emplace_back(zeros({}, TensorOptions(DType::F32).device(device)));
}

bool GradScaler::found_inf(PerOptimizer& st) {
  if (!st.found_inf) {
    bool found = false;
    for (const Tensor& f : st.found_inf_flags)  // a dry run's gradients are finite (core/estimate.cpp)
      found = found || memory::item_or(f, 0.0f) != 0.0f;
    st.found_inf = found;
    st.found_inf_flags.clear();
  }
  return *st.found_inf;
}

bool GradScaler::step(optim::Optimizer& opt) {
  memory::PhaseScope phase(memory::Phase::Optimizer);  // unscaling is part of the step (Note [memory phases])
  if (!enabled()) {
    opt.step();
    return true;
  }
  check_started("step");
  PerOptimizer& st = per_optimizer_[&opt];
  FRUGAL_CHECK(st.stage != Stage::Stepped, "step() has already been called since the last update().");
  if (st.stage == Stage::Ready) unscale_(opt);
  PerOptimizer& after = per_optimizer_[&opt];
  FRUGAL_CHECK(after.checked,
               "No inf checks were recorded for this optimizer. (GradScaler.step: no parameter of this ",
               opt.name(), " has a gradient; call backward() on the scaled loss first)");
  const bool run = !found_inf(after);
  if (run) opt.step();
  after.stage = Stage::Stepped;
  return run;
}

void GradScaler::update() {
  if (!enabled()) return;
  check_started("update");
  bool any = false, any_inf = false;
  for (auto& [opt, st] : per_optimizer_) {
    any = any || st.checked;
    any_inf = any_inf || (st.checked && found_inf(st));
  }
  FRUGAL_CHECK(any,
               "No inf checks were recorded prior to update. (GradScaler.update: call step(optimizer) "
               "or unscale_(optimizer) after backward() first)");
  // torch._amp_update_scale_: back off on inf/nan and restart the count; grow after growth_interval clean
  // steps, unless the grown scale would not be finite in f32.
  if (any_inf) {
    scale_ = float(double(scale_) * options_.backoff_factor());
    growth_tracker_ = 0;
  } else if (growth_tracker_ + 1 == options_.growth_interval()) {
    const float grown = float(double(scale_) * options_.growth_factor());
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  } else {
    ++growth_tracker_;
  }
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!enabled()) return;
  check_started("update");
  scale_ = float(new_scale);
  per_optimizer_.clear();
}

StateDict GradScaler::state_dict() const {
  if (!enabled()) return {};
  return {{"scale", scalar_tensor(double(scale_), DType::F64)},
          {"growth_factor", scalar_tensor(options_.growth_factor(), DType::F64)},
          {"backoff_factor", scalar_tensor(options_.backoff_factor(), DType::F64)},
          {"growth_interval", scalar_tensor(double(options_.growth_interval()), DType::I64)},
          {"_growth_tracker", scalar_tensor(double(growth_tracker_), DType::I64)}};
}

void GradScaler::load_state_dict(const StateDict& dict) {
  if (!enabled()) return;
  FRUGAL_CHECK(!dict.empty(),
               "The source state dict is empty, possibly because it was saved from a disabled instance of "
               "GradScaler.");
  auto get = [&](const char* key) {
    auto it = dict.find(key);
    FRUGAL_CHECK(it != dict.end() && it->second.defined() && it->second.numel() == 1,
                 "GradScaler.load_state_dict: the state dict has no '", key,
                 "' (one number); expected the keys of GradScaler.state_dict(): scale, growth_factor, "
                 "backoff_factor, growth_interval, _growth_tracker");
    return it->second.item<double>();
  };
  GradScalerOptions o = options_;
  const double s = get("scale");
  o.growth_factor(get("growth_factor")).backoff_factor(get("backoff_factor"));
  o.growth_interval(int64_t(get("growth_interval")));
  const int64_t tracker = int64_t(get("_growth_tracker"));
  GradScaler check(o.init_scale(s));  // validates the values before anything changes
  options_ = o;
  scale_ = float(s);
  growth_tracker_ = tracker;
}

}  // namespace frugal::amp
