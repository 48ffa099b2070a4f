// Core kernels: GEMM 1024^3 (workload W5) in f32 through the registered kernel (oneDNN) and Eigen's GEMM, and
// in bf16 and f16 through theirs; an elementwise add over 16M floats. Each benchmark first checks its result
// against a naive reference.
#include <benchmark/benchmark.h>

#include <cmath>

#include "core/op_table_linalg.h"
#include "frugal.h"
#include "kernels/cpu/reference.h"

namespace {

using namespace frugal;

// Checks 256 entries of c = a @ b (n x n, any floating dtype) against dot products in f64 of the same values;
// "" when all match to the result's rounding.
const char* check_gemm(const Tensor& a_in, const Tensor& b_in, const Tensor& c_in) {
  const int64_t n = a_in.size(0);
  const Tensor a = a_in.to(DType::F32), b = b_in.to(DType::F32), c = c_in.to(DType::F32);
  const double rtol = c_in.dtype() == DType::BF16 ? 1e-2 : c_in.dtype() == DType::F16 ? 2e-3 : 1e-3;
  const float *pa = a.data<float>(), *pb = b.data<float>(), *pc = c.data<float>();
  Generator g(7);
  const auto rows = randint(0, n, {256}, DType::I64, &g).to_vector<int64_t>();
  const auto cols = randint(0, n, {256}, DType::I64, &g).to_vector<int64_t>();
  for (size_t t = 0; t < rows.size(); ++t) {
    double s = 0;
    for (int64_t k = 0; k < n; ++k) s += double(pa[rows[t] * n + k]) * double(pb[k * n + cols[t]]);
    if (std::fabs(s - pc[rows[t] * n + cols[t]]) > rtol * (1 + std::fabs(s)))
      return "GEMM result differs from the reference";
  }
  return "";
}

void set_gemm_counters(benchmark::State& state, int64_t n) {
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * double(n) * double(n) * double(n),
                         benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void BM_GemmF32(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Tensor a = randn({n, n}), b = randn({n, n});
  Tensor c = matmul(a, b);
  if (const char* problem = check_gemm(a, b, c); *problem) return state.SkipWithError(problem);
  for (auto _ : state) {
    c = matmul(a, b);
    benchmark::DoNotOptimize(c.raw_data());
  }
  set_gemm_counters(state, n);
}
BENCHMARK(BM_GemmF32)->Arg(128)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

// 16-bit GEMM: bf16 through oneDNN's matmul (AVX-512 BF16), f16 through f32 tiles.
void BM_Gemm16(benchmark::State& state, DType t) {
  const int64_t n = state.range(0);
  const Tensor a = randn({n, n}).to(t), b = randn({n, n}).to(t);
  Tensor c = matmul(a, b);
  if (const char* problem = check_gemm(a, b, c); *problem) return state.SkipWithError(problem);
  for (auto _ : state) {
    c = matmul(a, b);
    benchmark::DoNotOptimize(c.raw_data());
  }
  set_gemm_counters(state, n);
}
BENCHMARK_CAPTURE(BM_Gemm16, bf16, DType::BF16)
    ->Arg(128)
    ->Arg(1024)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gemm16, f16, DType::F16)
    ->Arg(128)
    ->Arg(1024)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_GemmF32Eigen(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Tensor a = randn({n, n}), b = randn({n, n});
  Tensor c = zeros({n, n});
  GemmArgs g;
  g.m = g.n = g.k = n;
  g.a = a.raw_data();
  g.b = b.raw_data();
  g.c = c.raw_data();
  g.a_row = g.b_row = g.c_row = n;
  gemm_f32_eigen_cpu(g);
  if (const char* problem = check_gemm(a, b, c); *problem) return state.SkipWithError(problem);
  for (auto _ : state) gemm_f32_eigen_cpu(g);
  set_gemm_counters(state, n);
}
BENCHMARK(BM_GemmF32Eigen)->Arg(128)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_AddF32(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Tensor a = randn({n}), b = randn({n});
  Tensor c = add(a, b);
  {
    const float *pa = a.data<float>(), *pb = b.data<float>(), *pc = c.data<float>();
    for (int64_t i = 0; i < n; i += 997)
      if (pc[i] != pa[i] + pb[i]) return state.SkipWithError("add result differs from the reference");
  }
  for (auto _ : state) {
    c = add(a, b);
    benchmark::DoNotOptimize(c.raw_data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * 3 * 4 * n);  // two reads and one write per element
}
BENCHMARK(BM_AddF32)->Arg(16 << 20)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
