// The reference workloads of shared/WORKLOADS.md in frugal, one JSON line each:
//   build/bench/workloads W1 W4 W4r      (none named: all that are built in)
// Figures: median step ms, peak arena bytes (exact, from the arena's statistics) and the process's peak RSS,
// plus each workload's quality figure. FRUGAL_BENCH_PROFILE=1 runs each workload under the profiler
// (core/profiler.h), FRUGAL_BENCH_HISTORY=1 under the memory history (core/memory_history.h), to measure what
// they cost beside a run without (what they recorded goes to stderr). bench/peers/torch_workloads.py prints
// the same lines for PyTorch; bench/compare.sh runs both alternately and tabulates the ratios.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "examples/fmnist.h"

using namespace frugal;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_maxrss) * 1024;
}

// Steps per run, from FRUGAL_BENCH_STEPS (for quick runs), else the workload's own count.
int64_t steps_or(int64_t dflt) {
  const char* s = std::getenv("FRUGAL_BENCH_STEPS");
  return s ? std::max<int64_t>(1, std::atoll(s)) : dflt;
}

// The seed of the weights and the data order, from FRUGAL_BENCH_SEED (to see the spread of a quality
// figure), else 0.
uint64_t seed() {
  const char* s = std::getenv("FRUGAL_BENCH_SEED");
  return s ? uint64_t(std::atoll(s)) : 0;
}

// W1 / W2: one epoch of the trainer's steps (shuffled, drop_last), then the test accuracy.
void fashion(const char* name, bool cnn) {
  manual_seed(seed());
  std::shared_ptr<data::FashionMNIST> train_set, test_set;
  {
    memory::Tag tag("dataset");
    train_set = std::make_shared<data::FashionMNIST>();
    test_set = std::make_shared<data::FashionMNIST>(std::string(data::kFashionMNISTRoot), data::Split::Test);
  }
  const int64_t batch = cnn ? 64 : 128;
  data::DataLoader train(
      train_set, data::DataLoaderOptions().batch_size(batch).shuffle(true).drop_last(true).seed(seed()));
  data::DataLoader test(test_set, data::DataLoaderOptions().batch_size(250));
  auto model = cnn ? fmnist::make_cnn() : fmnist::make_mlp();
  optim::Adam opt(model->parameters(), optim::AdamOptions(1e-3));
  memory::reset_peak();
  std::vector<double> step_ms;
  Clock::time_point t = Clock::now();
  const Clock::time_point t0 = t;
  fmnist::train_epoch(*model, opt, train, 0, steps_or(train.num_batches()), 1,
                      [&](int64_t, int64_t, const fmnist::StepResult&) {
                        step_ms.push_back(ms_since(t));
                        t = Clock::now();
                      });
  const double epoch_s = ms_since(t0) / 1000;
  const double accuracy = fmnist::evaluate(*model, test);
  std::printf(
      "{\"name\": \"%s\", \"median_step_ms\": %.4f, \"steps\": %zu, \"epoch_s\": %.3f, \"test_accuracy\": "
      "%.4f, "
      "\"peak_arena_bytes\": %lld, \"peak_rss_bytes\": %lld, \"threads\": %d}\n",
      name, median(step_ms), step_ms.size(), epoch_s, accuracy,
      static_cast<long long>(memory::stats().allocated.peak), static_cast<long long>(peak_rss_bytes()),
      num_threads());
}

// W4 / W4r / W4g / W4rg: 32 x (Linear 1024 -> 1024, ReLU), batch 1024, MSE to a random target, SGD lr 1e-3
// momentum 0.9; W4r runs segments of 6 layers (about sqrt(32)) as recompute segments; W4g steps in backward
// (optim::StepInBackward: each gradient freed once its update is done); W4rg does both.
void deep(const char* name, int recompute_every, bool step_in_backward = false) {
  manual_seed(0);
  nn::Sequential net;
  for (int i = 0; i < 32; ++i) {
    net->push_back(nn::Linear(1024, 1024));
    net->push_back(nn::ReLU());
  }
  if (recompute_every > 0) net->recompute_every(2 * recompute_every);
  optim::SGD opt(net->parameters(), optim::SGDOptions(1e-3).momentum(0.9));
  // W4g: each layer's update runs in backward as soon as its gradient is complete, which is then freed.
  std::unique_ptr<optim::StepInBackward> in_backward;
  if (step_in_backward) in_backward = std::make_unique<optim::StepInBackward>(opt);
  const Tensor x = randn({1024, 1024}), target = randn({1024, 1024});
  std::vector<double> step_ms;
  double loss = 0;
  int64_t kept = 0, step_peak = 0;
  const int64_t steps = steps_or(8);
  for (int64_t s = 0; s < steps + 2; ++s) {  // two warm-up steps
    const Clock::time_point t = Clock::now();
    opt.zero_grad();
    const int64_t base = memory::stats().allocated.current;  // parameters, momentum, data
    memory::reset_peak();
    Tensor l = nn::functional::mse_loss(net->forward(x), target);
    kept = memory::stats().allocated.current - base;  // what the forward keeps for backward
    l.backward();
    if (!step_in_backward) opt.step();
    if (s >= 2) step_ms.push_back(ms_since(t));
    loss = l.item<double>();
    // Activations, gradients and temporaries (after the warm-up, whose first step also creates the momentum).
    if (s >= 2) step_peak = std::max(step_peak, memory::stats().allocated.peak - base);
  }
  const double flops = 3.0 * 2.0 * 1024.0 * 1024.0 * 1024.0 * 32.0;  // forward + two backward GEMMs per layer
  std::printf(
      "{\"name\": \"%s\", \"median_step_ms\": %.3f, \"steps\": %zu, \"gflops\": %.1f, \"loss\": %.6f, "
      "\"activation_bytes\": %lld, \"peak_step_bytes\": %lld, \"peak_rss_bytes\": %lld, \"threads\": %d}\n",
      name, median(step_ms), step_ms.size(), flops / (median(step_ms) * 1e6), loss,
      static_cast<long long>(kept), static_cast<long long>(step_peak),
      static_cast<long long>(peak_rss_bytes()), num_threads());
}

// W3's training run (nn/gpt.h's GPT: 4 pre-norm blocks, d 128, 4 heads, context 64, on the fortunes corpus;
// batch 32 of random windows of the training split, AdamW lr 1e-3), one step at a time; with `bf16`, the
// forward and the loss run under bf16 autocast (W6). Two runs start from the same weights and see the same
// batches.
struct GPTRun {
  GPTRun(const data::TextDataset& text, bool bf16) : text(text), bf16(bf16) {
    manual_seed(0);
    model = nn::GPT(nn::GPTConfig{.vocab = text.vocab_size()});
    opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions(1e-3));
  }
  // One step: its batch, forward, backward, update; returns its ms.
  double step() {
    const Clock::time_point t = Clock::now();
    const data::Batch b = text.sample_batch(32, gen);
    opt->zero_grad();
    const int64_t before = memory::stats().allocated.current;
    Tensor l;
    {
      amp::Autocast autocast(DType::BF16, bf16);
      l = nn::functional::cross_entropy(model->forward(b.input).view({-1, text.vocab_size()}),
                                        b.target.view({-1}));
    }
    // What the forward and the loss keep for backward (the same every step).
    activation_bytes = memory::stats().allocated.current - before;
    l.backward();
    opt->step();
    loss = l.item<double>();
    return ms_since(t);
  }
  const data::TextDataset& text;
  bool bf16;
  nn::GPT model{nullptr};
  std::unique_ptr<optim::AdamW> opt;
  Generator gen{0};
  double loss = 0;
  int64_t activation_bytes = 0;
};

std::unique_ptr<data::TextDataset> fortunes() {
  memory::Tag tag("dataset");
  return std::make_unique<data::TextDataset>(data::TextDatasetOptions().context(64));
}

// W3: median step ms over the steps after 5 warm-up steps; the loss of the last step.
void gpt() {
  const auto text = fortunes();
  GPTRun run(*text, false);
  memory::reset_peak();
  std::vector<double> step_ms;
  const int64_t steps = steps_or(30);
  for (int64_t s = 0; s < steps + 5; ++s) {
    const double ms = run.step();
    if (s >= 5) step_ms.push_back(ms);
  }
  std::printf(
      "{\"name\": \"W3\", \"median_step_ms\": %.3f, \"steps\": %zu, \"loss\": %.6f, \"activation_bytes\": "
      "%lld, \"peak_arena_bytes\": %lld, \"peak_rss_bytes\": %lld, \"threads\": %d}\n",
      median(step_ms), step_ms.size(), run.loss, static_cast<long long>(run.activation_bytes),
      static_cast<long long>(memory::stats().allocated.peak), static_cast<long long>(peak_rss_bytes()),
      num_threads());
}

// W6: W3 under bf16 autocast beside W3 itself, stepped alternately in this process (so the ratios come from
// one run): 200 steps each by default (5 warm-up), the loss after the last. Its own figures (median step ms,
// activation bytes, loss) and W3's, and the ratios WORKLOADS.md asks for.
void gpt_bf16() {
  const auto text = fortunes();
  GPTRun f32(*text, false), bf16(*text, true);
  std::vector<double> f32_ms, bf16_ms;
  const int64_t steps = steps_or(195);
  for (int64_t s = 0; s < steps + 5; ++s) {
    const double a = bf16.step(), b = f32.step();
    if (s >= 5) {
      bf16_ms.push_back(a);
      f32_ms.push_back(b);
    }
  }
  const double ms = median(bf16_ms), w3_ms = median(f32_ms);
  std::printf(
      "{\"name\": \"W6\", \"median_step_ms\": %.3f, \"steps\": %zu, \"loss\": %.6f, \"activation_bytes\": "
      "%lld, \"W3_median_step_ms\": %.3f, \"W3_loss\": %.6f, \"W3_activation_bytes\": %lld, "
      "\"step_ms_ratio_to_W3\": %.4f, \"act_ratio_to_W3\": %.4f, \"loss_ratio_to_W3\": %.5f, "
      "\"peak_arena_bytes\": %lld, \"peak_rss_bytes\": %lld, \"threads\": %d}\n",
      ms, bf16_ms.size(), bf16.loss, static_cast<long long>(bf16.activation_bytes), w3_ms, f32.loss,
      static_cast<long long>(f32.activation_bytes), ms / w3_ms,
      double(bf16.activation_bytes) / double(f32.activation_bytes), bf16.loss / f32.loss,
      static_cast<long long>(memory::stats().allocated.peak), static_cast<long long>(peak_rss_bytes()),
      num_threads());
}

// W5: f32 GEMM 1024^3.
void gemm() {
  const Tensor a = randn({1024, 1024}), b = randn({1024, 1024});
  std::vector<double> ms;
  for (int i = 0; i < 23; ++i) {
    const Clock::time_point t = Clock::now();
    Tensor c = matmul(a, b);
    if (i >= 3) ms.push_back(ms_since(t));
  }
  std::printf("{\"name\": \"W5\", \"median_ms\": %.4f, \"gflops\": %.1f, \"threads\": %d}\n", median(ms),
              2.0 * 1024 * 1024 * 1024 / (median(ms) * 1e6), num_threads());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> names(argv + 1, argv + argc);
  if (names.empty()) names = {"W1", "W2", "W3", "W4", "W4r", "W5", "W6"};
  const bool profile = std::getenv("FRUGAL_BENCH_PROFILE") != nullptr,
             history = std::getenv("FRUGAL_BENCH_HISTORY") != nullptr;
  try {
    for (const std::string& n : names) {
      std::unique_ptr<profiler::Profile> p;
      std::unique_ptr<memory::History> h;
      if (profile) p = std::make_unique<profiler::Profile>();
      if (history) h = std::make_unique<memory::History>(kCPU);
      if (n == "W1")
        fashion("W1", false);
      else if (n == "W2")
        fashion("W2", true);
      else if (n == "W3")
        gpt();
      else if (n == "W4")
        deep("W4", 0);
      else if (n == "W4r")
        deep("W4r", 6);
      else if (n == "W4g")
        deep("W4g", 0, true);
      else if (n == "W4rg")
        deep("W4rg", 6, true);
      else if (n == "W5")
        gemm();
      else if (n == "W6")
        gpt_bf16();
      else {
        std::fprintf(stderr, "workloads: unknown workload '%s' (built in: W1 W2 W3 W4 W4r W4g W4rg W5 W6)\n",
                     n.c_str());
        return 1;
      }
      std::fflush(stdout);
      if (p) {
        p.reset();
        int64_t calls = 0;
        for (const profiler::OpStats& o : profiler::op_stats()) calls += o.calls;
        std::fprintf(stderr, "%s: profiled %lld op calls (%zu records kept)\n", n.c_str(),
                     static_cast<long long>(calls), profiler::records().size());
      }
      if (h) {
        h.reset();
        const memory::HistoryRecord r = memory::history(kCPU);
        std::fprintf(stderr, "%s: memory history of %zu events%s\n", n.c_str(), r.events.size(),
                     r.truncated ? " (full: recording stopped there)" : "");
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "workloads: %s\n", e.what());
    return 1;
  }
  return 0;
}
