// memory::plan (core/plan.h): the search over the candidates, each tested by a dry run under the budget.
#include "core/plan.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace frugal::memory {

double predicted_seconds(const Estimate& e) {
  return e.flops / kFlopsPerSecond + double(e.kernel_calls) * kSecondsPerKernel +
         (double(e.bytes_allocated) + e.operand_bytes) / kBytesPerSecond;
}

#if defined(__AVX512BF16__)
namespace {

// Note [the low-precision factor]: bf16 autocast's products run on the CPU's bf16 dot products (VDPBF16PS),
// whose rate against the f32 FMA's is the processor's: fma-peak puts the bf16 dot at 1.75x the f32 FMA's
// GFLOP/s on a Zen 5 (940 against 537), but at 0.49x on a Xeon without AMX (`lscpu`: Intel family 6, model
// 207; 86.9 against 177 on one core), where W5b (bf16 GEMM) took 1.78x W5's time and W4b 1.80x W4's. So the
// factor is measured, not assumed: the time of a bf16 dot product's flops over an f32 FMA's, each as chains
// of independent instructions held in registers (the way fma-peak measures), on this thread, the best of 5
// alternated runs of each, once per process (about 1 ms). Nothing touches memory: no arena block moves and
// no budget can refuse it. A step's non-GEMM work does not speed up with the products, so a GEMM-bound step
// (W4b, W6) comes closest to the factor.
double bf16_dot_time_over_fma() {
  constexpr int kChains = 12;
  constexpr int kIters = 20000;
  float sink = 0;
  auto seconds = [&](auto&& body) {
    const auto t0 = std::chrono::steady_clock::now();
    sink += body();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Operands the compiler cannot see, so that it cannot fold the chains; one lane of their sum comes back.
  volatile float one = 1.0000001f, near_one = 0.9999999f;
  volatile int bf16_ones = 0x3f803f80;  // two bf16 1.0s
  auto sum_of = [](const __m512* acc) {
    __m512 t = acc[0];
    for (int c = 1; c < kChains; ++c) t = _mm512_add_ps(t, acc[c]);
    return _mm512_cvtss_f32(t);
  };
  auto fma = [&] {
    __m512 acc[kChains];
    const __m512 a = _mm512_set1_ps(one), b = _mm512_set1_ps(near_one);
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(float(c));
    for (int i = 0; i < kIters; ++i)
      for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
    return sum_of(acc);
  };
  auto dot = [&] {
    __m512 acc[kChains];
    const __m512bh a = (__m512bh)_mm512_set1_epi32(bf16_ones), b = a;
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(float(c));
    for (int i = 0; i < kIters; ++i)
      for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    return sum_of(acc);
  };
  seconds(fma);  // the 512-bit units' warm-up
  double t_fma = std::numeric_limits<double>::infinity(), t_dot = t_fma;
  for (int r = 0; r < 5; ++r) {
    t_fma = std::min(t_fma, seconds(fma));
    t_dot = std::min(t_dot, seconds(dot));
  }
  if (sink == 42.0f) std::fputc(' ', stderr);  // keeps the loops' results alive
  // An FMA does 16 lanes x 2 flops, a bf16 dot 16 lanes x 2 pairs x 2 flops.
  return (t_dot / 64) / (t_fma / 32);
}

}  // namespace
#endif

double low_precision_time(Device device) {
  if (device.type != DeviceType::CPU) return 1.0;
#if defined(__AVX512BF16__)
  static const double factor = bf16_dot_time_over_fma();  // Note [the low-precision factor]
  return factor;
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
