// dist::ZeroOptimizer (Note [ZeRO shards]): its weights equal plain data parallelism's; each rank's
// optimizer state is 1/world_size of a single process's (the arena's "optimizer" tag says so too); its state
// dict is the single-process optimizer's, and loads back on any number of ranks; what it cannot shard is
// refused.
#include "tests/dist/dist_test.h"
#include "tests/test_util.h"

#include "dist/ddp.h"
#include "dist/zero.h"

namespace frugal {
namespace {

using testing::expect_error;
using testing::uniform;
namespace F = nn::functional;

// An even number of elements in all (so that the parts are equal on 2 ranks): 16*10+10 + 10*6+6 = 236.
nn::Sequential make_model() {
  manual_seed(11);
  nn::Sequential net;
  net->push_back(nn::Linear(16, 10));
  net->push_back(nn::ReLU());
  net->push_back(nn::Linear(10, 6));
  return net;
}

Tensor inputs(int64_t step) {
  return uniform({8, 16}, -1, 1, DType::F32, 40 + 7 * uint64_t(step) + uint64_t(dist::rank()));
}
Tensor targets(int64_t step) {
  return uniform({8}, 0, 6 - 1e-3, DType::F32, 90 + 7 * uint64_t(step) + uint64_t(dist::rank()))
      .to(DType::I64);
}

std::vector<std::vector<float>> weights(nn::Sequential& net) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : net->parameters()) out.push_back(p.to_vector<float>());
  return out;
}

int64_t optimizer_tag_bytes() {
  for (const memory::TagStats& t : memory::tag_stats())
    if (t.tag == "optimizer") return t.allocated.current;
  return 0;
}

TEST(Zero, WeightsEqualPlainDataParallelism) {
  nn::Sequential plain = make_model();
  {
    dist::DistributedDataParallel ddp(*plain);
    optim::AdamW opt(plain->parameters(), optim::AdamWOptions(1e-2));
    for (int64_t s = 0; s < 20; ++s) {
      opt.zero_grad();
      F::cross_entropy(plain->forward(inputs(s)), targets(s)).backward();
      opt.step();
    }
  }
  nn::Sequential net = make_model();
  dist::DistributedDataParallel ddp(*net, dist::DistributedDataParallelOptions().reduce_gradients(false));
  optim::AdamW inner(net->parameters(), optim::AdamWOptions(1e-2));
  dist::ZeroOptimizer opt(inner);
  for (int64_t s = 0; s < 20; ++s) {
    opt.zero_grad();
    F::cross_entropy(net->forward(inputs(s)), targets(s)).backward();
    opt.step();
    for (const Tensor& p : net->parameters()) ASSERT_FALSE(p.grad().defined());  // step frees them
  }
  const auto a = weights(net), b = weights(plain);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(a[k], b[k]) << "parameter " << k;
}

TEST(Zero, EachRankKeepsItsShareOfTheState) {
  const int64_t before = optimizer_tag_bytes();
  nn::Sequential single = make_model();
  optim::Adam alone(single->parameters(), optim::AdamOptions(1e-3));
  F::cross_entropy(single->forward(inputs(0)), targets(0)).backward();
  alone.step();
  const int64_t single_bytes = alone.num_state_bytes();
  EXPECT_EQ(single_bytes, 236 * 8);

  nn::Sequential net = make_model();
  optim::Adam inner(net->parameters(), optim::AdamOptions(1e-3));
  dist::ZeroOptimizer opt(inner);
  F::cross_entropy(net->forward(inputs(0)), targets(0)).backward();
  const int64_t with_single = optimizer_tag_bytes();
  opt.step();
  EXPECT_EQ(opt.num_state_bytes() * dist::world_size(), single_bytes);
  // The arena agrees: the state's bytes under the "optimizer" tag (blocks round up to 512 bytes here).
  EXPECT_GE(optimizer_tag_bytes() - with_single, opt.num_state_bytes());
  EXPECT_LT(optimizer_tag_bytes() - with_single, opt.num_state_bytes() + 2 * 512);
  EXPECT_GE(with_single - before, single_bytes);
}

TEST(Zero, StateDictIsTheSingleProcessOnesAndLoadsBack) {
  const auto train = [](dist::ZeroOptimizer& opt, nn::Sequential& net, int64_t from, int64_t to) {
    for (int64_t s = from; s < to; ++s) {
      opt.zero_grad();
      F::cross_entropy(net->forward(inputs(s)), targets(s)).backward();
      opt.step();
    }
  };
  // Uninterrupted: 10 steps.
  nn::Sequential full = make_model();
  dist::DistributedDataParallel ddp_full(*full,
                                         dist::DistributedDataParallelOptions().reduce_gradients(false));
  optim::Adam full_inner(full->parameters(), optim::AdamOptions(1e-2));
  dist::ZeroOptimizer full_opt(full_inner);
  train(full_opt, full, 0, 10);

  // 5 steps, a checkpoint, a new model and optimizer loaded from it, 5 more.
  nn::Sequential first = make_model();
  dist::DistributedDataParallel ddp_first(*first,
                                          dist::DistributedDataParallelOptions().reduce_gradients(false));
  optim::Adam first_inner(first->parameters(), optim::AdamOptions(1e-2));
  dist::ZeroOptimizer first_opt(first_inner);
  train(first_opt, first, 0, 5);
  const StateDict saved = first_opt.state_dict();
  const StateDict weights_saved = first->state_dict();

  // The format of a single process's Adam over the same parameters.
  nn::Sequential single = make_model();
  optim::Adam single_opt(single->parameters(), optim::AdamOptions(1e-2));
  F::cross_entropy(single->forward(inputs(0)), targets(0)).backward();
  single_opt.step();
  const StateDict reference = single_opt.state_dict();
  ASSERT_EQ(saved.size(), reference.size());
  for (const auto& [key, t] : reference) {
    ASSERT_TRUE(saved.count(key)) << key;
    EXPECT_EQ(saved.at(key).shape(), t.shape()) << key;
  }
  // And a single process can load it.
  single_opt.load_state_dict(saved);

  nn::Sequential second = make_model();
  second->load_state_dict(weights_saved);
  optim::Adam second_inner(second->parameters(), optim::AdamOptions(1e-2));
  dist::ZeroOptimizer second_opt(second_inner);
  second_opt.load_state_dict(saved);
  train(second_opt, second, 5, 10);
  const auto a = weights(second), b = weights(full);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(a[k], b[k]) << "parameter " << k;
}

TEST(Zero, WhatCannotBeShardedIsRefused) {
  nn::Sequential net = make_model();
  optim::Adafactor adafactor(net->parameters(), optim::AdafactorOptions());
  expect_error<Error>([&] { dist::ZeroOptimizer opt(adafactor); }, {"not elementwise"});
  // A bad second group is refused before the first group's parameters move.
  const Tensor first = net->parameters().front();
  const auto* bytes_before = first.storage().get();
  Tensor f64 = zeros({3}, DType::F64).requires_grad_();
  optim::SGD mixed({{net->parameters()}, {{zeros({3}).requires_grad_(), f64}}}, optim::SGDOptions(0.1));
  expect_error<Error>([&] { dist::ZeroOptimizer opt(mixed); }, {"must all be f32 or all f64"});
  EXPECT_EQ(first.storage().get(), bytes_before);
  EXPECT_EQ(mixed.param_groups()[0].params.size(), net->parameters().size());
  optim::Adam adam(net->parameters(), optim::AdamOptions());
  F::cross_entropy(net->forward(inputs(0)), targets(0)).backward();
  adam.step();
  expect_error<Error>([&] { dist::ZeroOptimizer opt(adam); }, {"has stepped already"});
}

}  // namespace
}  // namespace frugal
