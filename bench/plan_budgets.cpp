// W4 under memory budgets (issue: train to a memory budget): the plain step's peak, then for budgets of 0.3,
// 0.5 and 0.7 times it the plan memory::plan chooses, run for real under the budget as the arena's limit
// (measured peak and median step time), beside Chen's uniform sqrt(n) segments (6 layers each: W4r). One
// JSON line per configuration; the rounds alternate the configurations, so that the machine's drift falls on
// all of them alike.
//   build/bench/plan_budgets [rounds (3)] [steps (4)]
// W4: 32 x (Linear 1024 -> 1024, ReLU), batch 1024, MSE to a random target, SGD lr 1e-3 momentum 0.9 (as
// bench/workloads.cpp); for the planner, a chain of 8 blocks of 4 layers, any first m of them a recompute
// segment. (Keeping a block's GEMM results would keep everything its backward needs here: no selective form.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <frugal/frugal.h>

using namespace frugal;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kLayers = 32, kBlocks = 8, kWidth = 1024, kBatch = 1024;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// How a step runs: a plan's choice, or uniform segments of `uniform` layers (0: none).
struct RunShape {
  memory::PlanChoice plan;
  int uniform = 0;
};

struct Deep {
  std::vector<nn::Linear> layers;
  std::unique_ptr<optim::SGD> opt;
  Tensor x, target;

  explicit Deep(Device d) {
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

  // One step over the plan's micro-batches; the loss.
  double step(const RunShape& s) {
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
    opt->step();
    return loss;
  }
};

struct Result {
  std::vector<double> ms;
  int64_t peak = 0;
  double loss = 0;
};

// steps + 2 warm-up steps of a fresh model under `limit` (0: none): the median step and the arena's peak.
void run(const RunShape& s, int64_t limit, int steps, Result& r) {
  memory::empty_cache(kCPU);
  memory::reset_peak(kCPU);
  memory::set_memory_limit(kCPU, limit);
  {
    Deep deep(kCPU);
    for (int i = 0; i < steps + 2; ++i) {
      const Clock::time_point t = Clock::now();
      r.loss = deep.step(s);
      if (i >= 2) r.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
    }
  }
  r.peak = memory::stats(kCPU).allocated.peak;
  memory::set_memory_limit(kCPU, 0);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  const int steps = argc > 2 ? std::max(1, std::atoi(argv[2])) : 4;
  try {
    // Two steps (the second holds the momentum) of the model made on the dry run's device.
    auto dry = [](const RunShape& s) {
      return [s](Device d) {
        Deep deep(d);
        deep.step(s);
        deep.step(s);
      };
    };
    const int64_t plain = memory::estimate(dry(RunShape{})).peak_allocated;
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
    RunShape sqrt_n;
    sqrt_n.uniform = 6;
    add("sqrt_n", sqrt_n, 0, 0, "");
    for (double f : {0.3, 0.5, 0.7}) {
      const int64_t budget = int64_t(f * double(plain));
      const memory::Plan p =
          memory::plan([&](Device d, const memory::PlanChoice& c) { dry(RunShape{c})(d); }, budget,
                       memory::PlanSpace().blocks(kBlocks).micro_batches({1, 2, 4, 8}));
      char name[16];
      std::snprintf(name, sizeof name, "%.1fx", f);
      std::fprintf(stderr, "plan_budgets: W4 under %s (%lld bytes): %s\n", name,
                   static_cast<long long>(budget), p.str().c_str());
      if (p.fits) add(name, RunShape{p.choice}, budget, p.peak_allocated, p.str());
    }
    for (int r = 0; r < rounds; ++r)
      for (Config& c : configs) run(c.shape, c.budget, steps, c.result);
    const double base = median(configs.front().result.ms);
    for (const Config& c : configs) {
      const Result& r = c.result;
      std::printf(
          "{\"name\": \"W4 %s\", \"median_step_ms\": %.1f, \"time_ratio\": %.3f, \"peak_allocated_bytes\": "
          "%lld, \"budget\": %lld, \"planned_peak_bytes\": %lld, \"plan\": \"%s\", \"loss\": %.6f, "
          "\"steps\": %zu}\n",
          c.name.c_str(), median(r.ms), median(r.ms) / base, static_cast<long long>(r.peak),
          static_cast<long long>(c.budget), static_cast<long long>(c.planned_peak), c.plan.c_str(), r.loss,
          r.ms.size());
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "plan_budgets: %s\n", e.what());
    return 1;
  }
  return 0;
}
