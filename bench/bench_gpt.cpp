// W3 (WORKLOADS.md): one char-level GPT training step (forward, backward, AdamW) at batch 32, context 64,
// vocabulary 114, random tokens, with and without recompute segments per block: median step ms (counter
// median_ms, after 5 warm-up steps) and the arena's peak bytes during a step (peak_bytes: everything live,
// parameters and optimizer state included; step_bytes: the peak above what was live before the step).
// First it checks the fused attention op against its composite. The peer is bench/peers/torch_gpt.py
// (bench/compare_gpt.sh alternates the two). BM_AmpGPTStep is W6: the same step under bf16 autocast beside
// f32.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "frugal.h"
#include "nn/attention.h"
#include "nn/gpt.h"

namespace {

using namespace frugal;
namespace F = nn::functional;

constexpr int64_t kBatch = 32, kContext = 64, kVocab = 114;

// "" when the fused op's probabilities and gradients match the composite's on W3-sized scores.
std::string check_fused() {
  Generator g(1);
  const Tensor x = randn({kBatch, 4, kContext, kContext}, {}, &g).requires_grad_();
  const Tensor w = randn(x.shape(), {}, &g);
  auto run = [&](bool fused) {
    x.zero_grad();
    const double scale = 1 / std::sqrt(32.0);
    const Tensor y = fused ? F::attention_scores_softmax(x, scale, true)
                           : F::attention_scores_softmax_composite(x, scale, true);
    sum(mul(y, w)).backward();
    return std::make_pair(y.detach(), x.grad());
  };
  const auto [y1, d1] = run(true);
  const auto [y2, d2] = run(false);
  auto close = [](const Tensor& a, const Tensor& b) {
    return ops::max(ops::abs(ops::sub(a, b))).item<double>() <= 1e-5;
  };
  if (!close(y1, y2)) return "fused attention probabilities differ from the composite";
  if (!close(d1, d2)) return "fused attention gradients differ from the composite";
  return "";
}

// The step's median wall time in ms over the benchmark's iterations.
template <class Step>
double median_step_ms(benchmark::State& state, Step&& step) {
  std::vector<double> ms;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

// W3's model, optimizer and one batch of random tokens.
struct GPTSetup {
  nn::GPT gpt = [] {  // seeded before the weights are drawn
    manual_seed(0);
    return nn::GPT(nn::GPTConfig{.vocab = kVocab});
  }();
  optim::AdamW opt{gpt->parameters(), optim::AdamWOptions(1e-3)};
  Generator g{2};
  Tensor tokens = randint(0, kVocab, {kBatch, kContext}, DType::I64, &g);
  Tensor targets = randint(0, kVocab, {kBatch, kContext}, DType::I64, &g);
};

void BM_GPTStep(benchmark::State& state) {
  if (const std::string problem = check_fused(); !problem.empty())
    return state.SkipWithError(problem.c_str());
  const bool recompute = state.range(0) == 1;
  GPTSetup s;
  auto& [gpt, opt, g, tokens, targets] = s;
  gpt->recompute(recompute);
  double loss = 0;
  auto step = [&] {
    opt.zero_grad();
    const Tensor l = F::cross_entropy(gpt->forward(tokens).view({-1, kVocab}), targets.view({-1}));
    l.backward();
    opt.step();
    loss = l.item<double>();
  };
  for (int i = 0; i < 5; ++i) step();
  if (!std::isfinite(loss)) return state.SkipWithError("the loss is not finite");
  const int64_t before = memory::stats().allocated.current;
  memory::reset_peak();
  step();
  const int64_t peak = memory::stats().allocated.peak;
  state.counters["median_ms"] = median_step_ms(state, step);
  state.counters["peak_bytes"] = double(peak);
  state.counters["step_bytes"] = double(peak - before);
  state.counters["loss"] = loss;
}

BENCHMARK(BM_GPTStep)
    ->ArgName("recompute")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(25)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// W6: W3's step under bf16 autocast (Arg 1) beside W3 itself in f32 (Arg 0), in the same run: median step ms
// and the activation bytes (what the forward and the loss leave allocated for backward: activation_bytes).
void BM_AmpGPTStep(benchmark::State& state) {
  const bool bf16 = state.range(0) == 1;
  GPTSetup s;
  auto& [gpt, opt, g, tokens, targets] = s;
  double loss = 0;
  int64_t activation_bytes = 0;
  auto step = [&] {
    opt.zero_grad();
    const int64_t before = memory::stats().allocated.current;
    Tensor l;
    {
      amp::Autocast autocast(DType::BF16, bf16);
      l = F::cross_entropy(gpt->forward(tokens).view({-1, kVocab}), targets.view({-1}));
    }
    activation_bytes = memory::stats().allocated.current - before;
    l.backward();
    opt.step();
    loss = l.item<double>();
  };
  for (int i = 0; i < 5; ++i) step();
  if (!std::isfinite(loss)) return state.SkipWithError("the loss is not finite");
  state.counters["median_ms"] = median_step_ms(state, step);
  state.counters["activation_bytes"] = double(activation_bytes);
  state.counters["loss"] = loss;
}

BENCHMARK(BM_AmpGPTStep)
    ->ArgName("bf16")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(25)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The attention probabilities alone on W3's scores [32, 4, 64, 64]: fused (Arg 1) vs composite (Arg 0),
// forward and backward.
void BM_AttentionSoftmax(benchmark::State& state) {
  if (const std::string problem = check_fused(); !problem.empty())
    return state.SkipWithError(problem.c_str());
  const bool fused = state.range(0) == 1;
  Generator g(3);
  const Tensor x = randn({kBatch, 4, kContext, kContext}, {}, &g).requires_grad_();
  const Tensor dy = randn(x.shape(), {}, &g);
  for (auto _ : state) {
    const Tensor y = fused ? F::attention_scores_softmax(x, 0.125, true)
                           : F::attention_scores_softmax_composite(x, 0.125, true);
    y.backward(dy);
  }
}
BENCHMARK(BM_AttentionSoftmax)
    ->ArgName("fused")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
