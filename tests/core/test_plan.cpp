// memory::plan (core/plan.h): under a budget it picks the fewest recomputed blocks and micro-batches that
// fit, the dry run's peak is the real run's, the real run stays under the budget, and the gradients keep
// their meaning (bit-identical with recompute alone, equal to f32 rounding with accumulation).
#include <optional>
#include <vector>

#include "tests/test_util.h"

namespace frugal {
namespace {

namespace F = nn::functional;

constexpr int kBlocks = 4;
constexpr int64_t kBatch = 16;

// W3's GPT at half its batch (its peak tens of MiB, well above the arena's 2 MiB segments), one step as the
// plan shapes it; the parameters after the step are returned (on the cpu).
std::vector<Tensor> gpt_step(Device d, const memory::PlanChoice& c) {
  manual_seed(11);
  nn::GPT model(nn::GPTConfig{.vocab = 64, .d_model = 128, .n_layers = kBlocks, .n_heads = 4, .context = 64});
  model->recompute_blocks(c.recompute_blocks, c.selective_blocks);
  optim::SGD opt(model->parameters(), optim::SGDOptions(0.1));
  std::vector<int64_t> ids(size_t(kBatch * 64));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i * 7 % 64);
  const Tensor tokens = tensor(ids, {kBatch, 64}).to(d);
  opt.zero_grad();
  const int64_t micro = kBatch / c.micro_batches;
  for (int k = 0; k < c.micro_batches; ++k) {
    const Tensor part = tokens.narrow(0, k * micro, micro);
    std::optional<amp::Autocast> autocast;
    if (c.low_precision) autocast.emplace(DType::BF16);
    Tensor loss =
        F::cross_entropy(model->forward(part).view({-1, 64}), part.view({-1})) / double(c.micro_batches);
    autocast.reset();
    loss.backward();
  }
  opt.step();
  std::vector<Tensor> out;
  if (!d.is_meta())
    for (const Tensor& p : model->parameters()) out.push_back(p.detach());  // no copy: the step's own bytes
  return out;
}

// The real run of plan p under the budget as the arena's limit: it fits, peaks at the dry run's figure, and
// leaves the parameters the plain run leaves: bit for bit with recompute and stepping in backward, within f32
// rounding with micro-batches (the sum's order changes).
void expect_real_run_as_planned(std::vector<Tensor> (*step)(Device, const memory::PlanChoice&),
                                const memory::Plan& p, int64_t budget) {
  memory::empty_cache(kCPU);
  memory::reset_peak(kCPU);
  memory::set_memory_limit(kCPU, budget);
  std::vector<Tensor> planned;
  EXPECT_NO_THROW(planned = step(kCPU, p.choice));
  memory::set_memory_limit(kCPU, 0);
  EXPECT_EQ(memory::stats(kCPU).allocated.peak, p.peak_allocated);
  const std::vector<Tensor> reference = step(kCPU, {});
  ASSERT_EQ(planned.size(), reference.size());
  for (size_t i = 0; i < planned.size(); ++i) {
    const std::vector<double> got = planned[i].to_vector<double>(), want = reference[i].to_vector<double>();
    if (p.choice.micro_batches == 1)
      EXPECT_EQ(got, want) << "parameter " << i;
    else
      testing::expect_close(got, want, {1e-6, 1e-5}, "parameter");
  }
  memory::empty_cache(kCPU);
}

int64_t plain_peak() {
  return memory::estimate([](Device d) { gpt_step(d, {}); }).peak_allocated;
}

TEST(Plan, WithRoomToSpareItChangesNothing) {
  const memory::Plan p =
      memory::plan([](Device d, const memory::PlanChoice& c) { gpt_step(d, c); }, 4 * plain_peak(),
                   memory::PlanSpace().blocks(kBlocks).micro_batches({1, 2, 4}));
  ASSERT_TRUE(p.fits) << p.str();
  EXPECT_EQ(p.choice.micro_batches, 1);
  EXPECT_EQ(p.choice.recompute_blocks, 0);
  EXPECT_FALSE(p.choice.low_precision);
  EXPECT_DOUBLE_EQ(p.relative_time, 1.0);
  EXPECT_NE(p.str().find("recompute 0 of 4 blocks"), std::string::npos) << p.str();
}

// With low precision allowed, bf16 autocast is priced at the device's factor (memory::low_precision_time:
// for a CPU build with bf16 dot products their flops' time over the f32 FMA's, measured once per process;
// 1.1 for one without). Under a budget that the plain f32 step misses but the plain bf16 step and f32 in
// micro-batches both meet, bf16 is chosen exactly where its factor beats the best f32 plan's time; with room
// to spare, exactly where it is below 1.
TEST(Plan, LowPrecisionIsPricedAtTheDevicesFactor) {
  const double factor = memory::low_precision_time(kCPU);
#if defined(__AVX512BF16__)
  // A dot product's two multiply-adds a lane cost neither less than a quarter of an FMA's nor 8 of them on
  // any processor with both (Note [the low-precision factor]); the factor is measured once.
  EXPECT_GT(factor, 0.125);
  EXPECT_LT(factor, 4.0);
  EXPECT_EQ(memory::low_precision_time(kCPU), factor);
#else
  EXPECT_EQ(factor, 1.1);
#endif
  EXPECT_EQ(memory::low_precision_time(cuda(0)), 1.0);
  auto step = [](Device d, const memory::PlanChoice& c) { gpt_step(d, c); };
  // The least whole MiB under which both fit (as the arena's limit, as the planner tries them).
  auto fits = [&](memory::PlanChoice c, int64_t limit) {
    return memory::estimate([&](Device d) { step(d, c); }, memory::EstimateOptions().limit(limit)).fits();
  };
  auto allocated = [&](memory::PlanChoice c) {
    return memory::estimate([&](Device d) { step(d, c); }).peak_allocated;
  };
  const memory::PlanChoice bf16{.low_precision = true}, halves{.micro_batches = 2};
  int64_t budget = (std::max(allocated(bf16), allocated(halves)) >> 20) << 20;
  while (!(fits(bf16, budget) && fits(halves, budget))) budget += int64_t(1) << 20;
  ASSERT_FALSE(fits({}, budget)) << "the plain f32 step must miss the budget of " << budget << " bytes";
  const memory::PlanSpace space = memory::PlanSpace().blocks(kBlocks).micro_batches({1, 2});
  const memory::Plan in_f32 = memory::plan(step, budget, space);
  const memory::Plan any = memory::plan(step, budget, memory::PlanSpace(space).low_precision(true));
  ASSERT_TRUE(in_f32.fits && any.fits) << in_f32.str() << "; " << any.str();
  EXPECT_FALSE(in_f32.choice.low_precision);
  EXPECT_GT(in_f32.relative_time, 1.0) << in_f32.str();
  EXPECT_EQ(any.costs.low_precision, factor);
  EXPECT_EQ(any.choice.low_precision, factor < in_f32.relative_time) << any.str();
  EXPECT_DOUBLE_EQ(any.relative_time, std::min(factor, in_f32.relative_time)) << any.str();
  const memory::Plan roomy =
      memory::plan(step, 4 * allocated({}), memory::PlanSpace(space).low_precision(true));
  EXPECT_EQ(roomy.choice.low_precision, factor < 1) << roomy.str();
  EXPECT_DOUBLE_EQ(roomy.relative_time, std::min(factor, 1.0)) << roomy.str();
}

// Note [the planner's cost model]: the coefficients are the step's own. The GPT's forward is about a third
// of its step and its micro-batches repeat little; a chain of tiny layers is all kernel calls, so each
// micro-batch repeats most of the step; wide layers on a short batch are mostly their weights' bytes, which
// each micro-batch's products read again.
TEST(Plan, ItsCostsAreTheStepsOwn) {
  const memory::Plan gpt =
      memory::plan([](Device d, const memory::PlanChoice& c) { gpt_step(d, c); }, int64_t(1) << 40,
                   memory::PlanSpace().blocks(kBlocks).micro_batches({1, 2}));
  EXPECT_GT(gpt.costs.recompute, 0.2);
  EXPECT_LT(gpt.costs.recompute, 0.6);
  EXPECT_LT(gpt.costs.micro_batch, 0.1);
  EXPECT_GT(gpt.costs.plain_seconds, 0);
  auto tiny_step = [](Device d, const memory::PlanChoice& c) {
    manual_seed(5);
    nn::Sequential net;
    for (int i = 0; i < 20; ++i) net->push_back(nn::Linear(8, 8));
    if (c.recompute_blocks > 0) net->recompute_every(5);
    optim::SGD opt(net->parameters(), optim::SGDOptions(0.1));
    const Tensor x = empty({8, 8}, TensorOptions().device(d));
    for (int k = 0; k < c.micro_batches; ++k)
      net->forward(x.narrow(0, k * (8 / c.micro_batches), 8 / c.micro_batches)).sum().backward();
    opt.step();
  };
  const memory::Plan tiny =
      memory::plan(tiny_step, int64_t(1) << 40, memory::PlanSpace().blocks(4).micro_batches({1, 2}));
  EXPECT_GT(tiny.costs.micro_batch, 0.3);  // the model's building and the optimizer's step are not repeated
  EXPECT_GT(tiny.costs.micro_batch, 5 * gpt.costs.micro_batch);
  // Plain, every block and 2 micro-batches without the budget; then, for each micro-batch count, candidates
  // until one fits (the first does).
  EXPECT_EQ(tiny.dry_runs, 3 + 2);
  // Each of the four counts at its rate.
  memory::Estimate e;
  e.flops = 3e9;
  e.kernel_calls = 1000;
  e.bytes_allocated = 2'000'000'000;
  e.operand_bytes = 5e8;
  EXPECT_DOUBLE_EQ(
      memory::predicted_seconds(e),
      3e9 / memory::kFlopsPerSecond + 1000 * memory::kSecondsPerKernel + 2.5e9 / memory::kBytesPerSecond);
}

TEST(Plan, UnderABudgetTheRealRunFitsAndPeaksWhereTheDryRunSaid) {
  const int64_t plain = plain_peak();
  double without_selective = 0;
  for (const auto& [micro, selective] :
       {std::pair{std::vector<int>{1}, false}, std::pair{std::vector<int>{1, 2, 4}, false},
        std::pair{std::vector<int>{1}, true}}) {
    SCOPED_TRACE(::testing::Message() << micro.size() << " micro-batch counts, selective " << selective);
    // 0.7 of the plain peak: with recompute alone the GPT's blocks (which keep only their GEMMs' inputs)
    // reach about 0.6.
    const int64_t budget = plain * 7 / 10;
    const memory::Plan p =
        memory::plan([](Device d, const memory::PlanChoice& c) { gpt_step(d, c); }, budget,
                     memory::PlanSpace().blocks(kBlocks).micro_batches(micro).selective(selective));
    ASSERT_TRUE(p.fits) << p.str();
    if (micro.size() == 1 && !selective) without_selective = p.relative_time;
    if (selective) {
      // Blocks that keep their GEMMs cost less to recompute: the plan is no slower than without them. (It
      // need not use them: the GPT's blocks keep only their GEMMs' inputs, so one that keeps its GEMMs'
      // results keeps a little more than a plain one.)
      EXPECT_LE(p.relative_time, without_selective) << p.str();
      // Every candidate predicted faster does not fit (the search is exhaustive over the chain).
      for (int m = 0; m <= kBlocks; ++m)
        for (int s = 0; m + s <= kBlocks; ++s) {
          const double t = 1 + p.costs.recompute * m / kBlocks + p.costs.selective * s / kBlocks;
          if (t >= p.relative_time) continue;
          const memory::PlanChoice faster{1, m, false, s};
          EXPECT_FALSE(memory::estimate([&](Device d) { gpt_step(d, faster); },
                                        memory::EstimateOptions().limit(budget))
                           .fits())
              << m << " whole, " << s << " selective";
        }
    }
    EXPECT_LE(p.peak_reserved, budget);
    EXPECT_GT(p.relative_time, 1.0);
    EXPECT_GE(p.dry_runs, 2);
    // Nothing cheaper fits: one block fewer recomputed (with the same micro-batches) does not.
    if (p.choice.recompute_blocks > 0 && p.choice.selective_blocks == 0) {
      memory::PlanChoice fewer = p.choice;
      --fewer.recompute_blocks;
      EXPECT_FALSE(
          memory::estimate([&](Device d) { gpt_step(d, fewer); }, memory::EstimateOptions().limit(budget))
              .fits());
    }
    // The real run under the budget as its limit (nothing else allocated): as planned.
    memory::empty_cache(kCPU);
    ASSERT_EQ(memory::stats(kCPU).allocated.current, 0);
    expect_real_run_as_planned(gpt_step, p, budget);
  }
}

// A chain of 4 blocks whose pointwise ops keep more than its GEMMs: linear, then tanh, sigmoid and a
// product (each keeping a tensor of the hidden width), then linear. The first recompute_blocks run as
// segments that keep nothing, the next selective_blocks as segments that keep their GEMMs' results. One
// SGD step; the parameters after it.
std::vector<Tensor> pointwise_chain_step(Device d, const memory::PlanChoice& c) {
  manual_seed(3);
  std::vector<nn::Linear> layers;
  std::vector<Tensor> params;
  for (int i = 0; i < 2 * kBlocks; ++i) {
    layers.push_back(i % 2 == 0 ? nn::Linear(64, 512) : nn::Linear(512, 64));
    layers.back()->to(d);
    for (const Tensor& p : layers.back()->parameters()) params.push_back(p);
  }
  optim::SGD opt(params, optim::SGDOptions(0.1));
  Tensor h = randn({256, 64}).to(d);
  for (int b = 0; b < kBlocks; ++b) {
    auto block = [&layers, b](const std::vector<Tensor>& v) {
      const Tensor a = layers[size_t(2 * b)]->forward(v[0]);
      return layers[size_t(2 * b + 1)]->forward(mul(tanh(a), sigmoid(a)));
    };
    if (b < c.recompute_blocks)
      h = autograd::recompute(block, {h});
    else if (b < c.recompute_blocks + c.selective_blocks)
      h = autograd::recompute(block, {h}, autograd::RecomputePolicy::keep_matmuls());
    else
      h = block({h});
  }
  mul(h, h).mean().backward();
  opt.step();
  std::vector<Tensor> out;
  if (!d.is_meta())
    for (const Tensor& p : params) out.push_back(p.detach());
  return out;
}

TEST(Plan, WhereSelectiveBlocksFitTheyAreChosen) {
  auto step = [](Device d, const memory::PlanChoice& c) { pointwise_chain_step(d, c); };
  const int64_t plain = memory::estimate([&](Device d) { step(d, {}); }).peak_allocated;
  const int64_t selective = memory::estimate([&](Device d) {
                              step(d, {1, 0, false, kBlocks});
                            }).peak_allocated;
  ASSERT_LT(selective, plain * 8 / 10) << "the chain's selective blocks must save memory for this test";
  const int64_t budget = (selective + plain) / 2;
  const memory::Plan p =
      memory::plan(step, budget, memory::PlanSpace().blocks(kBlocks).micro_batches({1}).selective(true));
  ASSERT_TRUE(p.fits) << p.str();
  EXPECT_GT(p.choice.selective_blocks, 0) << p.str();
  EXPECT_EQ(p.choice.recompute_blocks, 0) << p.str();
  EXPECT_NE(p.str().find("selectively"), std::string::npos) << p.str();
  expect_real_run_as_planned(pointwise_chain_step, p, budget);
}

TEST(Plan, WhenNothingFitsItSaysSoWithTheLowestPeak) {
  const memory::Plan p = memory::plan([](Device d, const memory::PlanChoice& c) { gpt_step(d, c); }, 1 << 20,
                                      memory::PlanSpace().blocks(kBlocks).micro_batches({1, 2}));
  EXPECT_FALSE(p.fits);
  EXPECT_NE(p.str().find("does not fit"), std::string::npos) << p.str();
  testing::expect_error<Error>([] { (void)memory::plan(nullptr, 1); }, {"memory::plan", "empty"});
  testing::expect_error<Error>([] { (void)memory::plan([](Device, const memory::PlanChoice&) {}, 0); },
                               {"budget", "positive"});
  testing::expect_error<Error>(
      [] {
        (void)memory::plan([](Device, const memory::PlanChoice&) {}, 1,
                           memory::PlanSpace().micro_batches({0}));
      },
      {"micro-batch count", ">= 1"});
}

// A chain whose parameters outweigh its activations (W4's shape, small): 8 Linear+ReLU layers of 512 in 2
// blocks, batch 16, SGD with momentum. Two steps as the plan shapes them (the second holds the momentum);
// the parameters after them are returned (on the cpu).
std::vector<Tensor> deep_steps(Device d, const memory::PlanChoice& c) {
  constexpr int kLayers = 8, kPerBlock = 4;
  manual_seed(5);
  std::vector<nn::Linear> layers;
  std::vector<Tensor> params;
  for (int i = 0; i < kLayers; ++i) {
    layers.push_back(nn::Linear(512, 512));
    layers.back()->to(d);
    for (const Tensor& p : layers.back()->parameters()) params.push_back(p);
  }
  optim::SGD opt(params, optim::SGDOptions(0.01).momentum(0.9));
  std::optional<optim::StepInBackward> in_backward;
  if (c.step_in_backward) in_backward.emplace(opt);
  const Tensor x = randn({16, 512}).to(d), target = randn({16, 512}).to(d);
  auto run = [&](Tensor h, int from, int to) {
    for (int i = from; i < to; ++i) h = F::linear_relu(h, layers[size_t(i)]->weight, layers[size_t(i)]->bias);
    return h;
  };
  for (int step = 0; step < 2; ++step) {
    opt.zero_grad();
    Tensor h = x;
    for (int from = 0; from < kLayers; from += kPerBlock)
      h = from / kPerBlock < c.recompute_blocks
              ? autograd::recompute(
                    [&, from](const std::vector<Tensor>& v) { return run(v[0], from, from + kPerBlock); },
                    {h})
              : run(h, from, from + kPerBlock);
    F::mse_loss(h, target).backward();
    opt.step();  // nothing left to update when it stepped in backward
  }
  std::vector<Tensor> out;
  if (!d.is_meta())
    for (const Tensor& p : params) out.push_back(p.detach());
  return out;
}

TEST(Plan, WhereTheGradientsMakeThePeakTheOptimizerStepsInBackward) {
  const int64_t plain = memory::estimate([](Device d) { deep_steps(d, {}); }).peak_allocated;
  const int64_t budget = plain * 85 / 100;
  auto step = [](Device d, const memory::PlanChoice& c) { deep_steps(d, c); };
  // Without it nothing fits: the peak is the parameters, momentum and gradients at the end of backward,
  // which neither recompute nor micro-batches lower.
  const memory::Plan without =
      memory::plan(step, budget, memory::PlanSpace().blocks(2).micro_batches({1, 2}));
  EXPECT_FALSE(without.fits) << without.str();
  const memory::Plan p =
      memory::plan(step, budget, memory::PlanSpace().blocks(2).micro_batches({1, 2}).step_in_backward(true));
  ASSERT_TRUE(p.fits) << p.str();
  EXPECT_TRUE(p.choice.step_in_backward);
  EXPECT_EQ(p.choice.micro_batches, 1);
  EXPECT_EQ(p.choice.recompute_blocks, 0) << "recompute costs time and lowers nothing here";
  EXPECT_DOUBLE_EQ(p.relative_time, 1.0);
  EXPECT_NE(p.str().find("the optimizer steps in backward"), std::string::npos) << p.str();
  expect_real_run_as_planned(deep_steps, p, budget);
}

TEST(Plan, TheGptRecomputesItsFirstBlocks) {
  nn::GPT model(nn::GPTConfig{.vocab = 16, .d_model = 16, .n_layers = 3, .n_heads = 2, .context = 8});
  EXPECT_FALSE(model->recompute());
  model->recompute_blocks(3);
  EXPECT_TRUE(model->recompute());
  model->recompute(false);
  EXPECT_EQ(model->recompute_blocks(), 0);
  testing::expect_error<Error>([&] { model->recompute_blocks(4); }, {"recompute_blocks", "4", "0 to 3"});
}

}  // namespace
}  // namespace frugal
