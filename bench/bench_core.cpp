// Core kernels: GEMM 1024^3 (workload W5) in f32 through the registered kernel (oneDNN) and Eigen's GEMM, and
// in bf16 and f16 through theirs; a layer's forward on a few rows in f32, bf16 and f16; an elementwise add,
// softmax and LayerNorm (forward and backward) over 16M floats, beside a STREAM-like copy of as many (the
// bandwidth they are compared with). Each benchmark first checks its result against a naive reference.
#include <benchmark/benchmark.h>

#include <algorithm>
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

// A layer's forward on a few rows (Note [few rows of 16-bit floats], kernels/cpu/gemm.cpp): linear(x [m, k],
// w [n, k]) in each dtype, f32 beside it as the peer of the same shape. The counter workspace_bytes is what
// the arena held beyond the output while it ran.
void BM_LinearFewRows(benchmark::State& state, DType t) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  const Tensor x = randn({m, k}).to(t), w = randn({n, k}).to(t);
  InferenceMode im;
  memory::reset_peak(kCPU);
  const int64_t before = memory::stats(kCPU).allocated.current;
  Tensor y = linear(x, w);
  const int64_t workspace = memory::stats(kCPU).allocated.peak - before - y.nbytes();
  const auto got = y.to_vector<double>(), xs = x.to_vector<double>(), ws = w.to_vector<double>();
  const double rtol = t == DType::BF16 ? 1e-2 : t == DType::F16 ? 2e-3 : 1e-5;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, mag = 0;
      for (int64_t p = 0; p < k; ++p) {
        s += xs[size_t(i * k + p)] * ws[size_t(j * k + p)];
        mag += std::fabs(xs[size_t(i * k + p)] * ws[size_t(j * k + p)]);
      }
      if (std::fabs(s - got[size_t(i * n + j)]) > rtol * (1 + mag))
        return state.SkipWithError("linear result differs from the reference");
    }
  for (auto _ : state) {
    y = linear(x, w);
    benchmark::DoNotOptimize(y.raw_data());
  }
  state.counters["workspace_bytes"] = double(workspace);
  state.counters["FLOP/s"] = benchmark::Counter(
      2.0 * double(m * n * k), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
void few_rows_shapes(benchmark::internal::Benchmark* b) {
  b->Args({4, 128, 256})
      ->Args({16, 128, 256})
      ->Args({16, 512, 2048})
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}
BENCHMARK_CAPTURE(BM_LinearFewRows, f32, DType::F32)->Apply(few_rows_shapes);
BENCHMARK_CAPTURE(BM_LinearFewRows, bf16, DType::BF16)->Apply(few_rows_shapes);
BENCHMARK_CAPTURE(BM_LinearFewRows, f16, DType::F16)->Apply(few_rows_shapes);

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

// The machine's copy bandwidth, as STREAM's Copy kernel measures it (c[i] = a[i] over 16M floats, on the
// library's threads, counted as one read and one write an element): the ceiling add's bytes per second are
// compared with (#22: add at >= 0.8 of it).
void BM_CopyF32Stream(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Tensor a = randn({n});
  Tensor c = empty({n});
  const float* pa = a.data<float>();
  float* pc = c.data<float>();
  auto copy = [&] {
    parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) pc[i] = pa[i];
    });
  };
  copy();
  for (int64_t i = 0; i < n; i += 997)
    if (pc[i] != pa[i]) return state.SkipWithError("the copy differs from its source");
  for (auto _ : state) {
    copy();
    benchmark::DoNotOptimize(pc);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * 2 * 4 * n);
}
BENCHMARK(BM_CopyF32Stream)->Arg(16 << 20)->Unit(benchmark::kMillisecond)->UseRealTime();

// Softmax and LayerNorm over 16M floats (rows of 1024), forward and backward through autograd, in bytes a
// second counted as STREAM counts (each tensor an element is read or written once: forward x in, y out;
// backward y or x, dy in, dx out), to compare with the copy's (#22: at >= 0.6 of it). layer_norm_affine: the
// norm with a weight and a bias that need gradients too (nn::LayerNorm's form; its backward also sums
// dy x-hat and dy over the rows), in rows of 1024 and of 128 (W3's width). Each checks one row against a
// naive reference first.
enum class RowOp { Softmax, LayerNorm, LayerNormAffine };
struct Affine {
  Tensor weight, bias;
};
Tensor row_op(RowOp op, const Tensor& x, const Affine& affine = {}) {
  if (op == RowOp::Softmax) return softmax(x, -1);
  return layer_norm(x, {x.size(1)}, affine.weight, affine.bias);
}

const char* check_row(RowOp op, const Tensor& x, const Tensor& y, const Affine& affine = {}) {
  const int64_t d = x.size(1);
  const float* w = affine.weight.defined() ? affine.weight.data<float>() : nullptr;
  const float* b = affine.bias.defined() ? affine.bias.data<float>() : nullptr;
  const float *px = x.data<float>(), *py = y.data<float>();
  double m = 0, v = 0, z = 0;
  for (int64_t j = 0; j < d; ++j) m = std::max(m, double(px[j]));
  for (int64_t j = 0; j < d; ++j) z += std::exp(double(px[j]) - m);
  double mean = 0;
  for (int64_t j = 0; j < d; ++j) mean += px[j];
  mean /= double(d);
  for (int64_t j = 0; j < d; ++j) v += (px[j] - mean) * (px[j] - mean);
  const double rstd = 1 / std::sqrt(v / double(d) + 1e-5);
  for (int64_t j = 0; j < d; ++j) {
    const double want = op == RowOp::Softmax ? std::exp(double(px[j]) - m) / z
                                             : (px[j] - mean) * rstd * (w ? w[j] : 1.0) + (b ? b[j] : 0.0);
    if (std::fabs(want - py[j]) > 1e-5 * (1 + std::fabs(want))) return "a row differs from the reference";
  }
  return "";
}

void BM_RowOpF32(benchmark::State& state, RowOp op, bool backward) {
  const int64_t n = state.range(0), d = state.range(1);
  const Tensor x = randn({n / d, d});
  Affine affine;
  if (op == RowOp::LayerNormAffine) affine = {randn({d}).requires_grad_(), randn({d}).requires_grad_()};
  if (const char* problem = check_row(op, x, row_op(op, x, affine), affine); *problem)
    return state.SkipWithError(problem);
  const Tensor dy = randn({n / d, d});
  const Tensor xg = x.detach().requires_grad_();
  for (auto _ : state) {
    if (!backward) {
      NoGradGuard no_grad;
      Tensor y = row_op(op, x, affine);
      benchmark::DoNotOptimize(y.raw_data());
      continue;
    }
    state.PauseTiming();
    xg.zero_grad();
    if (affine.weight.defined()) affine.weight.zero_grad(), affine.bias.zero_grad();
    Tensor y = row_op(op, xg, affine);
    state.ResumeTiming();
    y.backward(dy);
    benchmark::DoNotOptimize(xg.grad().raw_data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * (backward ? 3 : 2) * 4 * n);
}
BENCHMARK_CAPTURE(BM_RowOpF32, softmax_forward, RowOp::Softmax, false)
    ->Args({16 << 20, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_RowOpF32, softmax_backward, RowOp::Softmax, true)
    ->Args({16 << 20, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_RowOpF32, layer_norm_forward, RowOp::LayerNorm, false)
    ->Args({16 << 20, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_RowOpF32, layer_norm_backward, RowOp::LayerNorm, true)
    ->Args({16 << 20, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_RowOpF32, layer_norm_affine_backward, RowOp::LayerNormAffine, true)
    ->Args({16 << 20, 1024})
    ->Args({16 << 20, 128})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
