// The hook through which an op's results can be kept by a recompute segment and handed out again when the
// segment runs a second time (Note [selective recompute], autograd/recompute.h). An op that can be kept
// computes its results inside it:
//
//   Tensor y = autograd::detail::replayable("linear", [&] { return ops::linear(x, weight, bias); });
//
// Outside a segment whose policy keeps something (almost always) this is one thread-local load and the call.
#pragma once

#include <array>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "autograd/recompute.h"

namespace frugal::autograd::detail {

// What a segment with a keeping policy records while it runs: the results of each replayable op call it
// keeps, by call number (empty where the op was not kept).
struct ReplayLog {
  const RecomputePolicy* policy = nullptr;
  bool again = false;  // false: the first run (keep); true: the run in backward (hand out)
  size_t calls = 0;    // replayable op calls seen in this run so far
  std::vector<std::vector<Tensor>> kept;
};

// The innermost recompute segment running on this thread, when its policy keeps something; else null. In the
// static TLS block, as the allocation path's (Note [thread-locals on the allocation path],
// core/history_log.h).
extern thread_local ReplayLog* t_replay __attribute__((tls_model("initial-exec")));

inline std::vector<Tensor> keep_results(const Tensor& t) { return {t.detach()}; }
template <size_t N>
std::vector<Tensor> keep_results(const std::array<Tensor, N>& ts) {
  std::vector<Tensor> v;
  for (const Tensor& t : ts) v.push_back(t.detach());
  return v;
}
template <class R>
R kept_results(std::vector<Tensor>&& v) {
  if constexpr (std::is_same_v<R, Tensor>) {
    return std::move(v[0]);
  } else {
    R r;
    for (size_t i = 0; i < r.size(); ++i) r[i] = std::move(v[i]);
    return r;
  }
}

// compute returns the op's results: a Tensor, or a std::array of them. The kept copies are aliases without
// autograd metadata (detach), so the second run records its own nodes over them.
template <class F>
auto replayable(const char* op, F&& compute) -> decltype(compute()) {
  using R = decltype(compute());
  ReplayLog* log = t_replay;
  if (log == nullptr) return compute();
  const size_t call = log->calls++;
  if (log->again) {
    if (call < log->kept.size() && !log->kept[call].empty())
      return kept_results<R>(std::exchange(log->kept[call], {}));
    return compute();
  }
  R r = compute();
  if (log->policy->keeps(op)) {
    if (log->kept.size() <= call) log->kept.resize(call + 1);
    log->kept[call] = keep_results(r);
  }
  return r;
}

}  // namespace frugal::autograd::detail
