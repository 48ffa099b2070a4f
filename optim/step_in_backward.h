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
// is), and sparse gradients (SparseAdam). A step that fails part-way (out of memory) has updated the
// parameters before it, unlike Optimizer::step (Note [a failed step changes nothing]). Works with every
// dense optimizer: SGD, Adam/AdamW, the 8-bit forms, Adafactor, master weights; and with recompute
// segments, where it pays most (below).
//
// Note [recompute and stepping in backward]: a recompute segment (autograd/recompute.h) runs again in
// backward, when its newest node that saved tensors unpacks them, and reads the parameters then; some may
// have been updated already. What it saves is still what it saved the first time:
// - backward runs nodes newest first (by Node::sequence), so every node that reads parameter p runs before
//   p's hook;
// - so if p is updated before the segment runs again, every node of the segment that reads p is newer than
//   the segment's newest saving node;
// - and a node's output, saved or not, depends only on older nodes' inputs: no saved tensor of the segment
//   depends on p. (Only outputs that the second run drops do.)
// A parameter that a segment reads without recording it (detached, or under NoGradGuard) is outside this:
// no edge tells backward that the segment reads it, so it may be updated before the second run reads it.
// So the gradients are the ones without recompute, bit for bit (tested with a parameter used only by a
// segment's last op, and one shared by two segments). Together they lower the peak of a step whose
// activations are recomputed by about the gradients' bytes: W4r against W4rg in bench/workloads.
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
