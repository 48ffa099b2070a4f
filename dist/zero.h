// dist::ZeroOptimizer: ZeRO stage 1 (Rajbhandari et al. 2020). Each rank keeps and updates the optimizer
// state of only its 1/world_size share of the parameters, so optimizer-state bytes fall by the number of
// ranks (Adam's 8 bytes a parameter become 8 / n).
//
//   dist::Guard guard;
//   dist::DistributedDataParallel ddp(*model,
//   dist::DistributedDataParallelOptions().reduce_gradients(false)); optim::AdamW inner(model->parameters(),
//   optim::AdamWOptions(3e-4)); dist::ZeroOptimizer opt(inner);  // before the first step for (...) {
//   opt.zero_grad(); loss.backward(); opt.step(); }
//
// Note [ZeRO shards]: at construction each parameter group's parameters are moved into one flat tensor (the
// parameters become views of it: no byte more), split into world_size nearly equal contiguous parts; rank r's
// part is the one parameter of the wrapped optimizer's group (its state, made on the first step, is that
// part's). step():
//   1. the group's gradients are copied into one flat tensor and freed, and reduce-scattered (Average): each
//      rank receives the mean gradient of its part only;
//   2. the wrapped optimizer updates the part;
//   3. the parts are all-gathered in place into every rank's flat tensor: every rank has every new parameter.
// The bytes sent are an all-reduce's (a reduce-scatter and an all-gather), so the gradients are not also
// reduced by DistributedDataParallel (reduce_gradients(false); it still broadcasts the initial parameters).
// step() leaves no gradient behind (as zero_grad()).
//
// Optimizers whose state is elementwise only (SGD, Adam, AdamW): their update of a part equals their update
// of the whole, so ZeRO's weights equal plain data parallelism's. Adafactor's factored moments need whole
// matrices and the 8-bit optimizers' blocks would move, so they are refused. f32 and f64 parameters.
//
// state_dict() (a collective: every rank calls it) gathers the parts into the wrapped optimizer's own
// format over the original parameters: the dict a single-process optimizer would save, which
// load_state_dict takes back on any number of ranks (or a single-process optimizer does).
#pragma once

#include <cstdint>
#include <vector>

#include "../core/tensor.h"
#include "../optim/optimizer.h"

namespace frugal::dist {

class ZeroOptimizer {
 public:
  // Takes over the optimizer's parameters (Note [ZeRO shards]); the optimizer must not have stepped yet.
  explicit ZeroOptimizer(optim::Optimizer& optimizer);
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  void step();
  void zero_grad(bool set_to_none = true);
  StateDict state_dict() const;
  void load_state_dict(const StateDict& dict);
  // This rank's state bytes (its parts').
  int64_t num_state_bytes() const { return optimizer_.num_state_bytes(); }
  optim::Optimizer& optimizer() { return optimizer_; }

 private:
  struct Group {
    std::vector<Tensor> params;  // the original parameters, now views of flat
    std::vector<int64_t> offsets;
    Tensor flat;
    std::vector<int64_t> counts;  // elements per rank
    int64_t begin = 0;            // this rank's part: [begin, begin + counts[rank])
    Tensor part;                  // the wrapped optimizer's parameter
  };
  optim::Optimizer& optimizer_;
  std::vector<Group> groups_;
};

}  // namespace frugal::dist
