// optim::StepInBackward: each parameter's update runs during backward, as soon as its gradient is complete,
// and the gradient is freed right after, so the model's gradients never all exist at once (about a
// parameter's worth of bytes less at the peak of a step whose peak is in backward).
//
//   optim::SGD opt(model->parameters(), optim::SGDOptions(1e-3).momentum(0.9));
//   optim::StepInBackward in_backward(opt);       // while alive, backward() is the whole step
//   for (...) { loss = ...; loss.backward(); }    // no zero_grad(), no step()
//
// Note [stepping in backward]: backward counts, for each parameter, the graph's edges that bring it a
// gradient, and updates it when the last has arrived (autograd::set_grad_ready_hook; a parameter used
// several times is updated once, with its whole gradient). So each backward() is one optimizer step; what
// needs every gradient before any update cannot apply, and is refused with an Error: gradient accumulation
// over several backward calls (a parameter that has a gradient when backward starts), clipping by the global
// norm (optim::clip_grad_norm_), the loss scaler (GradScaler: an overflow is known only once every gradient
// is), sparse gradients (SparseAdam), and recompute segments (their second run reads the parameters,
// which may be updated by then). A step that fails part-way (out of memory) has updated the parameters
// before it, unlike Optimizer::step (Note [a failed step changes nothing]). Works with every dense
// optimizer: SGD, Adam/AdamW, the 8-bit forms, Adafactor, master weights.
#pragma once

#include <vector>

#include "optimizer.h"

namespace frugal::optim {

class StepInBackward {
 public:
  explicit StepInBackward(Optimizer& optimizer);
  ~StepInBackward();
  // How many are alive, in every thread (dist::DistributedDataParallel refuses to run beside one).
  static int active();
  StepInBackward(const StepInBackward&) = delete;
  StepInBackward& operator=(const StepInBackward&) = delete;

 private:
  Optimizer& optimizer_;
  std::vector<Tensor> params_;
};

}  // namespace frugal::optim
