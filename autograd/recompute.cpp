// Recompute segments; see Note [recompute through saved-tensor hooks] in autograd/recompute.h.
#include "autograd/recompute.h"

#include <utility>

#include "amp/autocast.h"
#include "autograd/graph.h"
#include "core/memory.h"
#include "core/memory_history.h"
#include "core/rng.h"

namespace frugal::autograd {

namespace {

class Segment {
 public:
  Segment(SegmentFn fn, std::vector<Tensor> inputs)
      : fn_(std::move(fn)),
        inputs_(std::move(inputs)),
        rng_(default_generator().state()),
        autocast_(amp::autocast_state()) {}

  // Packing in the first run: a number instead of the tensor.
  size_t pack() { return count_++; }

  // Unpacking in backward: run the segment again if tensor k is not at hand, then hand it out.
  Tensor unpack(size_t k) {
    if (k >= saved_.size() || !saved_[k].defined()) run_again();
    return std::exchange(saved_[k], Tensor());
  }

 private:
  void run_again() {
    Generator& gen = default_generator();
    const Generator::State now = gen.state();
    gen.set_state(rng_);
    saved_.clear();
    {
      // Backward runs with recording off; the segment must record again for its ops to save their tensors.
      EnableGradGuard grad_on;
      // Backward runs without autocast; the segment must cast as it did when it first ran.
      amp::Autocast autocast(autocast_);
      memory::Tag tag("recompute");
      memory::PhaseScope phase(memory::Phase::Recompute);  // Note [memory phases]
      SavedTensorHooks collect(
          [this](const Tensor& t) -> std::any {
            saved_.push_back(t);
            return {};
          },
          [](const std::any&) -> Tensor {
            FRUGAL_ASSERT(false, "recompute: a tensor saved while recomputing was unpacked");
            return Tensor();
          });
      fn_(inputs_);  // the result and the graph recorded for it are dropped; only the saved tensors are kept
    }
    gen.set_state(now);
    FRUGAL_CHECK(saved_.size() == count_, "recompute: the segment saved ", count_,
                 " tensors when it first ran but ", saved_.size(),
                 " when run again in backward; it must do the same ops each time it runs");
  }

  SegmentFn fn_;
  std::vector<Tensor> inputs_;
  Generator::State rng_;
  amp::AutocastState autocast_;
  size_t count_ = 0;
  std::vector<Tensor> saved_;
};

}  // namespace

Tensor recompute(const SegmentFn& fn, const std::vector<Tensor>& inputs) {
  if (!grad_mode_enabled()) return fn(inputs);
  auto segment = std::make_shared<Segment>(fn, inputs);
  SavedTensorHooks hooks(
      [segment](const Tensor&) -> std::any { return std::make_pair(segment, segment->pack()); },
      [](const std::any& packed) -> Tensor {
        const auto& [seg, k] = std::any_cast<const std::pair<std::shared_ptr<Segment>, size_t>&>(packed);
        return seg->unpack(k);
      });
  return fn(inputs);
}

}  // namespace frugal::autograd
