// dist::DistributedDataParallel (Note [gradient buckets]): n ranks with batch B end with the weights of one
// process with batch nB (to f32 rounding of the sum order), whatever the buckets; no_sync accumulation equals
// none; recompute segments and the GradScaler work beside it (every rank skips the same steps); the initial
// parameters are rank 0's; StepInBackward is refused.
#include <functional>

#include "tests/dist/dist_test.h"
#include "tests/test_util.h"

#include "dist/ddp.h"

namespace frugal {
namespace {

using testing::expect_error;
using testing::uniform;
namespace F = nn::functional;

constexpr int64_t kIn = 12, kHidden = 24, kOut = 5, kBatch = 8;

// The same model on every rank and in every reference (the seed fixes its initial values).
nn::Sequential make_model(uint64_t seed = 3) {
  manual_seed(seed);
  nn::Sequential net;
  net->push_back(nn::Linear(kIn, kHidden));
  net->push_back(nn::Tanh());
  net->push_back(nn::Linear(kHidden, kHidden));
  net->push_back(nn::ReLU());
  net->push_back(nn::Linear(kHidden, kOut));
  return net;
}

// Step s's global batch: world * kBatch rows; rank r's share is rows [r kBatch, (r + 1) kBatch).
Tensor global_inputs(int64_t step, int world) {
  return uniform({world * kBatch, kIn}, -1, 1, DType::F32, 100 + uint64_t(step));
}
Tensor global_targets(int64_t step, int world) {
  return uniform({world * kBatch}, 0, kOut - 1e-3, DType::F32, 500 + uint64_t(step)).to(DType::I64);
}

using Loss = std::function<Tensor(nn::Sequential&, const Tensor&, const Tensor&)>;
Tensor plain_loss(nn::Sequential& net, const Tensor& x, const Tensor& y) {
  return F::cross_entropy(net->forward(x), y);
}

std::vector<std::vector<float>> weights(nn::Sequential& net) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : net->parameters()) out.push_back(p.to_vector<float>());
  return out;
}

void expect_weights_close(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b,
                          double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    ASSERT_EQ(a[k].size(), b[k].size());
    for (size_t i = 0; i < a[k].size(); ++i)
      ASSERT_NEAR(a[k][i], b[k][i], tol * (1 + std::fabs(b[k][i])))
          << what << ": parameter " << k << " element " << i;
  }
}

// 20 steps of a single process over the whole global batch.
std::vector<std::vector<float>> train_alone(
    const std::function<std::unique_ptr<optim::Optimizer>(nn::Sequential&)>& make_opt) {
  nn::Sequential net = make_model();
  auto opt = make_opt(net);
  for (int64_t s = 0; s < 20; ++s) {
    opt->zero_grad();
    plain_loss(net, global_inputs(s, dist::world_size()), global_targets(s, dist::world_size())).backward();
    opt->step();
  }
  return weights(net);
}

Tensor my_rows(const Tensor& t) { return t.narrow(0, dist::rank() * kBatch, kBatch).contiguous(); }

TEST(DDP, RanksWithBatchBEqualOneProcessWithBatchNB) {
  const auto sgd = [](nn::Sequential& n) {
    return std::make_unique<optim::SGD>(n->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  };
  const auto adamw = [](nn::Sequential& n) {
    return std::make_unique<optim::AdamW>(n->parameters(), optim::AdamWOptions(1e-2));
  };
  for (const auto& make_opt : {std::function<std::unique_ptr<optim::Optimizer>(nn::Sequential&)>(sgd),
                               std::function<std::unique_ptr<optim::Optimizer>(nn::Sequential&)>(adamw)})
    for (double cap_mb : {25.0, 0.0001}) {  // one bucket; a bucket per parameter or two
      nn::Sequential net = make_model();
      dist::DistributedDataParallel ddp(*net, dist::DistributedDataParallelOptions().bucket_cap_mb(cap_mb));
      if (cap_mb < 1) {
        EXPECT_GT(ddp.num_buckets(), 2);
      }
      auto opt = make_opt(net);
      for (int64_t s = 0; s < 20; ++s) {
        opt->zero_grad();
        const int w = dist::world_size();
        plain_loss(net, my_rows(global_inputs(s, w)), my_rows(global_targets(s, w))).backward();
        opt->step();
      }
      EXPECT_GT(ddp.last_reduced_bytes(), 0);
      const auto alone = train_alone(make_opt);
      expect_weights_close(weights(net), alone, 2e-5,
                           std::string(opt->name()) + " cap " + std::to_string(cap_mb));
      // And every rank holds the same weights, bit for bit.
      for (const Tensor& p : net->parameters()) {
        const auto all = testing::values_of_every_rank(p);
        for (const auto& v : all) ASSERT_EQ(v, all.front());
      }
    }
}

// 5 SGD steps of the rank's rows under DDP with these options, the forward in a recompute segment or not.
std::vector<std::vector<float>> five_sgd_steps(const dist::DistributedDataParallelOptions& options,
                                               bool segments) {
  const int w = dist::world_size();
  nn::Sequential net = make_model();
  dist::DistributedDataParallel ddp(*net, options);
  optim::SGD opt(net->parameters(), optim::SGDOptions(0.1));
  for (int64_t s = 0; s < 5; ++s) {
    opt.zero_grad();
    const Tensor x = my_rows(global_inputs(s, w)), y = my_rows(global_targets(s, w));
    Tensor logits = segments ? autograd::recompute(
                                   [&](const std::vector<Tensor>& in) { return net->forward(in[0]); }, {x})
                             : net->forward(x);
    F::cross_entropy(logits, y).backward();
    opt.step();
  }
  return weights(net);
}

TEST(DDP, BucketsReducedAtTheEndGiveTheSameWeights) {
  const auto small = dist::DistributedDataParallelOptions().bucket_cap_mb(0.0001);
  const auto a = five_sgd_steps(small, false),
             b = five_sgd_steps(dist::DistributedDataParallelOptions(small).overlap(false), false);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(a[k], b[k]) << "parameter " << k;
}

TEST(DDP, NoSyncAccumulationEqualsNone) {
  const int w = dist::world_size();
  // Reference: one backward a step over the rank's kBatch rows.
  nn::Sequential ref = make_model();
  optim::SGD ref_opt(ref->parameters(), optim::SGDOptions(0.1));
  {
    dist::DistributedDataParallel ddp(*ref);
    for (int64_t s = 0; s < 10; ++s) {
      ref_opt.zero_grad();
      plain_loss(ref, my_rows(global_inputs(s, w)), my_rows(global_targets(s, w))).backward();
      ref_opt.step();
    }
  }
  // Two half batches a step, the first under no_sync: each loss is half the mean.
  nn::Sequential net = make_model();
  optim::SGD opt(net->parameters(), optim::SGDOptions(0.1));
  dist::DistributedDataParallel ddp(*net);
  for (int64_t s = 0; s < 10; ++s) {
    opt.zero_grad();
    const Tensor x = my_rows(global_inputs(s, w)), y = my_rows(global_targets(s, w));
    {
      auto no_sync = ddp.no_sync();
      plain_loss(net, x.narrow(0, 0, kBatch / 2), y.narrow(0, 0, kBatch / 2)).mul(0.5).backward();
    }
    plain_loss(net, x.narrow(0, kBatch / 2, kBatch / 2), y.narrow(0, kBatch / 2, kBatch / 2))
        .mul(0.5)
        .backward();
    opt.step();
  }
  expect_weights_close(weights(net), weights(ref), 2e-5, {"no_sync"});
}

TEST(DDP, RecomputeSegmentsGiveTheSameWeights) {
  const auto a = five_sgd_steps({}, false), b = five_sgd_steps({}, true);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(a[k], b[k]) << "parameter " << k;
}

TEST(DDP, TheGradScalerSkipsTheSameStepsOnEveryRank) {
  const int w = dist::world_size();
  nn::Sequential net = make_model();
  dist::DistributedDataParallel ddp(*net);
  optim::SGD opt(net->parameters(), optim::SGDOptions(0.1));
  amp::GradScaler scaler;
  const auto before = weights(net);
  opt.zero_grad();
  Tensor x = my_rows(global_inputs(0, w));
  // The last rank's batch overflows; the others' do not.
  if (dist::rank() == w - 1) x = x.mul(0).add(INFINITY);
  const bool stepped = [&] {
    scaler.scale(plain_loss(net, x, my_rows(global_targets(0, w)))).backward();
    return scaler.step(opt);
  }();
  scaler.update();
  EXPECT_FALSE(stepped);
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  expect_weights_close(weights(net), before, 0, {"a skipped step"});
  // A clean step then runs on every rank.
  opt.zero_grad();
  scaler.scale(plain_loss(net, my_rows(global_inputs(1, w)), my_rows(global_targets(1, w)))).backward();
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
}

TEST(DDP, Bf16ParametersAndAutocastReduceInF32) {
  const int w = dist::world_size();
  // One backward of the global batch in one process, in bf16 parameters under bf16 autocast.
  nn::Sequential alone = make_model();
  alone->to(DType::BF16);
  {
    amp::Autocast autocast(DType::BF16);
    plain_loss(alone, global_inputs(0, w).to(DType::BF16), global_targets(0, w)).backward();
  }
  nn::Sequential net = make_model();
  net->to(DType::BF16);
  dist::DistributedDataParallel ddp(*net);
  {
    amp::Autocast autocast(DType::BF16);
    plain_loss(net, my_rows(global_inputs(0, w)).to(DType::BF16), my_rows(global_targets(0, w))).backward();
  }
  const std::vector<Tensor> a = net->parameters(), b = alone->parameters();
  for (size_t k = 0; k < a.size(); ++k) {
    ASSERT_EQ(a[k].grad().dtype(), DType::BF16);
    // The mean of the ranks' bf16 gradients against the whole batch's: bf16 rounding apart.
    testing::expect_close(a[k].grad().to_vector<double>(), b[k].grad().to_vector<double>(), {2e-3, 3e-2},
                          "gradient " + std::to_string(k));
  }
}

TEST(DDP, ParametersStartAsRankZeros) {
  nn::Sequential net = make_model(3 + uint64_t(dist::rank()));  // different on every rank
  dist::DistributedDataParallel ddp(*net);
  nn::Sequential zero = make_model(3);
  expect_weights_close(weights(net), weights(zero), 0, {"after the broadcast"});
}

TEST(DDP, StepInBackwardIsRefusedEitherWay) {
  nn::Sequential net = make_model();
  optim::SGD opt(net->parameters(), optim::SGDOptions(0.1));
  {
    dist::DistributedDataParallel ddp(*net);
    expect_error<Error>([&] { optim::StepInBackward in_backward(opt); }, {"reduced across processes"});
  }
  {
    optim::StepInBackward in_backward(opt);
    expect_error<Error>([&] { dist::DistributedDataParallel ddp(*net); }, {"step in backward"});
  }
  expect_error<Error>(
      [] {
        dist::DistributedDataParallel(*make_model(), dist::DistributedDataParallelOptions().bucket_cap_mb(0));
      },
      {"bucket_cap_mb must be positive"});
}

TEST(DDP, OtherBackwardsAreLeftAlone) {
  nn::Sequential net = make_model();
  dist::DistributedDataParallel ddp(*net);
  // A backward through tensors of no DDP model reduces nothing (and needs no other rank).
  Tensor a = uniform({4}, -1, 1).requires_grad_();
  sum(mul(a, a)).backward();
  EXPECT_EQ(a.grad().to_vector<float>(), mul(a.detach(), 2).to_vector<float>());
}

}  // namespace
}  // namespace frugal
