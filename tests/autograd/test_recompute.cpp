// Recompute segments: bit-identical gradients, parameters inside a segment whose inputs need no grad, random
// ops, nesting, the peak-memory saving of a 32-layer MLP step, and a segment that changes between runs.
#include <cmath>

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

TEST(Recompute, InputGradientsAndNesting) {
  const Mlp net(6, 16, 200);
  Tensor x = uniform({8, 16}, -1, 1, DType::F32, 2).requires_grad_();
  mean(net.forward(x, 0)).backward();
  const auto plain = net.grads();
  const auto plain_x = x.grad().to_vector<float>();
  net.zero_grad();
  x.zero_grad();
  // An outer segment over all layers holding two inner segments.
  Tensor y = autograd::recompute(
      [&](const std::vector<Tensor>& in) {
        Tensor h =
            autograd::recompute([&](const std::vector<Tensor>& a) { return net.run(a[0], 0, 3); }, {in[0]});
        return autograd::recompute([&](const std::vector<Tensor>& a) { return net.run(a[0], 3, 6); }, {h});
      },
      {x});
  mean(y).backward();
  EXPECT_EQ(net.grads(), plain);
  EXPECT_EQ(x.grad().to_vector<float>(), plain_x);
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

}  // namespace
}  // namespace frugal
