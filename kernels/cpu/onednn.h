// The oneDNN engine and streams the CPU kernels share (include only under FRUGAL_HAVE_ONEDNN).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <dnnl.hpp>

#include "kernels/cpu/workspace.h"

namespace frugal::cpu {

inline dnnl::engine& onednn_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// One stream per thread: kernels run from several threads at once (the convolutions' per-image loops).
inline dnnl::stream& onednn_stream() {
  thread_local dnnl::stream stream(onednn_engine());
  return stream;
}

// The scratchpad of a primitive made with scratchpad_mode::user, from the arena (so its bytes show in the
// statistics), added to its arguments; the returned buffer must live until the primitive has run.
inline Tensor add_scratchpad(const dnnl::memory::desc& scratchpad,
                             std::unordered_map<int, dnnl::memory>& args) {
  if (scratchpad.get_size() == 0) return {};
  Tensor buffer = workspace(int64_t(scratchpad.get_size()));
  args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(scratchpad, onednn_engine(), buffer.raw_data()));
  return buffer;
}

// Primitives by key (everything they are specialised on, as integers), so a training loop creates each one
// once. Bounded: a program that sweeps many shapes starts over rather than growing without end. A null plan
// (oneDNN declined: `build` threw dnnl::error) is cached too, and tells the caller to take its fallback path.
template <size_t N, class Plan>
class PlanCache {
 public:
  using Key = std::array<int64_t, N>;
  explicit PlanCache(size_t max_plans) : max_plans_(max_plans) {}

  template <class Build>
  std::shared_ptr<const Plan> get(const Key& key, Build&& build) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    }
    std::shared_ptr<const Plan> plan;
    try {
      plan = build();
    } catch (const dnnl::error&) {
      plan = nullptr;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (plans_.size() >= max_plans_) plans_.clear();
    plans_.emplace(key, plan);
    return plan;
  }

 private:
  struct Hash {  // FNV-1a over the integers
    size_t operator()(const Key& k) const {
      size_t h = 1469598103934665603ull;
      for (int64_t x : k) h = (h ^ size_t(x)) * 1099511628211ull;
      return h;
    }
  };
  size_t max_plans_;
  std::mutex mutex_;
  std::unordered_map<Key, std::shared_ptr<const Plan>, Hash> plans_;
};

}  // namespace frugal::cpu
