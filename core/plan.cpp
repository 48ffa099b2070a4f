// memory::plan (core/plan.h): the search over the candidates, each tested by a dry run under the budget.
#include "core/plan.h"

#include <algorithm>
#include <cstdio>

namespace frugal::memory {

double predicted_seconds(const Estimate& e) {
  return e.flops / kFlopsPerSecond + double(e.kernel_calls) * kSecondsPerKernel +
         (double(e.bytes_allocated) + e.operand_bytes) / kBytesPerSecond;
}

double low_precision_time(Device device) {
  if (device.type != DeviceType::CPU) return 1.0;
#if defined(__AVX512BF16__)
  return 0.6;
#else
  return 1.1;
#endif
}

namespace {

double relative_time(const PlanChoice& c, int blocks, const PlanCosts& k) {
  const double whole = blocks > 0 ? double(c.recompute_blocks) / double(blocks) : 0.0,
               selective = blocks > 0 ? double(c.selective_blocks) / double(blocks) : 0.0;
  return (1 + k.recompute * whole + k.selective * selective) *
         (1 + k.micro_batch * double(c.micro_batches - 1)) * (c.low_precision ? k.low_precision : 1.0);
}

}  // namespace

std::string Plan::str() const {
  char time[32];
  std::snprintf(time, sizeof time, "%.2f", relative_time);
  const std::string selective =
      choice.selective_blocks > 0
          ? frugal::detail::str_cat(" + ", choice.selective_blocks, " selectively (their GEMMs kept)")
          : std::string();
  return frugal::detail::str_cat(
      choice.micro_batches, choice.micro_batches == 1 ? " micro-batch" : " micro-batches", ", recompute ",
      choice.recompute_blocks, " of ", blocks, " blocks", selective,
      choice.step_in_backward ? ", the optimizer steps in backward" : "", ", ",
      choice.low_precision ? "bf16 autocast" : "f32", ": estimated peak ", format_bytes(peak_allocated),
      " (reserved ", format_bytes(peak_reserved), ") of ", format_bytes(budget),
      fits ? "" : " (does not fit)", ", ", time, "x the plain step's time (predicted)");
}

Plan plan(const std::function<void(Device, const PlanChoice&)>& step, int64_t budget,
          const PlanSpace& space) {
  FRUGAL_CHECK(step != nullptr, "memory::plan: the step function is empty");
  FRUGAL_CHECK(budget > 0, "memory::plan: the budget must be positive, got ", budget);
  FRUGAL_CHECK(space.blocks() >= 0, "memory::plan: blocks must be >= 0, got ", space.blocks());
  FRUGAL_CHECK(!space.micro_batches().empty(), "memory::plan: no micro-batch counts to choose from");
  for (int k : space.micro_batches())
    FRUGAL_CHECK(k >= 1, "memory::plan: a micro-batch count must be >= 1, got ", k);
  Plan best;
  best.budget = budget;
  best.blocks = space.blocks();
  bool have = false;
  auto estimate_of = [&](const PlanChoice& c, bool limited) {
    ++best.dry_runs;
    EstimateOptions options;
    options.from(space.from()).limit(limited ? budget : 0);
    return estimate([&](Device d) { step(d, c); }, options);
  };
  // The step's own coefficients (Note [the planner's cost model]), from dry runs without the budget.
  // None are needed (nor the plain step's dry run) where there are no blocks and one micro-batch count.
  PlanCosts& costs = best.costs;
  costs.low_precision = low_precision_time(space.from().value_or(kCPU));
  const int n = space.blocks();
  int least_k = 0;
  for (int k : space.micro_batches())
    if (k > 1 && (least_k == 0 || k < least_k)) least_k = k;
  if (n > 0 || least_k > 0) costs.plain_seconds = predicted_seconds(estimate_of({}, false));
  auto share = [&](const PlanChoice& c) {
    if (costs.plain_seconds <= 0) return 0.0;
    return std::max(0.0, predicted_seconds(estimate_of(c, false)) / costs.plain_seconds - 1);
  };
  if (n > 0) costs.recompute = share({1, n, false, 0, false});
  if (n > 0 && space.selective()) costs.selective = share({1, 0, false, n, false});
  if (least_k > 0) costs.micro_batch = share({least_k, 0, false, 0, false}) / double(least_k - 1);
  // fits: e's dry run ran under the budget and fitted (else e is a run without the limit, its peaks whole).
  auto consider = [&](const PlanChoice& c, const Estimate& e, bool fits) {
    const double t = relative_time(c, space.blocks(), costs);
    const bool better =
        !have || (fits && !best.fits) ||
        (fits == best.fits && (fits ? t < best.relative_time : e.peak_allocated < best.peak_allocated));
    if (!better) return;
    have = true;
    best.fits = fits;
    best.choice = c;
    best.peak_allocated = e.peak_allocated;
    best.peak_reserved = e.peak_reserved;
    best.relative_time = t;
  };
  for (bool low : {false, true}) {
    if (low && !space.low_precision()) continue;
    for (int k : space.micro_batches()) {
      // Every (whole, selective) pair in ascending predicted time, one dry run each until one fits (Note [the
      // planner's cost model]); a dry run costs milliseconds.
      std::vector<PlanChoice> candidates;
      for (int m = 0; m <= n; ++m)
        for (int s = 0; s <= (space.selective() ? n - m : 0); ++s)
          for (bool in_backward : {false, true})
            if (!in_backward || (space.step_in_backward() && k == 1))
              candidates.push_back({k, m, low, s, in_backward});
      std::stable_sort(candidates.begin(), candidates.end(), [&](const PlanChoice& a, const PlanChoice& b) {
        return relative_time(a, n, costs) < relative_time(b, n, costs);
      });
      for (const PlanChoice& c : candidates) {
        const Estimate e = estimate_of(c, true);
        if (e.fits()) {
          consider(c, e, true);
          break;
        }
        // A dry run that failed under the budget stopped there: its peaks are what it reached, not what it
        // needs. Those of a run without the limit rank the candidates when none fits.
        if (!best.fits) consider(c, estimate_of(c, false), false);
      }
    }
  }
  return best;
}

}  // namespace frugal::memory
