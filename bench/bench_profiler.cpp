// What the profiler (core/profiler.h) costs an op: one small op (relu of 64 floats: its output allocated,
// its kernel run) with no profile, and with one recording. The difference is the cost of one record. Each
// benchmark first checks that the profiler records what it should: nothing while off, one record an op
// while on.
//   build/bench/bench_profiler --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include "frugal.h"

namespace {

using namespace frugal;

// The profile is restarted (untimed) before its records fill, so every timed op is recorded in full.
constexpr int64_t kOpsPerProfile = int64_t(profiler::kDefaultMaxRecords) - 16;

// "" when `ops` relus give `ops` records while on and none while off.
const char* check_records(const Tensor& x, int64_t ops, bool on) {
  profiler::Profile fresh;  // clears what an earlier run left
  fresh.stop();
  std::unique_ptr<profiler::Profile> p;
  if (on) p = std::make_unique<profiler::Profile>();
  for (int64_t i = 0; i < ops; ++i) benchmark::DoNotOptimize(ops::relu(x).raw_data());
  p.reset();
  const size_t records = profiler::records().size();
  if (!on) return records == 0 ? "" : "records while off";
  return records == size_t(ops) ? "" : "not one record an op";
}

void BM_SmallOpProfilerOff(benchmark::State& state) {
  const Tensor x = randn({64});
  if (const char* problem = check_records(x, 100, false); *problem) return state.SkipWithError(problem);
  for (auto _ : state) benchmark::DoNotOptimize(ops::relu(x).raw_data());
}
BENCHMARK(BM_SmallOpProfilerOff);

void BM_SmallOpProfilerOn(benchmark::State& state) {
  const Tensor x = randn({64});
  if (const char* problem = check_records(x, 100, true); *problem) return state.SkipWithError(problem);
  auto p = std::make_unique<profiler::Profile>();
  int64_t ops = 0;
  for (auto _ : state) {
    if (++ops == kOpsPerProfile) {
      state.PauseTiming();
      p.reset();  // stopped first: a Profile made while one records would join it
      p = std::make_unique<profiler::Profile>();
      ops = 0;
      state.ResumeTiming();
    }
    benchmark::DoNotOptimize(ops::relu(x).raw_data());
  }
  p.reset();
  if (profiler::dropped_records() > 0)
    state.SkipWithError("the records filled up: the timing includes drops");
}
BENCHMARK(BM_SmallOpProfilerOn);

}  // namespace

BENCHMARK_MAIN();
