// amp::GradScaler: dynamic loss scaling for f16 training, as torch.amp.GradScaler. The loss is multiplied by
// a large scale before backward, so that small gradients do not flush to zero in f16; the gradients are
// divided by it before the optimizer uses them; a step whose gradients hold an inf or nan is skipped and the
// scale backs off, and after growth_interval clean steps in a row it grows. bf16 has f32's range and needs
// none. It lives in optim/ because it drives optimizers (the autocast policy is amp/autocast.h); its name is
// PyTorch's.
//
//   amp::GradScaler scaler;  // scale 2^16, x2 after 2000 clean steps, x0.5 on inf/nan
//   for (...) {
//     opt.zero_grad();
//     Tensor loss;
//     {
//       amp::Autocast guard(DType::F16);
//       loss = F::cross_entropy(model->forward(x), y);
//     }
//     scaler.scale(loss).backward();
//     scaler.unscale_(opt);  // optional: to clip (or look at) the true gradients
//     optim::clip_grad_norm_(model->parameters(), 1.0);
//     scaler.step(opt);  // opt.step(), unless a gradient is inf or nan
//     scaler.update();
//   }
//
// Misuse throws Error with PyTorch's messages: unscale_ twice, or after step, before update(); step twice
// before update(); step or update without scale() first; f16 gradients of parameters an optimizer updates
// without master weights (they are unscaled in place, where f16 would lose the small ones; keep the
// parameters f32 under autocast, or give the optimizer master_weights(true), Note [master weights]).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "../core/options.h"
#include "../core/tensor.h"
#include "optimizer.h"

namespace frugal::amp {

class GradScalerOptions {
 public:
  FRUGAL_ARG(double, init_scale) = 65536.0;  // 2^16
  FRUGAL_ARG(double, growth_factor) = 2.0;   // > 1
  FRUGAL_ARG(double, backoff_factor) = 0.5;  // < 1
  FRUGAL_ARG(int64_t, growth_interval) = 2000;
  // A disabled scaler is a no-op: scale() returns the loss, step() is opt.step(), the rest does nothing.
  FRUGAL_ARG(bool, enabled) = true;
};

class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = GradScalerOptions());

  // outputs * scale (a loss, usually), to call backward() on.
  Tensor scale(const Tensor& outputs);
  // Divides the gradients of opt's parameters by the scale, in place, in one pass per gradient that also
  // records whether any holds an inf or nan. At most once per optimizer between update()s.
  void unscale_(optim::Optimizer& opt);
  // unscale_(opt) unless done already, then opt.step() unless a gradient held an inf or nan. Returns whether
  // the step ran.
  bool step(optim::Optimizer& opt);
  // The scale for the next iteration: x backoff_factor if any step since the last update() was skipped,
  // else x growth_factor after growth_interval clean steps in a row. With new_scale: that scale instead.
  void update();
  void update(double new_scale);

  double get_scale() const;                                                   // 1 when disabled
  int64_t growth_tracker() const { return enabled() ? growth_tracker_ : 0; }  // clean steps in a row
  bool is_enabled() const { return enabled(); }
  const GradScalerOptions& options() const { return options_; }

  // "scale", "growth_factor", "backoff_factor" (0-d f64), "growth_interval", "_growth_tracker" (0-d i64), as
  // PyTorch's; empty when disabled. Save it after update().
  StateDict state_dict() const;
  // Throws Error for an empty dict (saved by a disabled scaler) or a missing key; a no-op when disabled.
  void load_state_dict(const StateDict& dict);

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  struct PerOptimizer {
    Stage stage = Stage::Ready;
    bool checked = false;  // some gradient was checked for inf/nan
    // Written by the kernels without a wait (Note [one found_inf per device] in grad_scaler.cpp): one
    // 0-d f32 flag per device until found_inf() reads them, then only the answer.
    std::vector<Tensor> found_inf_flags;
    std::optional<bool> found_inf;
  };
  bool enabled() const { return options_.enabled(); }
  void check_started(const char* what) const;
  static Tensor& flag_for(PerOptimizer& st, Device device);
  static bool found_inf(PerOptimizer& st);  // reads (and waits for) the flags the first time

  GradScalerOptions options_;
  float scale_;  // f32, as PyTorch keeps it
  int64_t growth_tracker_ = 0;
  bool started_ = false;  // scale() was called: step() and update() need it
  std::map<const optim::Optimizer*, PerOptimizer> per_optimizer_;  // since the last update()
};

}  // namespace frugal::amp
