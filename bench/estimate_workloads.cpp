// The dry run (core/estimate.h) on the reference workloads at full size: for each, the estimated peak of two
// training steps against the peak the same two steps reach for real, and the time the estimate takes per step
// against a real step's. One JSON line per workload:
//   build/bench/estimate_workloads W3 W4 W4r W6
// W1 and W2 are measured through their trainer (train_fmnist --estimate, tests/examples/test_flags.cpp),
// which also counts the dataset and the loader's queue.
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <frugal/frugal.h>

namespace {

using namespace frugal;
using Clock = std::chrono::steady_clock;

// W3: nn/gpt.h's GPT (4 blocks, d 128, 4 heads, context 64, the fortunes corpus' 114 bytes as vocabulary is
// taken as 114), batch 32, AdamW; W6: the same with the forward and the loss under bf16 autocast.
void gpt_steps(Device d, int steps, bool bf16 = false) {
  manual_seed(0);
  nn::GPT model(nn::GPTConfig{.vocab = 114});
  optim::AdamW opt(model->parameters(), optim::AdamWOptions(1e-3));
  for (int s = 0; s < steps; ++s) {
    const Tensor tokens = randint(0, 114, {32, 64}, TensorOptions(DType::I64).device(d));
    opt.zero_grad();
    Tensor loss;
    {
      amp::Autocast autocast(DType::BF16, bf16);
      loss = nn::functional::cross_entropy(model->forward(tokens).view({-1, 114}), tokens.view({-1}));
    }
    loss.backward();
    opt.step();
  }
}

// W4 / W4r: 32 x (Linear 1024 -> 1024, ReLU), batch 1024, MSE, SGD momentum; W4r recomputes 6-layer segments.
void deep_steps(Device d, int steps, bool recompute) {
  manual_seed(0);
  nn::Sequential net;
  for (int i = 0; i < 32; ++i) {
    net->push_back(nn::Linear(1024, 1024));
    net->push_back(nn::ReLU());
  }
  if (recompute) net->recompute_every(12);
  optim::SGD opt(net->parameters(), optim::SGDOptions(1e-3).momentum(0.9));
  const Tensor x = randn({1024, 1024}, d), target = randn({1024, 1024}, d);
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    nn::functional::mse_loss(net->forward(x), target).backward();
    opt.step();
  }
}

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

void measure(const char* name, const std::function<void(Device, int)>& steps) {
  constexpr int kSteps = 2;  // the second holds the optimizer's state
  memory::empty_cache(kCPU);
  const Clock::time_point t0 = Clock::now();
  const memory::Estimate e =
      memory::estimate([&](Device d) { steps(d, kSteps); }, memory::EstimateOptions().from(kCPU));
  const double estimate_ms = ms_since(t0);
  memory::reset_peak(kCPU);
  const Clock::time_point t1 = Clock::now();
  steps(kCPU, kSteps);
  const double real_ms = ms_since(t1);
  const int64_t measured = memory::stats(kCPU).allocated.peak;
  std::printf(
      "{\"name\": \"%s\", \"estimated_peak_bytes\": %lld, \"peak_allocated_bytes\": %lld, \"equal\": %s, "
      "\"estimate_ms\": %.2f, \"real_ms\": %.2f, \"estimate_over_real\": %.4f, \"threads\": %d}\n",
      name, static_cast<long long>(e.peak_allocated), static_cast<long long>(measured),
      e.peak_allocated == measured ? "true" : "false", estimate_ms, real_ms, estimate_ms / real_ms,
      num_threads());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> names(argv + 1, argv + argc);
  if (names.empty()) names = {"W3", "W4", "W4r", "W6"};
  try {
    for (const std::string& n : names) {
      if (n == "W3")
        measure("W3", [](Device d, int s) { gpt_steps(d, s); });
      else if (n == "W4")
        measure("W4", [](Device d, int s) { deep_steps(d, s, false); });
      else if (n == "W4r")
        measure("W4r", [](Device d, int s) { deep_steps(d, s, true); });
      else if (n == "W6")
        measure("W6", [](Device d, int s) { gpt_steps(d, s, true); });
      else {
        std::fprintf(stderr, "estimate_workloads: unknown workload '%s' (built in: W3 W4 W4r W6)\n",
                     n.c_str());
        return 1;
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "estimate_workloads: %s\n", e.what());
    return 1;
  }
  return 0;
}
