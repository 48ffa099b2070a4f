// Training under memory budgets (issue: train to a memory budget), for W4 and W3: the plain step's peak,
// then for budgets of 0.3, 0.5 and 0.7 times it the plan memory::plan chooses, run for real under the budget
// as the arena's limit (measured peak and median step time), beside uniform recompute (W4: Chen's sqrt(n),
// segments of 6 layers, W4r; W3: every block a segment). Where none of the budgets can be met, the lowest
// peak any plan reaches is tried as a budget of its own. One JSON line per configuration; the rounds
// alternate the configurations, so that the machine's drift falls on all of them alike.
//   build/bench/plan_budgets [W4|W3 (W4)] [rounds (3)] [steps (4)]
// Each line also has the configuration's state_bytes (parameters and optimizer state, alive between steps),
// step_peak_bytes (the largest peak of a step above what was alive before it) and peak_fraction, (state +
// step peak) over the plain run's: what bench/compare_budgets.sh compares with PyTorch's checkpointing,
// whose peaks it measures the same way (bench/peers/torch_workloads.py W3c).
// W4: 32 x (Linear 1024 -> 1024, ReLU), batch 1024, MSE to a random target, SGD lr 1e-3 momentum 0.9 (as
// bench/workloads.cpp); for the planner, a chain of 8 blocks of 4 layers, any first m of them a recompute
// segment, and the optimizer may step in backward. (Keeping a block's GEMM results would keep everything its
// backward needs here: no selective form.)
// W3: train_chargpt's run (examples/chargpt.h's Trainer: the GPT of 4 blocks on the fortunes corpus, batch
// 32, AdamW), planned as train_chargpt --memory-budget plans it (micro-batches, whole and selective blocks,
// stepping in backward), without the validation.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <frugal/frugal.h>

#include "examples/chargpt.h"

using namespace frugal;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kLayers = 32, kBlocks = 8, kWidth = 1024, kBatch = 1024;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// How a step runs: a plan's choice, or uniform segments of `uniform` layers or blocks (0: none).
struct RunShape {
  memory::PlanChoice plan;
  int uniform = 0;
};

// A fresh model and optimizer, stepped as its shape says.
struct Run {
  virtual ~Run() = default;
  virtual double step() = 0;  // one training step; its loss
  virtual int64_t state_bytes() const = 0;
};
using MakeRun = std::function<std::unique_ptr<Run>(const RunShape&, Device)>;

struct Deep final : Run {
  RunShape shape;
  std::vector<nn::Linear> layers;
  std::unique_ptr<optim::SGD> opt;
  Tensor x, target;

  Deep(const RunShape& s, Device d) : shape(s) {
    manual_seed(0);
    std::vector<Tensor> params;
    for (int i = 0; i < kLayers; ++i) {
      layers.emplace_back(kWidth, kWidth);
      for (const Tensor& p : layers.back()->parameters()) params.push_back(p);
    }
    opt = std::make_unique<optim::SGD>(params, optim::SGDOptions(1e-3).momentum(0.9));
    x = randn({kBatch, kWidth}, TensorOptions().device(d));
    target = randn({kBatch, kWidth}, TensorOptions().device(d));
  }

  // Layers [from, to) as nn::Sequential runs them (Linear + ReLU fused).
  Tensor run(Tensor h, int from, int to) const {
    for (int i = from; i < to; ++i)
      h = nn::functional::linear_relu(h, layers[size_t(i)]->weight, layers[size_t(i)]->bias);
    return h;
  }

  Tensor forward(const Tensor& in, const RunShape& s) const {
    const int every = s.uniform > 0 ? s.uniform : kLayers / kBlocks;
    const int segments = s.uniform > 0 ? kLayers : s.plan.recompute_blocks * every;
    Tensor h = in;
    for (int from = 0; from < kLayers; from += every) {
      const int to = std::min(kLayers, from + every);
      if (from < segments)
        h = autograd::recompute(
            [this, from, to](const std::vector<Tensor>& v) { return run(v[0], from, to); }, {h});
      else
        h = run(h, from, to);
    }
    return h;
  }

  // One step over the plan's micro-batches; the loss. Stepping in backward, backward() is the step.
  double step() override {
    const RunShape& s = shape;
    std::optional<optim::StepInBackward> in_backward;
    if (s.plan.step_in_backward) in_backward.emplace(*opt);
    opt->zero_grad();
    const int k = s.plan.micro_batches;
    const int64_t part = kBatch / k;
    double loss = 0;
    for (int m = 0; m < k; ++m) {
      Tensor l = nn::functional::mse_loss(forward(x.narrow(0, m * part, part), s),
                                          target.narrow(0, m * part, part)) /
                 double(k);
      l.backward();
      loss += memory::item_or(l, 0.0);
    }
    if (!in_backward) opt->step();
    return loss;
  }
  int64_t state_bytes() const override {
    int64_t n = opt->num_state_bytes();
    for (const nn::Linear& l : layers) n += l->parameter_bytes();
    return n;
  }
};

// W3 as train_chargpt trains it.
struct GPTRun final : Run {
  const data::TextDataset& text;
  chargpt::Trainer trainer;

  static chargpt::Options options(const RunShape& s) {
    chargpt::Options o;
    o.accum = s.plan.micro_batches;
    o.recompute = s.uniform > 0;
    o.recompute_blocks = s.plan.recompute_blocks;
    o.selective_blocks = s.plan.selective_blocks;
    o.step_in_backward = s.plan.step_in_backward;
    if (s.plan.low_precision) o.autocast = DType::BF16;
    return o;
  }
  GPTRun(const data::TextDataset& t, const RunShape& s) : text(t), trainer(options(s), t.vocab_size()) {}
  double step() override { return trainer.train_step(text); }
  int64_t state_bytes() const override {
    return trainer.model->parameter_bytes() + trainer.optimizer_state_bytes();
  }
};

struct Result {
  std::vector<double> ms;
  int64_t peak = 0, step_peak = 0, state = 0;
  double loss = 0;
};

// steps + 2 warm-up steps of a fresh run under `limit` (0: none): the median step, the arena's peak, the
// largest step peak above what was alive before the step.
void measure(const MakeRun& make, const RunShape& s, int64_t limit, int steps, Result& r) {
  memory::empty_cache(kCPU);
  memory::reset_peak(kCPU);
  memory::set_memory_limit(kCPU, limit);
  int64_t peak = 0;
  {
    const std::unique_ptr<Run> run = make(s, kCPU);
    for (int i = 0; i < steps + 2; ++i) {
      peak = std::max(peak, memory::stats(kCPU).allocated.peak);
      memory::reset_peak(kCPU);
      const int64_t before = memory::stats(kCPU).allocated.current;
      const Clock::time_point t = Clock::now();
      r.loss = run->step();
      if (i >= 2) r.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
      r.step_peak = std::max(r.step_peak, memory::stats(kCPU).allocated.peak - before);
    }
    r.state = run->state_bytes();
  }
  r.peak = std::max(peak, memory::stats(kCPU).allocated.peak);
  memory::set_memory_limit(kCPU, 0);
}

}  // namespace

int main(int argc, char** argv) {
  int arg = 1;
  std::string workload = "W4";
  if (argc > arg && (std::strcmp(argv[arg], "W4") == 0 || std::strcmp(argv[arg], "W3") == 0))
    workload = argv[arg++];
  const int rounds = argc > arg ? std::max(1, std::atoi(argv[arg])) : 3;
  const int steps = argc > arg + 1 ? std::max(1, std::atoi(argv[arg + 1])) : 4;
  try {
    const bool w3 = workload == "W3";
    std::unique_ptr<data::TextDataset> text;
    if (w3) {
      memory::Tag tag("dataset");
      text = std::make_unique<data::TextDataset>(data::TextDatasetOptions().context(64));
    }
    const MakeRun make = [&](const RunShape& s, Device d) -> std::unique_ptr<Run> {
      if (w3) return std::make_unique<GPTRun>(*text, s);
      return std::make_unique<Deep>(s, d);
    };
    // The dry run: W4's first two steps (the second holds the momentum), W3's three (as train_chargpt's),
    // of a run made on the dry run's device, starting from the arena as it is (W3's dataset in it).
    auto dry = [&](const RunShape& s) {
      return [&, s](Device d) {
        const std::unique_ptr<Run> run = make(s, d);
        for (int i = 0; i < (w3 ? 3 : 2); ++i) run->step();
      };
    };
    const memory::EstimateOptions from = memory::EstimateOptions().from(kCPU);
    const memory::Estimate e = memory::estimate(dry(RunShape{}), from);
    const int64_t plain = std::max(e.source_peak, e.peak_allocated);
    // One configuration: how it runs, under which limit (0: none), and what the plan said (0: no plan).
    struct Config {
      std::string name;
      RunShape shape;
      int64_t budget = 0, planned_peak = 0;
      std::string plan;
      Result result;
    };
    std::vector<Config> configs;
    auto add = [&](std::string name, RunShape shape, int64_t budget, int64_t planned_peak, std::string plan) {
      Config& c = configs.emplace_back();
      c.name = std::move(name);
      c.shape = shape;
      c.budget = budget;
      c.planned_peak = planned_peak;
      c.plan = std::move(plan);
    };
    add("plain", RunShape{}, 0, plain, "");
    RunShape uniform;
    uniform.uniform = w3 ? 1 : 6;
    add(w3 ? "every_block" : "sqrt_n", uniform, 0, 0, "");
    // Accumulation alone, what Note [the planner's cost model] prices at PlanCosts::micro_batch a
    // micro-batch.
    for (int k : {2, 4}) {
      RunShape micro;
      micro.plan.micro_batches = k;
      add("micro_batches_" + std::to_string(k), micro, 0, 0, "");
    }
    auto plan_for = [&](int64_t budget) {
      memory::PlanSpace space = memory::PlanSpace().step_in_backward(true).from(kCPU);
      if (w3)
        space.blocks(4).micro_batches({1, 2, 4, 8}).selective(true);
      else
        space.blocks(kBlocks).micro_batches({1, 2, 4, 8});
      return memory::plan([&](Device d, const memory::PlanChoice& c) { dry(RunShape{c})(d); }, budget, space);
    };
    // Named by the budget's fraction of the plain peak: "0.5x" for the three budgets, "0.79x" for a
    // floor.
    auto add_plan = [&](const memory::Plan& p, double f, const char* format) {
      char name[32];
      std::snprintf(name, sizeof name, format, f);
      std::fprintf(stderr,
                   "plan_budgets: %s under %s (%lld bytes): %s; counted costs: every block recomputed "
                   "+%.3f, selectively +%.3f, a micro-batch more +%.3f\n",
                   workload.c_str(), name, static_cast<long long>(p.budget), p.str().c_str(),
                   p.costs.recompute, p.costs.selective, p.costs.micro_batch);
      if (p.fits) add(name, RunShape{p.choice}, p.budget, p.peak_allocated, p.str());
      return p;
    };
    memory::Plan lowest;
    for (double f : {0.3, 0.5, 0.7}) lowest = add_plan(plan_for(int64_t(f * double(plain))), f, "%.1fx");
    // Where no plan fits the budgets above: the lowest peak any plan reaches, as a budget of its own (its
    // reserved peak rounded up to a MiB), run for real too.
    if (!lowest.fits) {
      const int64_t floor = (lowest.peak_reserved + (int64_t(1) << 20) - 1) >> 20 << 20;
      add_plan(plan_for(floor), double(floor) / double(plain), "%.2fx");
    }
    for (int r = 0; r < rounds; ++r)
      for (Config& c : configs) measure(make, c.shape, c.budget, steps, c.result);
    const double base = median(configs.front().result.ms);
    const Result& p0 = configs.front().result;
    for (const Config& c : configs) {
      const Result& r = c.result;
      std::printf(
          "{\"name\": \"%s %s\", \"median_step_ms\": %.1f, \"time_ratio\": %.3f, \"peak_allocated_bytes\": "
          "%lld, \"budget\": %lld, \"planned_peak_bytes\": %lld, \"plan\": \"%s\", \"loss\": %.6f, "
          "\"steps\": %zu, \"state_bytes\": %lld, \"step_peak_bytes\": %lld, \"peak_fraction\": %.4f}\n",
          workload.c_str(), c.name.c_str(), median(r.ms), median(r.ms) / base, static_cast<long long>(r.peak),
          static_cast<long long>(c.budget), static_cast<long long>(c.planned_peak), c.plan.c_str(), r.loss,
          r.ms.size(), static_cast<long long>(r.state), static_cast<long long>(r.step_peak),
          double(r.state + r.step_peak) / double(p0.state + p0.step_peak));
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "plan_budgets: %s\n", e.what());
    return 1;
  }
  return 0;
}
