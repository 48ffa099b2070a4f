// One allocate/free pair (4 KiB, 1 MiB) through the caching arena, the system allocator and std::malloc, and
// through the CPU's own arena (memory::allocator(kCPU)), the one a program uses, which also publishes its
// statistics for frugal-smi.
// Each benchmark first checks what it times: a non-null, writable block (64-byte aligned from frugal).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/memory.h"

namespace {

using namespace frugal;

// Writes the first and last byte and reads them back; "" when fine, else what is wrong.
const char* check_block(void* ptr, int64_t nbytes, bool aligned64) {
  if (ptr == nullptr) return "null pointer";
  if (aligned64 && reinterpret_cast<uintptr_t>(ptr) % 64 != 0) return "not 64-byte aligned";
  auto* p = static_cast<volatile unsigned char*>(ptr);
  p[0] = 0x5a;
  p[nbytes - 1] = 0xa5;
  if (p[0] != 0x5a || p[nbytes - 1] != 0xa5) return "not writable";
  return "";
}

void run_allocator(benchmark::State& state, memory::Allocator& alloc) {
  const int64_t n = state.range(0);
  {
    memory::Allocation a = alloc.allocate(n);
    const char* problem = check_block(a.ptr, n, true);
    alloc.deallocate(a.block);
    if (*problem || a.size < n)
      return state.SkipWithError(*problem ? problem : "block smaller than the request");
  }
  for (auto _ : state) {
    memory::Allocation a = alloc.allocate(n);
    benchmark::DoNotOptimize(a.ptr);
    alloc.deallocate(a.block);
  }
  alloc.check_invariants();
}

void BM_ArenaPair(benchmark::State& state) {
  auto arena = memory::make_arena(kCPU, memory::make_host_backing());
  run_allocator(state, *arena);
}

void BM_DeviceArenaPair(benchmark::State& state) { run_allocator(state, memory::allocator(kCPU)); }

void BM_SystemAllocatorPair(benchmark::State& state) {
  auto sys = memory::make_system_allocator(kCPU, memory::make_host_backing());
  run_allocator(state, *sys);
}

void BM_MallocPair(benchmark::State& state) {
  const auto n = size_t(state.range(0));
  {
    void* p = std::malloc(n);
    const char* problem = check_block(p, int64_t(n), false);  // malloc promises 16 bytes, not 64
    std::free(p);
    if (*problem) return state.SkipWithError(problem);
  }
  for (auto _ : state) {
    void* p = std::malloc(n);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
}

BENCHMARK(BM_ArenaPair)->Arg(4 << 10)->Arg(1 << 20);
BENCHMARK(BM_DeviceArenaPair)->Arg(4 << 10)->Arg(1 << 20);
BENCHMARK(BM_SystemAllocatorPair)->Arg(4 << 10)->Arg(1 << 20);
BENCHMARK(BM_MallocPair)->Arg(4 << 10)->Arg(1 << 20);

}  // namespace

BENCHMARK_MAIN();
