// memory::plan (core/plan.h): the search over the candidates, each tested by a dry run under the budget.
#include "core/plan.h"

#include <algorithm>

namespace frugal::memory {

namespace {

double relative_time(const PlanChoice& c, int blocks) {
  const double recomputed = blocks > 0 ? double(c.recompute_blocks) / double(blocks) : 0.0;
  return (1 + kForwardShare * recomputed) * (1 + kMicroBatchOverhead * double(c.micro_batches - 1)) *
         (c.low_precision ? kLowPrecision : 1.0);
}

}  // namespace

std::string Plan::str() const {
  return frugal::detail::str_cat(
      choice.micro_batches, choice.micro_batches == 1 ? " micro-batch" : " micro-batches", ", recompute ",
      choice.recompute_blocks, " of ", blocks, " blocks, ", choice.low_precision ? "bf16 autocast" : "f32",
      ": estimated peak ", format_bytes(peak_allocated), " (reserved ", format_bytes(peak_reserved), ") of ",
      format_bytes(budget), fits ? "" : " (does not fit)", ", ", relative_time,
      "x the plain step's time (predicted)");
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
  auto estimate_of = [&](const PlanChoice& c) {
    ++best.dry_runs;
    EstimateOptions options;
    options.from(space.from()).limit(budget);
    return estimate([&](Device d) { step(d, c); }, options);
  };
  auto consider = [&](const PlanChoice& c, const Estimate& e) {
    const double t = relative_time(c, space.blocks());
    const bool better = !have || (e.fits() && !best.fits) ||
                        (e.fits() == best.fits &&
                         (e.fits() ? t < best.relative_time : e.peak_allocated < best.peak_allocated));
    if (!better) return;
    have = true;
    best.fits = e.fits();
    best.choice = c;
    best.peak_allocated = e.peak_allocated;
    best.peak_reserved = e.peak_reserved;
    best.relative_time = t;
  };
  for (bool low : {false, true}) {
    if (low && !space.low_precision()) continue;
    for (int k : space.micro_batches()) {
      // The fewest recomputed blocks that fit: the cost grows with each one. Ascending, one dry run each: the
      // peak need not fall as blocks recompute (W1's re-run segment costs about what it saves), so no
      // bisection; a dry run costs milliseconds.
      for (int m = 0; m <= space.blocks(); ++m) {
        const PlanChoice c{k, m, low};
        const Estimate e = estimate_of(c);
        consider(c, e);
        if (e.fits()) break;
      }
    }
  }
  return best;
}

}  // namespace frugal::memory
