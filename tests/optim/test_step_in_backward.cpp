// optim::StepInBackward (Note [stepping in backward]): each optimizer gives the same parameters as the usual
// zero_grad / backward / step loop, bit for bit; a parameter used twice is updated once with its whole
// gradient; the peak of a step whose parameters dominate falls by most of the gradients' bytes; what cannot
// step in backward is refused before anything changes; the guard's end restores the usual backward.
#include <functional>
#include <memory>

#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;
using testing::uniform;

// An MLP whose first layer's weight is used twice (x W0, then again after the ReLU), with a bias per layer.
struct Net {
  std::vector<Tensor> params;
  Net(int layers, int64_t width) {
    for (int i = 0; i < layers; ++i) {
      params.push_back(uniform({width, width}, -0.2, 0.2, DType::F32, 10 + uint64_t(i)).requires_grad_());
      params.push_back(uniform({width}, -0.1, 0.1, DType::F32, 50 + uint64_t(i)).requires_grad_());
    }
  }
  Tensor loss(const Tensor& x) const {
    Tensor h = relu(matmul(x, params[0]));
    h = matmul(h, params[0]);  // shared
    for (size_t i = 0; i < params.size(); i += 2) h = relu(add(matmul(h, params[i]), params[i + 1]));
    return mean(mul(h, h));
  }
  std::vector<std::vector<float>> values() const {
    std::vector<std::vector<float>> v;
    for (const Tensor& p : params) v.push_back(p.to_vector<float>());
    return v;
  }
};

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(const std::vector<Tensor>&)>;

std::vector<std::vector<float>> train(const MakeOptimizer& make, bool in_backward) {
  Net net(3, 16);
  std::unique_ptr<optim::Optimizer> opt = make(net.params);
  std::unique_ptr<optim::StepInBackward> guard;
  if (in_backward) guard = std::make_unique<optim::StepInBackward>(*opt);
  for (int step = 0; step < 3; ++step) {
    const Tensor x = uniform({8, 16}, -1, 1, DType::F32, 100 + uint64_t(step));
    if (!in_backward) opt->zero_grad();
    net.loss(x).backward();
    if (in_backward) {
      for (const Tensor& p : net.params) EXPECT_FALSE(p.grad().defined()) << "a gradient outlived its update";
    } else {
      opt->step();
    }
  }
  return net.values();
}

TEST(StepInBackward, EveryOptimizerGivesTheUsualStepsParameters) {
  const std::vector<std::pair<const char*, MakeOptimizer>> optimizers{
      {"sgd momentum",
       [](const std::vector<Tensor>& p) {
         return std::make_unique<optim::SGD>(p, optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01));
       }},
      {"adam",
       [](const std::vector<Tensor>& p) {
         return std::make_unique<optim::Adam>(p, optim::AdamOptions(0.01));
       }},
      {"adamw",
       [](const std::vector<Tensor>& p) {
         return std::make_unique<optim::AdamW>(p, optim::AdamWOptions(0.01));
       }},
      {"adam8bit",
       [](const std::vector<Tensor>& p) {
         return std::make_unique<optim::Adam8bit>(
             p, optim::Adam8bitOptions(0.01).block_size(64).min_8bit_size(0));
       }},
      {"adafactor",
       [](const std::vector<Tensor>& p) {
         return std::make_unique<optim::Adafactor>(p, optim::AdafactorOptions());
       }},
  };
  for (const auto& [name, make] : optimizers) {
    SCOPED_TRACE(name);
    const auto usual = train(make, false);
    const auto in_backward = train(make, true);
    EXPECT_EQ(in_backward, usual);  // bit for bit, the shared weight included
    EXPECT_NE(usual, Net(3, 16).values()) << "the steps changed nothing";
  }
}

// Peak bytes of one step of a wide MLP on a small batch (its parameters dominate), the usual way or in
// backward, from a state where the momentum exists already.
int64_t step_peak(bool in_backward) {
  Net net(4, 256);
  optim::SGD opt(net.params, optim::SGDOptions(0.01).momentum(0.9));
  const Tensor x = uniform({4, 256}, -1, 1);
  net.loss(x).backward();
  opt.step();  // the momentum buffers exist from here on
  opt.zero_grad();
  std::unique_ptr<optim::StepInBackward> guard;
  if (in_backward) guard = std::make_unique<optim::StepInBackward>(opt);
  memory::reset_peak();
  const int64_t base = memory::stats().allocated.current;
  net.loss(x).backward();
  if (!in_backward) opt.step();
  return memory::stats().allocated.peak - base;
}

TEST(StepInBackward, ThePeakFallsByMostOfTheGradients) {
  const int64_t gradient_bytes = 4 * (256 * 256 + 256) * 4;
  const int64_t usual = step_peak(false), in_backward = step_peak(true);
  std::printf("step peak above the parameters and momentum: %lld usual, %lld in backward (gradients %lld)\n",
              static_cast<long long>(usual), static_cast<long long>(in_backward),
              static_cast<long long>(gradient_bytes));
  EXPECT_LE(in_backward, usual - gradient_bytes / 2);
}

// Recompute segments beside stepping in backward (Note [recompute and stepping in backward]): three
// segments, the last ending in `+ c` with a parameter c that nothing older reads (so c is updated before that
// segment runs again), and W0 read by the first and the last (updated only after both ran again). Three steps
// of SGD with momentum and of AdamW give the parameters of the usual loop without segments, bit for bit.
TEST(StepInBackward, RecomputeSegmentsGiveTheUsualStepsParameters) {
  auto run = [](bool segments, bool in_backward, bool adam) {
    std::vector<Tensor> params;
    for (int i = 0; i < 3; ++i)
      params.push_back(uniform({16, 16}, -0.3, 0.3, DType::F32, 10 + uint64_t(i)).requires_grad_());
    params.push_back(uniform({16}, -0.1, 0.1, DType::F32, 20).requires_grad_());  // c
    std::unique_ptr<optim::Optimizer> opt;
    if (adam)
      opt = std::make_unique<optim::AdamW>(params, optim::AdamWOptions(1e-2));
    else
      opt = std::make_unique<optim::SGD>(params, optim::SGDOptions(0.1).momentum(0.9));
    std::unique_ptr<optim::StepInBackward> guard;
    if (in_backward) guard = std::make_unique<optim::StepInBackward>(*opt);
    auto block = [&](int i, const Tensor& h) {
      Tensor y = tanh(matmul(h, params[size_t(i)]));
      if (i == 2) y = add(matmul(y, params[0]), params[3]);  // W0 again, then c
      return y;
    };
    for (int step = 0; step < 3; ++step) {
      Tensor h = uniform({8, 16}, -1, 1, DType::F32, 100 + uint64_t(step));
      if (!in_backward) opt->zero_grad();
      for (int i = 0; i < 3; ++i)
        h = segments
                ? autograd::recompute([&, i](const std::vector<Tensor>& in) { return block(i, in[0]); }, {h})
                : block(i, h);
      mean(mul(h, h)).backward();
      if (!in_backward) opt->step();
    }
    std::vector<std::vector<float>> v;
    for (const Tensor& p : params) v.push_back(p.to_vector<float>());
    return v;
  };
  for (bool adam : {false, true}) {
    const auto usual = run(false, false, adam);
    EXPECT_EQ(run(true, true, adam), usual) << (adam ? "adamw" : "sgd");
    EXPECT_EQ(run(true, false, adam), usual) << (adam ? "adamw" : "sgd");
  }
}

TEST(StepInBackward, WhatCannotStepInBackwardIsRefused) {
  Net net(2, 8);
  const Tensor x = uniform({4, 8}, -1, 1);
  optim::SGD opt(net.params, optim::SGDOptions(0.1));
  {
    optim::StepInBackward guard(opt);
    EXPECT_TRUE(opt.steps_in_backward());
    expect_error<Error>([&] { optim::StepInBackward again(opt); }, {"StepInBackward", "already"});
    optim::SGD other(net.params, optim::SGDOptions(0.1));
    expect_error<Error>([&] { optim::StepInBackward second(other); }, {"grad-ready hook"});
    expect_error<Error>([&] { (void)optim::clip_grad_norm_(net.params, 1.0); },
                        {"clip_grad_norm_", "StepInBackward"});
    amp::GradScaler scaler;
    expect_error<Error>([&] { (void)scaler.scale(net.loss(x)); }, {"GradScaler", "StepInBackward"});
  }
  // A gradient left by a backward without the guard: the guarded backward refuses to accumulate onto it,
  // before anything is updated.
  EXPECT_FALSE(opt.steps_in_backward());
  net.loss(x).backward();
  const auto before = net.values();
  {
    optim::StepInBackward guard(opt);
    expect_error<Error>([&] { net.loss(x).backward(); }, {"already has a gradient", "accumulate"});
  }
  EXPECT_EQ(net.values(), before);
  // The guard gone, backward leaves the gradients as usual.
  opt.zero_grad();
  net.loss(x).backward();
  EXPECT_TRUE(net.params[0].grad().defined());
  EXPECT_EQ(net.values(), before);
  optim::SparseAdam sparse({uniform({4, 2}, -1, 1).requires_grad_()}, optim::SparseAdamOptions());
  expect_error<Error>([&] { optim::StepInBackward guard(sparse); }, {"sparse gradients"});
  expect_error<Error>([&] { opt.step_param(uniform({2}, 0, 1)); },
                      {"step_param", "not one of its parameters"});
}

}  // namespace
}  // namespace frugal
