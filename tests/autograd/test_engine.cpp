// The backward engine: accumulation, retain_graph, explicit gradients, grad modes, saved-tensor hooks, the
// in-place version check, a 100,000-op chain, memory falling during backward, and misuse errors.
#include <cmath>

#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::uniform;

TEST(Backward, SimpleGradients) {
  Tensor x = uniform({3, 4}, -1, 1, DType::F64).requires_grad_();
  Tensor y = sum(x * x);
  EXPECT_EQ(std::string(y.grad_fn_name()), "sum");
  y.backward();
  expect_close(x.grad(), (x.detach() * 2.0).to_vector<double>(), {1e-12, 1e-12}, "d sum(x^2)");
  EXPECT_EQ(x.grad().shape(), x.shape());
  EXPECT_TRUE(x.grad().is_contiguous());
}

TEST(Backward, LeafGradientsNeverAlias) {
  Tensor a = ones({2, 3}).requires_grad_(), b = ones({2, 3}).requires_grad_();
  sum(a + b).backward();  // add hands the same gradient tensor to both inputs
  EXPECT_NE(a.grad().storage(), b.grad().storage());
  {
    NoGradGuard guard;
    Tensor ga = a.grad();
    ga.mul_(10.0);
  }
  EXPECT_EQ(b.grad().to_vector<float>(), std::vector<float>(6, 1.f));
  Tensor c = ones({3, 2}).requires_grad_();
  const Tensor g = ones({2, 3});
  c.t().backward(g);  // the gradient arrives as a transposed view of the caller's tensor
  EXPECT_NE(c.grad().storage(), g.storage());
  EXPECT_TRUE(c.grad().is_contiguous());
}

TEST(Backward, LeafGradientsAreTaggedAsGradients) {
  auto gradient_bytes = [] {
    for (const auto& t : memory::tag_stats())
      if (t.tag == "gradients") return t.allocated.current;
    return int64_t(0);
  };
  const int64_t before = gradient_bytes();
  Tensor w = uniform({64, 64}, -1, 1).requires_grad_();
  {
    memory::Tag tag("backward");
    sum(matmul(uniform({8, 64}, -1, 1), w)).backward();
  }
  EXPECT_EQ(gradient_bytes() - before, 64 * 64 * 4);
  w.zero_grad();
  EXPECT_EQ(gradient_bytes(), before);
}

TEST(Backward, ParameterUsedTwiceAccumulatesWithinOneBackward) {
  Tensor w = tensor<double>({1.5, -2.0}).requires_grad_();
  (sum(w * w) + sum(w * 3.0)).backward();  // d = 2w + 3
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{6.0, -1.0}));
}

// Loss = mean over the batch of a small MLP's squared output.
Tensor mlp_loss(const Tensor& x, const Tensor& w1, const Tensor& w2) {
  return mean(pow(matmul(relu(matmul(x, w1)), w2), 2.0));
}

// A non-leaf with several consumers: their gradients sum into one pending gradient, in place when nobody
// else sees it (the engine's accumulate), out of place when they share a buffer (add hands the same tensor to
// both of its inputs) or a saved tensor is the gradient.
TEST(Backward, GradientsOfManyConsumersSumCorrectly) {
  const Tensor x = uniform({3, 4}, -1, 1, DType::F64, 3).requires_grad_();
  const Tensor a = uniform({3, 4}, -1, 1, DType::F64, 4), b = uniform({3, 4}, -1, 1, DType::F64, 5);
  const Tensor h = x * 2.0;  // the node whose gradient is accumulated
  const Tensor y = sum(h * a) + sum(h * b) + sum(h + h) + sum(h * h);
  y.backward();
  // d/dx = 2 (a + b + 2 + 2 h)
  const Tensor expected = ((a + b) + 2.0 + h.detach() * 2.0) * 2.0;
  expect_close(x.grad(), expected.to_vector<double>(), {1e-12, 1e-12}, "sum of four consumers' gradients");
  // The upstream gradients are left as they were: a second backward through a retained graph agrees.
  x.zero_grad();
  const Tensor h2 = x * 2.0;
  const Tensor z = sum(h2 * a) + sum(h2 * a);
  z.backward({}, true);
  const auto first = x.grad().to_vector<double>();
  x.zero_grad();
  z.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), first);
  expect_close(x.grad(), (a * 4.0).to_vector<double>(), {1e-12, 1e-12}, "twice the same consumer");
}

TEST(Backward, AccumulatedMicroBatchesEqualOneBatch) {
  const Tensor x = uniform({128, 16}, -1, 1, DType::F32, 3);
  Tensor w1 = uniform({16, 32}, -0.5, 0.5, DType::F32, 4).requires_grad_();
  Tensor w2 = uniform({32, 4}, -0.5, 0.5, DType::F32, 5).requires_grad_();
  mlp_loss(x, w1, w2).backward();
  const auto full1 = w1.grad().to_vector<double>(), full2 = w2.grad().to_vector<double>();
  w1.zero_grad();
  w2.zero_grad();
  EXPECT_FALSE(w1.grad().defined());
  for (int i = 0; i < 4; ++i) (mlp_loss(x.narrow(0, 32 * i, 32), w1, w2) * 0.25).backward();
  expect_close(w1.grad(), full1, {1e-6, 1e-5}, "w1 accumulated");
  expect_close(w2.grad(), full2, {1e-6, 1e-5}, "w2 accumulated");
}

TEST(Backward, RetainGraphAndSecondBackward) {
  Tensor x = uniform({5}, 0.5, 1, DType::F64).requires_grad_();
  Tensor y = sum(exp(x));
  y.backward({}, true);
  y.backward();  // the graph was kept: gradients add up
  expect_close(x.grad(), (exp(x.detach()) * 2.0).to_vector<double>(), {1e-12, 1e-12}, "twice");
  expect_error<Error>([&] { y.backward(); }, {"backward", "sum", "second time", "retain_graph"});
}

TEST(Backward, ExplicitGradientForNonScalars) {
  Tensor x = uniform({2, 3}, -1, 1, DType::F64).requires_grad_();
  Tensor y = x * 2.0;
  expect_error<ShapeError>([&] { y.backward(); }, {"backward", "[2, 3]", "explicitly"});
  const Tensor g = uniform({2, 3}, -1, 1, DType::F64, 9);
  y.backward(g);
  expect_close(x.grad(), (g * 2.0).to_vector<double>(), {1e-12, 1e-12}, "explicit");
  expect_error<ShapeError>([&] { (x * 2.0).backward(ones({3}, DType::F64)); }, {"backward", "[3]", "[2, 3]"});
}

TEST(Backward, MisuseErrors) {
  expect_error<Error>([] { sum(ones({3})).backward(); }, {"backward", "does not require grad"});
  Tensor x = ones({2}).requires_grad_();
  Tensor y = x * 2.0;
  expect_error<Error>([&] { y.requires_grad_(); }, {"requires_grad_", "mul"});
  expect_error<DTypeError>([] { arange(3).requires_grad_(); }, {"requires_grad_", "i64"});
  expect_error<Error>([&] { x.add_(1.0); }, {"add_", "in-place", "NoGradGuard"});
  expect_error<Error>([&] { y.copy_(zeros({2})); }, {"copy_", "requires grad"});
  {
    NoGradGuard guard;
    x.add_(1.0);  // optimizer-style update: allowed
  }
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{2.f, 2.f}));
  EXPECT_EQ(x.grad_fn_name(), std::string(""));
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE(y.is_leaf());
}

TEST(Backward, InPlaceChangeOfASavedTensorIsAnError) {
  Tensor a = uniform({3}, 1, 2);
  Tensor w = uniform({3}, 1, 2).requires_grad_();
  Tensor y = sum(a * w);  // mul saves a
  a.add_(1.0);            // a needs no grad: the op itself is allowed
  expect_error<Error>([&] { y.backward(); }, {"mul", "modified by an in-place op"});
}

TEST(GradMode, NoGradAndInferenceRecordNothing) {
  Tensor w = ones({2}).requires_grad_();
  {
    NoGradGuard guard;
    Tensor y = w * 2.0;
    EXPECT_FALSE(y.requires_grad());
    {
      EnableGradGuard on;
      EXPECT_TRUE((w * 2.0).requires_grad());
    }
    EXPECT_FALSE((w * 2.0).requires_grad());
  }
  {
    InferenceMode guard;
    EXPECT_FALSE((w * 2.0).requires_grad());
    EnableGradGuard cannot;  // inference cannot be re-enabled
    EXPECT_FALSE((w * 2.0).requires_grad());
  }
  EXPECT_TRUE((w * 2.0).requires_grad());
}

TEST(Backward, DetachAndRetainGrad) {
  Tensor x = tensor<double>({1.0, 2.0}).requires_grad_();
  Tensor h = x * 3.0;
  h.retain_grad();
  Tensor y = sum(h * h.detach());  // the detached factor is a constant
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{9.0, 18.0}));  // 3 * h
  EXPECT_EQ(h.grad().to_vector<double>(), (std::vector<double>{3.0, 6.0}));   // h.detach()
  EXPECT_FALSE(h.detach().requires_grad());
  EXPECT_EQ(h.detach().storage(), h.storage());
}

TEST(Backward, HundredThousandOpChain) {
  Tensor x = scalar_tensor(1.0, DType::F64).requires_grad_();
  Tensor y = x;
  for (int i = 0; i < 100000; ++i) y = y * 1.00001;
  y.backward();  // iterative: no recursion over 100,000 nodes
  EXPECT_NEAR(x.grad().item<double>(), std::pow(1.00001, 100000), 1e-9 * std::pow(1.00001, 100000));
  // Dropping a long graph without running backward releases it iteratively too.
  Tensor z = x;
  for (int i = 0; i < 100000; ++i) z = z + 1.0;
  z = Tensor();
  SUCCEED();
}

TEST(Backward, MemoryFallsAsNodesRelease) {
  // 12 layers of tanh over 256 KiB activations: each node keeps its output until its backward has run. A pair
  // of hooks that keep tensors as they are samples the arena while backward unpacks them.
  std::vector<int64_t> during;
  Tensor x = uniform({256, 256}, -1, 1).requires_grad_();
  Tensor y;
  {
    autograd::SavedTensorHooks hooks([](const Tensor& t) -> std::any { return t; },
                                     [&](const std::any& p) -> Tensor {
                                       during.push_back(memory::stats().allocated.current);
                                       return std::any_cast<Tensor>(p);
                                     });
    y = x;
    for (int i = 0; i < 12; ++i) y = tanh(y);
    y = sum(y);
  }
  const int64_t before = memory::stats().allocated.current;
  y.backward();
  ASSERT_EQ(during.size(), 12u);
  const int64_t activation = 256 * 256 * 4;
  EXPECT_LE(during.front(), before + 2 * activation);
  // By the last node, the other 11 saved activations have gone back to the arena.
  EXPECT_LE(during.back(), during.front() - 10 * activation);
}

TEST(SavedTensorHooks, PackToBF16AndBack) {
  const Tensor x = uniform({64, 64}, -1, 1, DType::F32, 12);
  Tensor w = uniform({64, 64}, -1, 1, DType::F32, 13).requires_grad_();
  sum(tanh(matmul(x, w))).backward();
  const auto plain = w.grad().to_vector<double>();
  w.zero_grad();
  int packed = 0;
  {
    autograd::SavedTensorHooks hooks(
        [&](const Tensor& t) -> std::any {
          ++packed;
          return t.to(DType::BF16);
        },
        [](const std::any& p) -> Tensor { return std::any_cast<Tensor>(p).to(DType::F32); });
    Tensor y = sum(tanh(matmul(x, w)));
    EXPECT_GE(packed, 3);  // matmul's x and w, tanh's output
    y.backward();
  }
  expect_close(w.grad(), plain, {0.3, 0.02}, "bf16-packed activations");
  EXPECT_NE(w.grad().to_vector<double>(), plain);  // the packing really happened
}

}  // namespace
}  // namespace frugal
