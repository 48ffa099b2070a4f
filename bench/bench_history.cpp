// What the memory history (core/memory_history.h) costs: one allocate/free pair (4 KiB) through a fresh
// caching arena with no history, and with one recording (two events a pair). The difference over two is the
// cost of one recorded event. Each benchmark first checks that the history records what it should: nothing
// while off, an alloc and a free per pair while on.
//   build/bench/bench_history --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include "core/allocator_base.h"

namespace {

using namespace frugal;

constexpr int64_t kBytes = 4096;
// The history is restarted (untimed) before it fills, so every timed pair is recorded in full.
constexpr int64_t kPairsPerRecord = int64_t(memory::kDefaultMaxEvents / 2) - 16;

// "" when a history records exactly `expected` alloc and free events for `pairs` pairs.
const char* check_events(memory::detail::AllocatorBase& a, int64_t pairs, bool on) {
  const uint64_t generation = on ? a.start_history(memory::kDefaultMaxEvents) : 0;
  if (on && generation == 0) return "a history was already recording";
  for (int64_t i = 0; i < pairs; ++i) a.deallocate(a.allocate(kBytes).block);
  int64_t allocs = 0, frees = 0;
  for (const memory::HistoryEvent& e : a.history().events) {
    allocs += e.kind == memory::EventKind::Alloc;
    frees += e.kind == memory::EventKind::Free;
  }
  a.stop_history(generation);
  if (!on) return allocs == 0 && frees == 0 ? "" : "events recorded while off";
  return allocs == pairs && frees == pairs ? "" : "not one alloc and one free event per pair";
}

void BM_ArenaPairHistoryOff(benchmark::State& state) {
  auto owned = memory::make_arena(kCPU, memory::make_host_backing());
  auto* arena = dynamic_cast<memory::detail::AllocatorBase*>(owned.get());
  if (!arena) return state.SkipWithError("the arena is not an AllocatorBase");
  if (const char* problem = check_events(*arena, 100, false); *problem) return state.SkipWithError(problem);
  for (auto _ : state) {
    memory::Allocation a = arena->allocate(kBytes);
    benchmark::DoNotOptimize(a.ptr);
    arena->deallocate(a.block);
  }
  arena->check_invariants();
}
BENCHMARK(BM_ArenaPairHistoryOff);

void BM_ArenaPairHistoryOn(benchmark::State& state) {
  auto owned = memory::make_arena(kCPU, memory::make_host_backing());
  auto* arena = dynamic_cast<memory::detail::AllocatorBase*>(owned.get());
  if (!arena) return state.SkipWithError("the arena is not an AllocatorBase");
  if (const char* problem = check_events(*arena, 100, true); *problem) return state.SkipWithError(problem);
  uint64_t generation = arena->start_history(memory::kDefaultMaxEvents);
  int64_t pairs = 0;
  for (auto _ : state) {
    if (++pairs == kPairsPerRecord) {
      state.PauseTiming();
      arena->stop_history(generation);
      generation = arena->start_history(memory::kDefaultMaxEvents);
      pairs = 0;
      state.ResumeTiming();
    }
    memory::Allocation a = arena->allocate(kBytes);
    benchmark::DoNotOptimize(a.ptr);
    arena->deallocate(a.block);
  }
  if (arena->history().truncated) state.SkipWithError("the history filled up: the timing includes drops");
  arena->stop_history(generation);
  state.counters["events"] = benchmark::Counter(double(state.iterations()) * 2, benchmark::Counter::kIsRate,
                                                benchmark::Counter::OneK::kIs1000);
  arena->check_invariants();
}
BENCHMARK(BM_ArenaPairHistoryOn);

}  // namespace

BENCHMARK_MAIN();
