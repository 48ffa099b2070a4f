// optim::StepInBackward; see Note [stepping in backward] in optim/step_in_backward.h.
#include "optim/step_in_backward.h"

#include <atomic>

#include "autograd/graph.h"

namespace frugal::optim {

namespace {
std::atomic<int> g_active{0};
}  // namespace

int StepInBackward::active() { return g_active.load(); }

StepInBackward::StepInBackward(Optimizer& optimizer) : optimizer_(optimizer) {
  FRUGAL_CHECK(!optimizer.takes_sparse_grads(), "StepInBackward: ", optimizer.name(),
               " takes sparse gradients, which backward does not complete parameter by parameter; use it "
               "with a dense optimizer");
  FRUGAL_CHECK(optimizer.in_backward_ == 0, "StepInBackward: ", optimizer.name(),
               " already steps in backward (one StepInBackward an optimizer)");
  for (const ParamGroup& g : optimizer.param_groups())
    for (const Tensor& p : g.params) {
      for (const autograd::GradReadyHook& h : p.autograd_meta()->grad_ready)
        FRUGAL_CHECK(h.kind != autograd::GradReadyKind::Reads, "StepInBackward: a parameter (shape ",
                     p.shape(),
                     ") has its gradient reduced across processes (dist::DistributedDataParallel); an update "
                     "needs the reduced gradient, which exists only at the end of backward: use one or the "
                     "other");
      FRUGAL_CHECK(!p.autograd_meta()->has_updating_hook(), "StepInBackward: a parameter (shape ", p.shape(),
                   ") already has a grad-ready hook (another optimizer steps it in backward?)");
      params_.push_back(p);
    }
  // The hooks hold the tensor's metadata alive through the guard, not through themselves (a parameter's
  // hook holding the parameter would be a cycle).
  for (size_t i = 0; i < params_.size(); ++i)
    autograd::set_grad_ready_hook(params_[i], [this, i] {
      const Tensor& p = params_[i];
      FRUGAL_ASSERT(p.autograd_meta()->grad.defined(),
                    "StepInBackward: a grad-ready hook without a gradient");
      optimizer_.step_param(p);
      p.zero_grad();  // freed: the point of stepping in backward
    });
  optimizer.in_backward_ = 1;
  ++g_active;
}

StepInBackward::~StepInBackward() {
  for (const Tensor& p : params_) autograd::set_grad_ready_hook(p, {});
  optimizer_.in_backward_ = 0;
  --g_active;
}

}  // namespace frugal::optim
