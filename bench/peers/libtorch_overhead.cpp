// The libtorch peer of bench/bench_autograd.cpp: the same 1,000-op chain on one-element tensors, forward and
// backward, with the same gradient check before timing.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cmath>

namespace {

constexpr int kOps = 1000;

double chain(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b) {
  if (x.grad().defined()) x.mutable_grad().reset();
  torch::Tensor y = x;
  for (int i = 0; i < kOps / 4; ++i) y = torch::sub(torch::tanh(torch::add(torch::mul(y, a), b)), b);
  y.sum().backward();  // y has one element; sum makes it the 0-d loss libtorch's backward() expects
  return x.grad().item<double>();
}

double reference_grad(double x, double a, double b) {
  double y = x, d = 1;
  for (int i = 0; i < kOps / 4; ++i) {
    const double t = std::tanh(y * a + b);
    d *= a * (1 - t * t);
    y = t - b;
  }
  return d;
}

void BM_LibtorchAutogradChain(benchmark::State& state) {
  torch::Tensor x = torch::full({1}, 0.3f).requires_grad_();
  const torch::Tensor a = torch::full({1}, 0.9f), b = torch::full({1}, 0.1f);
  const double expected = reference_grad(0.3, 0.9, 0.1);
  if (std::fabs(chain(x, a, b) - expected) > 1e-4 * std::fabs(expected) + 1e-30)
    return state.SkipWithError("the chain's gradient differs from the reference");
  for (auto _ : state) benchmark::DoNotOptimize(chain(x, a, b));
  state.counters["s_per_op"] = benchmark::Counter(
      double(kOps), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_LibtorchAutogradChain)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
