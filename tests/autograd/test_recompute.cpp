// Recompute segments: bit-identical gradients, parameters inside a segment whose inputs need no grad, random
// ops, nesting, the peak-memory saving of a 32-layer MLP step, and a segment that changes between runs.
// Selective recompute (a policy that keeps the GEMMs' results): bit-identical gradients of an MLP and of the
// GPT's blocks, no GEMM run again in backward, a peak between none and whole recompute, bad policies.
#include <cmath>
#include <functional>
#include <map>
#include <string>

#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;
using testing::uniform;

struct Mlp {
  std::vector<Tensor> w, b;
  Mlp(int layers, int64_t width, uint64_t seed) {
    for (int i = 0; i < layers; ++i) {
      w.push_back(uniform({width, width}, -1.0 / std::sqrt(double(width)), 1.0 / std::sqrt(double(width)),
                          DType::F32, seed + 2 * uint64_t(i))
                      .requires_grad_());
      b.push_back(uniform({width}, -0.1, 0.1, DType::F32, seed + 2 * uint64_t(i) + 1).requires_grad_());
    }
  }
  // Layers [from, to): Linear then ReLU, with a dropout-like random mask when `drop`.
  Tensor run(Tensor h, int from, int to, bool drop = false) const {
    for (int i = from; i < to; ++i) {
      h = relu(add(matmul(h, w[size_t(i)]), b[size_t(i)]));
      if (drop) h = where(lt(rand(h.shape()), 0.8), h * 1.25, zeros_like(h));
    }
    return h;
  }
  // All layers, recomputing segments of k layers (k = 0: no recompute).
  Tensor forward(const Tensor& x, int k, bool drop = false) const {
    const int n = int(w.size());
    if (k == 0) return run(x, 0, n, drop);
    Tensor h = x;
    for (int s = 0; s < n; s += k) {
      const int e = std::min(n, s + k);
      h = autograd::recompute(
          [this, s, e, drop](const std::vector<Tensor>& in) { return run(in[0], s, e, drop); }, {h});
    }
    return h;
  }
  std::vector<std::vector<float>> grads() const {
    std::vector<std::vector<float>> g;
    for (const auto& t : w) g.push_back(t.grad().to_vector<float>());
    for (const auto& t : b) g.push_back(t.grad().to_vector<float>());
    return g;
  }
  void zero_grad() const {
    for (const auto& t : w) t.zero_grad();
    for (const auto& t : b) t.zero_grad();
  }
};

TEST(Recompute, GradientsAreBitIdenticalWithRandomOps) {
  const Mlp net(8, 32, 100);
  const Tensor x = uniform({16, 32}, -1, 1, DType::F32, 1);  // needs no grad: the parameters inside do
  manual_seed(7);
  const double plain_loss = mean(net.forward(x, 0, true)).item<double>();
  manual_seed(7);
  mean(net.forward(x, 0, true)).backward();
  const auto plain = net.grads();
  const auto rng_after_plain = default_generator().state();
  net.zero_grad();
  manual_seed(7);
  Tensor loss = mean(net.forward(x, 3, true));
  EXPECT_EQ(loss.item<double>(), plain_loss);
  loss.backward();
  EXPECT_EQ(net.grads(), plain);                            // bit for bit
  EXPECT_EQ(default_generator().state(), rng_after_plain);  // recomputing did not disturb the RNG sequence
}

// The gradients of mean(forward(x)), the parameters' and x's, equal those of the plain run bit for bit.
void expect_plain_gradients(const Mlp& net, const Tensor& x,
                            const std::function<Tensor(const Tensor&)>& forward) {
  mean(net.forward(x, 0)).backward();
  const auto plain = net.grads();
  const auto plain_x = x.grad().to_vector<float>();
  net.zero_grad();
  x.zero_grad();
  mean(forward(x)).backward();
  EXPECT_EQ(net.grads(), plain);
  EXPECT_EQ(x.grad().to_vector<float>(), plain_x);
}

TEST(Recompute, InputGradientsAndNesting) {
  const Mlp net(6, 16, 200);
  // An outer segment over all layers holding two inner segments.
  expect_plain_gradients(net, uniform({8, 16}, -1, 1, DType::F32, 2).requires_grad_(), [&](const Tensor& x) {
    return autograd::recompute(
        [&](const std::vector<Tensor>& in) {
          Tensor h =
              autograd::recompute([&](const std::vector<Tensor>& a) { return net.run(a[0], 0, 3); }, {in[0]});
          return autograd::recompute([&](const std::vector<Tensor>& a) { return net.run(a[0], 3, 6); }, {h});
        },
        {x});
  });
}

TEST(Recompute, OutsideGradModeJustRuns) {
  const Mlp net(2, 8, 300);
  NoGradGuard guard;
  const Tensor x = uniform({4, 8}, -1, 1);
  const Tensor y = net.forward(x, 1);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.to_vector<float>(), net.run(x, 0, 2).to_vector<float>());
}

TEST(Recompute, SegmentThatChangesIsAnError) {
  Tensor w = uniform({4}, 1, 2).requires_grad_();
  int runs = 0;
  Tensor y = autograd::recompute(
      [&](const std::vector<Tensor>& in) {
        Tensor h = in[0] * w;
        if (runs++ == 0) h = exp(h);  // an extra saved tensor on the first run only
        return h;
      },
      {uniform({4}, 1, 2)});
  expect_error<Error>([&] { sum(y).backward(); }, {"recompute", "same ops"});
}

// Peak arena bytes of one forward + backward of a 32-layer, width-256 MLP on a batch of 1024, recomputing
// segments of k layers (0: none).
int64_t step_peak(const Mlp& net, const Tensor& x, int k) {
  net.zero_grad();
  memory::reset_peak();
  const int64_t base = memory::stats().allocated.current;
  mean(net.forward(x, k)).backward();
  return memory::stats().allocated.peak - base;
}

TEST(Recompute, LowersThePeakOfA32LayerStep) {
  const Mlp net(32, 256, 400);
  const Tensor x = uniform({1024, 256}, -1, 1, DType::F32, 3);
  const int64_t plain = step_peak(net, x, 0);
  const int64_t segmented = step_peak(net, x, 6);  // about sqrt(32) layers per segment
  // Without recompute every layer keeps its ReLU output (one 1 MiB activation) until backward. With segments
  // of 6, only the 6 segment outputs stay through the forward, and backward holds at most one segment's 6
  // recomputed activations at a time: at least 32 - 6 - 6 - 3 = 17 activations fewer (3 for transients: the
  // peak with segments falls while a segment runs again, beside its pre-activation and the gradients).
  // (The weight gradients, 32 x 256 KiB, are the same in both runs.)
  const int64_t activation = 1024 * 256 * 4;
  std::printf("peak bytes of a 32-layer step: %lld without recompute, %lld with segments of 6 (%.2fx)\n",
              static_cast<long long>(plain), static_cast<long long>(segmented),
              double(segmented) / double(plain));
  EXPECT_LE(segmented, plain - 17 * activation);
}

// ---- selective recompute (Note [selective recompute]) ----

// Allocations made in the recompute phase, by the op that made them.
std::map<std::string, int> recompute_allocations(const memory::HistoryRecord& r) {
  std::map<std::string, int> by_op;
  for (const memory::HistoryEvent& e : r.events)
    if (e.kind == memory::EventKind::Alloc && e.phase == memory::Phase::Recompute) ++by_op[e.op];
  return by_op;
}

TEST(SelectiveRecompute, KeepsTheGemmsAndGradientsAreBitIdentical) {
  const Mlp net(6, 32, 500);
  const Tensor x = uniform({16, 32}, -1, 1, DType::F32, 4);
  manual_seed(3);
  mean(net.forward(x, 0, true)).backward();
  const auto plain = net.grads();
  for (const autograd::RecomputePolicy& policy :
       {autograd::RecomputePolicy::recompute_all(), autograd::RecomputePolicy::keep_matmuls(),
        autograd::RecomputePolicy::keep({"matmul"})}) {
    SCOPED_TRACE(policy.str());
    net.zero_grad();
    manual_seed(3);
    memory::History h(kCPU);
    Tensor y = x;
    for (int s = 0; s < 6; s += 3)
      y = autograd::recompute(
          [&net, s](const std::vector<Tensor>& in) { return net.run(in[0], s, s + 3, true); }, {y}, policy);
    mean(y).backward();
    EXPECT_EQ(net.grads(), plain);  // bit for bit, with dropout's masks drawn again
    const std::map<std::string, int> again = recompute_allocations(memory::history(kCPU));
    EXPECT_GT(again.count("add") + again.count("relu"), 0u) << "the cheap ops ran again";
    if (policy.keeps_nothing())
      EXPECT_GT(again.count("matmul"), 0u) << "without a policy the GEMMs run again too";
    else
      EXPECT_EQ(again.count("matmul"), 0u) << "a kept matmul ran again";
  }
}

// One training step of a small GPT (its blocks: layer norm, self-attention, linear, GELU), the gradients.
std::vector<std::vector<float>> gpt_grads(Device d, int64_t whole, int64_t selective) {
  manual_seed(5);
  nn::GPT model(nn::GPTConfig{.vocab = 32, .d_model = 32, .n_layers = 3, .n_heads = 4, .context = 16});
  model->recompute_blocks(whole, selective);
  std::vector<int64_t> ids(8 * 16);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i * 5 % 32);
  const Tensor tokens = tensor(ids, {8, 16}).to(d);
  nn::functional::cross_entropy(model->forward(tokens).view({-1, 32}), tokens.view({-1})).backward();
  std::vector<std::vector<float>> g;
  if (!d.is_meta())
    for (const Tensor& p : model->parameters()) g.push_back(p.grad().to_vector<float>());
  return g;
}

// (The GPT's blocks keep only their GEMMs' inputs, through layer_norm_linear and gelu_linear, so keeping
// their GEMMs' results saves nothing there: Plan.WhereSelectiveBlocksFitTheyAreChosen shows the peak between
// on a chain whose pointwise ops keep more.)
TEST(SelectiveRecompute, TheGptsBlocksGiveTheSameGradientsAndTheirDryRunsPeak) {
  const auto plain = gpt_grads(kCPU, 0, 0);
  EXPECT_EQ(gpt_grads(kCPU, 0, 3), plain);
  EXPECT_EQ(gpt_grads(kCPU, 1, 2), plain);
  const auto peak = [](int64_t whole, int64_t selective) {
    return memory::estimate([=](Device d) { gpt_grads(d, whole, selective); }).peak_allocated;
  };
  const int64_t none = peak(0, 0), all = peak(3, 0), selective = peak(0, 3);
  std::printf("GPT step peak: %lld plain, %lld selective, %lld whole recompute\n",
              static_cast<long long>(none), static_cast<long long>(selective), static_cast<long long>(all));
  EXPECT_GT(selective, all);
  EXPECT_GT(none, all);
  // The real run peaks where its dry run said.
  memory::empty_cache(kCPU);
  memory::reset_peak(kCPU);
  const int64_t base = memory::stats(kCPU).allocated.current;
  gpt_grads(kCPU, 0, 3);
  EXPECT_EQ(memory::stats(kCPU).allocated.peak - base, selective);
}

TEST(SelectiveRecompute, BadPoliciesAndChangingSegmentsAreErrors) {
  expect_error<Error>(
      [] {
        (void)autograd::RecomputePolicy::keep({"linear", "gelu"});
      },
      {"RecomputePolicy::keep", "'gelu'", "cannot be kept", "linear, linear_relu, matmul"});
  EXPECT_EQ(autograd::RecomputePolicy::keep({"linear", "matmul"}).str(), "keep linear, matmul");
  EXPECT_EQ(autograd::RecomputePolicy().str(), "recompute all");
  EXPECT_TRUE(autograd::RecomputePolicy::keep_matmuls().keeps("self_attention"));
  EXPECT_FALSE(autograd::RecomputePolicy::keep({"linear"}).keeps("matmul"));
  Tensor w = uniform({4, 4}, 1, 2).requires_grad_();
  int runs = 0;
  Tensor y = autograd::recompute(
      [&](const std::vector<Tensor>& in) {
        Tensor h = relu(matmul(in[0], w));
        if (runs++ == 0) h = matmul(h, w);  // one more GEMM on the first run only
        return h;
      },
      {uniform({4, 4}, 1, 2)}, autograd::RecomputePolicy::keep_matmuls());
  expect_error<Error>([&] { sum(y).backward(); }, {"recompute", "could keep", "same ops"});
  nn::GPT model(nn::GPTConfig{.vocab = 16, .d_model = 16, .n_layers = 3, .n_heads = 2, .context = 8});
  model->recompute_blocks(1, 2);
  EXPECT_EQ(model->selective_blocks(), 2);
  expect_error<Error>([&] { model->recompute_blocks(2, 2); }, {"recompute_blocks", "selective from 0 to 1"});
}

TEST(SelectiveRecompute, NestedInsideAndAroundPlainSegments) {
  const Mlp net(6, 16, 600);
  // A keeping segment around a plain one and a keeping one: each counts only its own ops.
  expect_plain_gradients(net, uniform({8, 16}, -1, 1, DType::F32, 5).requires_grad_(), [&](const Tensor& x) {
    return autograd::recompute(
        [&](const std::vector<Tensor>& in) {
          Tensor h = net.run(in[0], 0, 2);
          h = autograd::recompute([&](const std::vector<Tensor>& a) { return net.run(a[0], 2, 4); }, {h});
          return autograd::recompute([&](const std::vector<Tensor>& a) { return net.run(a[0], 4, 6); }, {h},
                                     autograd::RecomputePolicy::keep({"matmul"}));
        },
        {x}, autograd::RecomputePolicy::keep_matmuls());
  });
}

}  // namespace
}  // namespace frugal
