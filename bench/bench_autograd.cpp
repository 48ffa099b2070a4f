// Framework overhead: forward + backward through a chain of 1,000 ops on one-element tensors, where the math
// is nothing and the bookkeeping (tensor handles, arena blocks, graph nodes) is everything. The peer is
// bench/peers/libtorch_overhead.cpp; bench/compare_overhead.sh runs both. Checks the gradient before timing.
#include <benchmark/benchmark.h>

#include <cmath>

#include "frugal.h"

namespace {

using namespace frugal;

constexpr int kOps = 1000;  // 250 rounds of mul, add, tanh, sub

// Returns x's gradient after one forward + backward of the chain.
double chain(const Tensor& x, const Tensor& a, const Tensor& b) {
  x.zero_grad();
  Tensor y = x;
  for (int i = 0; i < kOps / 4; ++i) y = sub(tanh(add(mul(y, a), b)), b);
  y.backward();
  return x.grad().item<double>();
}

// The same chain in plain doubles, with its derivative by the chain rule.
double reference_grad(double x, double a, double b) {
  double y = x, d = 1;
  for (int i = 0; i < kOps / 4; ++i) {
    const double t = std::tanh(y * a + b);
    d *= a * (1 - t * t);
    y = t - b;
  }
  return d;
}

void BM_AutogradChain(benchmark::State& state) {
  Tensor x = tensor<float>({0.3f}).requires_grad_();
  const Tensor a = tensor<float>({0.9f}), b = tensor<float>({0.1f});
  const double expected = reference_grad(0.3, 0.9, 0.1);
  if (std::fabs(chain(x, a, b) - expected) > 1e-4 * std::fabs(expected) + 1e-30)
    return state.SkipWithError("the chain's gradient differs from the reference");
  for (auto _ : state) benchmark::DoNotOptimize(chain(x, a, b));
  // Seconds per op (forward and backward together); printed with an SI prefix, e.g. 890n.
  state.counters["s_per_op"] = benchmark::Counter(
      double(kOps), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_AutogradChain)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
