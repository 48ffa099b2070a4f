// The reference workloads of shared/WORKLOADS.md in frugal, one JSON line each:
//   build/bench/workloads W1 W4 W4r      (none named: W1 W2 W3 W4 W4r W5 W6)
//   build/bench/workloads --peak-gflops=222 --peak-bf16-gflops=418 W5 W5b   (with the ceilings: fractions)
// Figures: median step ms, peak arena bytes (exact, from the arena's statistics) and the process's peak RSS,
// plus each workload's quality figure. FRUGAL_BENCH_PROFILE=1 runs each workload under the profiler
// (core/profiler.h), FRUGAL_BENCH_HISTORY=1 under the memory history (core/memory_history.h), to measure what
// they cost beside a run without (what they recorded goes to stderr). bench/peers/torch_workloads.py prints
// the same lines for PyTorch; bench/compare.sh runs both alternately and tabulates the ratios.
#include <immintrin.h>
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

// The machine's compute ceilings in GFLOP/s (shared/WORKLOADS.md: measured by fma-peak.sh on the same machine
// at the same time), from --peak-gflops=F32 and --peak-bf16-gflops=BF16 or FRUGAL_PEAK_GFLOPS and
// FRUGAL_PEAK_BF16_GFLOPS (either may be "measure": ceiling_arg); 0 when not given. With one, every
// GEMM-bound line gains "ceiling_fraction".
double peak_f32 = 0, peak_bf16 = 0;

// `, "ceiling_fraction": x` for a rate against a ceiling, or nothing without a ceiling.
std::string ceiling_field(double gflops, double peak) {
  if (peak <= 0) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, ", \"ceiling_fraction\": %.3f", gflops / peak);
  return buf;
}

// W4 / W4r / W4g / W4rg / W4b: 32 x (Linear 1024 -> 1024, ReLU), batch 1024, MSE to a random target, SGD lr
// 1e-3 momentum 0.9; W4r runs segments of 6 layers (about sqrt(32)) as recompute segments; W4g steps in
// backward (optim::StepInBackward: each gradient freed once its update is done); W4rg does both; W4b runs the
// forward and the loss under bf16 autocast. Every run starts from the same weights, input and target.
struct DeepRun {
  DeepRun(int recompute_every, bool step_in_backward, bool bf16) : bf16(bf16) {
    manual_seed(0);
    for (int i = 0; i < 32; ++i) {
      net->push_back(nn::Linear(1024, 1024));
      net->push_back(nn::ReLU());
    }
    if (recompute_every > 0) net->recompute_every(2 * recompute_every);
    opt = std::make_unique<optim::SGD>(net->parameters(), optim::SGDOptions(1e-3).momentum(0.9));
    // W4g: each layer's update runs in backward as soon as its gradient is complete, which is then freed.
    if (step_in_backward) in_backward = std::make_unique<optim::StepInBackward>(*opt);
    x = randn({1024, 1024});
    target = randn({1024, 1024});
  }
  // One step; returns its ms. With `measure`, the peak of the step's own bytes counts.
  double step(bool measure) {
    const Clock::time_point t = Clock::now();
    opt->zero_grad();
    const int64_t base = memory::stats().allocated.current;  // parameters, momentum, data
    memory::reset_peak();
    Tensor l;
    {
      amp::Autocast autocast(DType::BF16, bf16);
      l = nn::functional::mse_loss(net->forward(x), target);
    }
    kept = memory::stats().allocated.current - base;  // what the forward keeps for backward
    l.backward();
    if (!in_backward) opt->step();
    const double ms = ms_since(t);
    loss = l.item<double>();
    // Activations, gradients and temporaries (after the warm-up, whose first step also creates the momentum).
    if (measure) step_peak = std::max(step_peak, memory::stats().allocated.peak - base);
    return ms;
  }
  bool bf16;
  nn::Sequential net;
  std::unique_ptr<optim::SGD> opt;
  std::unique_ptr<optim::StepInBackward> in_backward;
  Tensor x, target;
  double loss = 0;
  int64_t kept = 0, step_peak = 0;
};

constexpr double kDeepFlops =
    3.0 * 2.0 * 1024.0 * 1024.0 * 1024.0 * 32.0;  // forward + two backward GEMMs a layer

void deep(const char* name, int recompute_every, bool step_in_backward = false) {
  DeepRun run(recompute_every, step_in_backward, false);
  std::vector<double> step_ms;
  const int64_t steps = steps_or(8);
  for (int64_t s = 0; s < steps + 2; ++s) {  // two warm-up steps
    const double ms = run.step(s >= 2);
    if (s >= 2) step_ms.push_back(ms);
  }
  const double gflops = kDeepFlops / (median(step_ms) * 1e6);
  std::printf(
      "{\"name\": \"%s\", \"median_step_ms\": %.3f, \"steps\": %zu, \"gflops\": %.1f%s, \"loss\": %.6f, "
      "\"activation_bytes\": %lld, \"peak_step_bytes\": %lld, \"peak_rss_bytes\": %lld, \"threads\": %d}\n",
      name, median(step_ms), step_ms.size(), gflops, ceiling_field(gflops, peak_f32).c_str(), run.loss,
      static_cast<long long>(run.kept), static_cast<long long>(run.step_peak),
      static_cast<long long>(peak_rss_bytes()), num_threads());
}

// W4b: W4 under bf16 autocast beside W4 itself, stepped alternately in this process (so the ratios come from
// one run): 20 steps each by default (the first 2 not timed), the loss after the last. Its GFLOP/s are W4's
// FLOPs over its time, against the bf16 dot-product ceiling.
void deep_bf16() {
  DeepRun f32(0, false, false), bf16(0, false, true);
  std::vector<double> f32_ms, bf16_ms;
  const int64_t steps = steps_or(18);
  for (int64_t s = 0; s < steps + 2; ++s) {
    const double a = bf16.step(s >= 2), b = f32.step(s >= 2);
    if (s >= 2) {
      bf16_ms.push_back(a);
      f32_ms.push_back(b);
    }
  }
  const double ms = median(bf16_ms), w4_ms = median(f32_ms), gflops = kDeepFlops / (ms * 1e6);
  std::printf(
      "{\"name\": \"W4b\", \"median_step_ms\": %.3f, \"steps\": %zu, \"gflops\": %.1f%s, \"loss\": %.6f, "
      "\"activation_bytes\": %lld, \"peak_step_bytes\": %lld, \"W4_median_step_ms\": %.3f, \"W4_loss\": "
      "%.6f, "
      "\"W4_activation_bytes\": %lld, \"step_ms_ratio_to_W4\": %.4f, \"act_ratio_to_W4\": %.4f, "
      "\"loss_ratio_to_W4\": %.5f, \"peak_rss_bytes\": %lld, \"threads\": %d}\n",
      ms, bf16_ms.size(), gflops, ceiling_field(gflops, peak_bf16).c_str(), bf16.loss,
      static_cast<long long>(bf16.kept), static_cast<long long>(bf16.step_peak), w4_ms, f32.loss,
      static_cast<long long>(f32.kept), ms / w4_ms, double(bf16.kept) / double(f32.kept),
      bf16.loss / f32.loss, static_cast<long long>(peak_rss_bytes()), num_threads());
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

// W5: f32 GEMM 1024^3; W5b: the same in bf16 (f32 accumulation inside the GEMM, a bf16 result).
void gemm(bool bf16) {
  const DType dtype = bf16 ? DType::BF16 : DType::F32;
  const Tensor a = randn({1024, 1024}).to(dtype), b = randn({1024, 1024}).to(dtype);
  std::vector<double> ms;
  for (int i = 0; i < 23; ++i) {
    const Clock::time_point t = Clock::now();
    Tensor c = matmul(a, b);
    if (i >= 3) ms.push_back(ms_since(t));
  }
  const double gflops = 2.0 * 1024 * 1024 * 1024 / (median(ms) * 1e6);
  std::printf("{\"name\": \"%s\", \"median_ms\": %.4f, \"gflops\": %.1f%s, \"threads\": %d}\n",
              bf16 ? "W5b" : "W5", median(ms), gflops,
              ceiling_field(gflops, bf16 ? peak_bf16 : peak_f32).c_str(), num_threads());
}

// gemms: each GEMM of W1's, W3's and W4's training steps on its own, in the three layouts a Linear runs
// (forward x·Wᵀ + b, dX = g·W, dW = gᵀ·x), through the ops the autograd calls (ops::linear,
// ops::linear_backward), and W4's layer on a quarter of its batch (W4.micro4: the step in 4 micro-batches, as
// the planner may choose it): one line each, named "W1.fc1.forward" and so on, with the GEMM's m, k, n
// (C[m,n] = A[m,k]·B[k,n]), its GFLOP/s (and fraction of the f32 ceiling, given one). gemms-bf16: the same in
// bf16 (as under autocast: W4b, W6), against the bf16 ceiling. Not a workload of the peers
// (bench/compare.sh); W1's first layer's dX is listed though its step skips it.
void gemm_shapes(DType dtype) {
  struct Layer {
    const char* name;
    int64_t m, in, out;
  };
  const int64_t vocab = fortunes()->vocab_size(), tokens = 32 * 64, d = 128;
  const Layer layers[] = {{"W1.fc1", 128, 784, 256},        {"W1.fc2", 128, 256, 256},
                          {"W1.fc3", 128, 256, 10},         {"W3.qkv", tokens, d, 3 * d},
                          {"W3.proj", tokens, d, d},        {"W3.fc", tokens, d, 4 * d},
                          {"W3.fc_proj", tokens, 4 * d, d}, {"W3.head", tokens, d, vocab},
                          {"W4.linear", 1024, 1024, 1024},  {"W4.micro4", 256, 1024, 1024}};
  for (const Layer& l : layers) {
    const Tensor x = randn({l.m, l.in}).to(dtype), w = randn({l.out, l.in}).to(dtype),
                 b = randn({l.out}).to(dtype), g = randn({l.m, l.out}).to(dtype);
    const double flops = 2.0 * double(l.m) * double(l.in) * double(l.out);
    // Calls per sample: enough for about 20 MFLOP, so that the clock's resolution does not count.
    const int64_t calls = std::max<int64_t>(1, int64_t(2e7 / flops));
    for (const char* layout : {"forward", "dX", "dW"}) {
      const std::string lay = layout;
      std::vector<double> us;
      for (int i = 0; i < 13; ++i) {
        const Clock::time_point t = Clock::now();
        for (int64_t c = 0; c < calls; ++c) {
          if (lay == "forward")
            ops::linear(x, w, b);
          else
            ops::linear_backward(g, x, w, lay == "dX", lay == "dW", false);
        }
        if (i >= 3) us.push_back(ms_since(t) * 1000 / double(calls));
      }
      const double gflops = flops / (median(us) * 1e3);
      std::printf(
          "{\"name\": \"%s.%s\", \"m\": %lld, \"k\": %lld, \"n\": %lld, \"median_us\": %.2f, "
          "\"gflops\": %.1f%s, \"threads\": %d}\n",
          l.name, layout, static_cast<long long>(lay == "dW" ? l.out : l.m),
          static_cast<long long>(lay == "dW"   ? l.m
                                 : lay == "dX" ? l.out
                                               : l.in),
          static_cast<long long>(lay == "forward" ? l.out : l.in), median(us), gflops,
          ceiling_field(gflops, dtype == DType::BF16 ? peak_bf16 : peak_f32).c_str(), num_threads());
    }
  }
}

// A ceiling from `--flag=X` in the arguments (which it removes) or else the environment variable `env`.
// The f32 FMA ceiling in GFLOP/s of the widest vectors this build targets, on the library's threads: each
// thread runs kChains independent chains of FMAs (more than the FMA units' latency x their count, so that
// they stay busy); the best of 3 runs. What fma-peak.sh measures, for a machine where it cannot run (it
// needs AVX-512: on a Zen 3 it stops with SIGILL). Written by hand: no Debian package measures this.
double measure_f32_ceiling() {
#if defined(__AVX512F__)
  using Vec = __m512;
  constexpr int kLanes = 16;
  auto fma = [](Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); };
  auto splat = [](float x) { return _mm512_set1_ps(x); };
  auto sum = [](Vec v) {  // not _mm512_reduce_add_ps, whose header GCC 12 warns about (-Wuninitialized)
    alignas(64) float f[16];
    _mm512_store_ps(f, v);
    float r = 0;
    for (float x : f) r += x;
    return r;
  };
#elif defined(__AVX2__) && defined(__FMA__)
  using Vec = __m256;
  constexpr int kLanes = 8;
  auto fma = [](Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); };
  auto splat = [](float x) { return _mm256_set1_ps(x); };
  auto sum = [](Vec v) {
    alignas(32) float f[8];
    _mm256_store_ps(f, v);
    return f[0] + f[1] + f[2] + f[3] + f[4] + f[5] + f[6] + f[7];
  };
#else
  return 0;  // no vector FMA in this build: no ceiling
#endif
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  constexpr int kChains = 12;
  constexpr int64_t kIterations = 400'000'000;  // about 0.1 s a run on one core
  const int threads = num_threads();
  double best = 0;
  for (int run = 0; run < 3; ++run) {
    float total = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      Vec acc[kChains];
      for (int c = 0; c < kChains; ++c) acc[c] = splat(float(c));
      const Vec a = splat(0.999999f), b = splat(1e-7f);
      for (int64_t i = 0; i < kIterations / kChains; ++i)
        for (int c = 0; c < kChains; ++c) acc[c] = fma(acc[c], a, b);
      for (int c = 0; c < kChains; ++c) total += sum(acc[c]);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!(total == total)) std::fprintf(stderr, "ceiling: NaN\n");  // keeps the chains' results alive
    best = std::max(best, 2.0 * kLanes * double(kIterations / kChains * kChains) * threads / s / 1e9);
  }
  return best;
#endif
}

// A ceiling from `flag`=GFLOPS or the environment variable `env`; "measure" measures the f32 one here
// (measure_f32_ceiling), which also stands for bf16 on a CPU without a bf16 dot-product instruction, where
// a bf16 GEMM runs on the f32 FMAs. 0: none.
double ceiling_arg(std::vector<std::string>& args, const std::string& flag, const char* env) {
  std::string text;
  if (const char* e = std::getenv(env)) text = e;
  for (auto it = args.begin(); it != args.end();) {
    if (it->rfind(flag + "=", 0) == 0) {
      text = it->substr(flag.size() + 1);
      it = args.erase(it);
    } else {
      ++it;
    }
  }
  if (text != "measure") return std::atof(text.c_str());
#if defined(__AVX512BF16__)
  if (flag == "--peak-bf16-gflops") {
    std::fprintf(stderr, "%s=measure: this CPU has a bf16 dot product; give the rate fma-peak.sh measures\n",
                 flag.c_str());
    std::exit(2);
  }
#endif
  static const double v = measure_f32_ceiling();  // once, for both flags
  // On stderr: every line of stdout is a workload's record (bench/compare_table.py reads them).
  std::fprintf(stderr, "{\"ceiling\": \"%s\", \"f32_fma_gflops\": %.1f, \"threads\": %d}\n", flag.c_str(), v,
               num_threads());
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> names(argv + 1, argv + argc);
  peak_f32 = ceiling_arg(names, "--peak-gflops", "FRUGAL_PEAK_GFLOPS");
  peak_bf16 = ceiling_arg(names, "--peak-bf16-gflops", "FRUGAL_PEAK_BF16_GFLOPS");
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
      else if (n == "W4b")
        deep_bf16();
      else if (n == "W5")
        gemm(false);
      else if (n == "W5b")
        gemm(true);
      else if (n == "W6")
        gpt_bf16();
      else if (n == "gemms")
        gemm_shapes(DType::F32);
      else if (n == "gemms-bf16")
        gemm_shapes(DType::BF16);
      else {
        std::fprintf(stderr,
                     "workloads: unknown workload '%s' (built in: W1 W2 W3 W4 W4r W4g W4rg W4b W5 W5b W6 "
                     "gemms gemms-bf16)\n",
                     n.c_str());
        return 1;
      }
      std::fflush(stdout);
      if (p) {
        p.reset();
        int64_t calls = 0;
        for (const profiler::OpStats& o : profiler::op_stats()) calls += o.calls;
        std::fprintf(stderr, "%s: profiled %lld op calls (%zu records kept)\n%s", n.c_str(),
                     static_cast<long long>(calls), profiler::records().size(), profiler::summary().c_str());
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
