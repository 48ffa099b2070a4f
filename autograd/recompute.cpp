// Recompute segments; see Note [recompute through saved-tensor hooks] in autograd/recompute.h.
#include "autograd/recompute.h"

#include <utility>

#include "amp/autocast.h"
#include "autograd/graph.h"
#include "autograd/replay.h"
#include "core/memory.h"
#include "core/memory_history.h"
#include "core/rng.h"

namespace frugal::autograd {

namespace detail {
thread_local ReplayLog* t_replay = nullptr;
}  // namespace detail

const std::vector<std::string>& replayable_ops() {
  static const std::vector<std::string> ops{"linear",      "linear_relu",      "matmul",
                                            "conv2d",      "conv2d_relu",      "self_attention",
                                            "gelu_linear", "layer_norm_linear"};
  return ops;
}

RecomputePolicy RecomputePolicy::keep(std::vector<std::string> ops) {
  RecomputePolicy all, p;
  all.ops_ = replayable_ops();
  for (const std::string& op : ops)
    FRUGAL_CHECK(all.keeps(op.c_str()), "RecomputePolicy::keep: '", op,
                 "' cannot be kept (only ops whose work is a GEMM are worth keeping; the rest is cheap to "
                 "compute again); the ops that can be kept: ",
                 all.str().substr(std::string("keep ").size()));
  p.ops_ = std::move(ops);
  return p;
}

RecomputePolicy RecomputePolicy::keep_matmuls() {
  RecomputePolicy p;
  p.ops_ = replayable_ops();
  return p;
}

bool RecomputePolicy::keeps(const char* op) const {
  for (const std::string& o : ops_)
    if (o == op) return true;
  return false;
}

std::string RecomputePolicy::str() const {
  if (ops_.empty()) return "recompute all";
  std::string s = "keep ";
  for (size_t i = 0; i < ops_.size(); ++i) s += (i ? ", " : "") + ops_[i];
  return s;
}

namespace {

// Sets the thread's replay log for a scope (null: ops inside are not this segment's to keep).
class ReplayScope {
 public:
  explicit ReplayScope(detail::ReplayLog* log) : prev_(std::exchange(detail::t_replay, log)) {}
  ~ReplayScope() { detail::t_replay = prev_; }
  ReplayScope(const ReplayScope&) = delete;
  ReplayScope& operator=(const ReplayScope&) = delete;

 private:
  detail::ReplayLog* prev_;
};

class Segment {
 public:
  Segment(SegmentFn fn, std::vector<Tensor> inputs, const RecomputePolicy& policy)
      : fn_(std::move(fn)),
        inputs_(std::move(inputs)),
        rng_(default_generator().state()),
        autocast_(amp::autocast_state()),
        policy_(policy) {
    log_.policy = &policy_;
  }

  // The first run's log when the policy keeps something (the ops inside record into it), else null.
  detail::ReplayLog* log() { return policy_.keeps_nothing() ? nullptr : &log_; }
  void first_run_done() { first_calls_ = log_.calls; }

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
    log_.again = true;
    log_.calls = 0;
    {
      ReplayScope replay(log());
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
    const size_t calls = log_.calls;
    log_.kept.clear();  // what the second run did not hand out (nothing, when it did the same ops)
    FRUGAL_CHECK(calls == first_calls_ || log() == nullptr, "recompute: the segment ran ", first_calls_,
                 " ops that its policy could keep when it first ran but ", calls,
                 " when run again in backward; it must do the same ops each time it runs");
    FRUGAL_CHECK(saved_.size() == count_, "recompute: the segment saved ", count_,
                 " tensors when it first ran but ", saved_.size(),
                 " when run again in backward; it must do the same ops each time it runs");
  }

  SegmentFn fn_;
  std::vector<Tensor> inputs_;
  Generator::State rng_;
  amp::AutocastState autocast_;
  RecomputePolicy policy_;
  detail::ReplayLog log_;
  size_t first_calls_ = 0;
  size_t count_ = 0;
  std::vector<Tensor> saved_;
};

}  // namespace

Tensor recompute(const SegmentFn& fn, const std::vector<Tensor>& inputs, const RecomputePolicy& policy) {
  if (!grad_mode_enabled()) return fn(inputs);
  // With optim::StepInBackward, parameters may be updated before the segment runs again, and what it saves
  // the second time is still what it saved the first: Note [recompute and stepping in backward]
  // (optim/step_in_backward.h).
  auto segment = std::make_shared<Segment>(fn, inputs, policy);
  SavedTensorHooks hooks(
      [segment](const Tensor&) -> std::any { return std::make_pair(segment, segment->pack()); },
      [](const std::any& packed) -> Tensor {
        const auto& [seg, k] = std::any_cast<const std::pair<std::shared_ptr<Segment>, size_t>&>(packed);
        return seg->unpack(k);
      });
  ReplayScope replay(segment->log());
  Tensor out = fn(inputs);
  segment->first_run_done();
  return out;
}

}  // namespace frugal::autograd
