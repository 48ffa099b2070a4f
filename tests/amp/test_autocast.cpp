// Autocast (amp/autocast.h): the dtype each op runs in under the policy, nested and disabled guards, no-grad,
// the cache of weight casts (one cast node per weight per forward), gradients reaching f32 parameters, and
// recompute segments replayed under the autocast state they first ran with.
#include <cmath>
#include <set>

#include "tests/test_util.h"

namespace frugal {
namespace {

namespace F = nn::functional;
using testing::expect_error;
using testing::uniform;

// The nodes of the graph behind t named `name` (and, with `leaf`, taking that leaf as an input), each counted
// once.
int count_nodes(const Tensor& t, const std::string& name, const Tensor& leaf = {}) {
  std::set<const autograd::Node*> seen;
  std::vector<const autograd::Node*> todo;
  if (t.autograd_meta() && t.autograd_meta()->grad_fn) todo.push_back(t.autograd_meta()->grad_fn.get());
  int n = 0;
  while (!todo.empty()) {
    const autograd::Node* node = todo.back();
    todo.pop_back();
    if (!seen.insert(node).second) continue;
    bool of_leaf = !leaf.defined();
    for (const auto& e : node->inputs) of_leaf = of_leaf || (e.leaf && e.leaf == leaf.autograd_meta());
    if (name == node->name && of_leaf) ++n;
    for (const auto& e : node->inputs)
      if (e.fn) todo.push_back(e.fn.get());
  }
  return n;
}

// The dtype each op of Note [autocast policy] returns under a guard of `low`, for f32 (and f16/bf16) inputs.
void check_policy(DType low) {
  const Tensor a = uniform({4, 8}, -1, 1), b = uniform({8, 3}, -1, 1);
  const Tensor w = uniform({3, 8}, -1, 1), bias = uniform({3}, -1, 1);
  const Tensor img = uniform({2, 3, 6, 6}, -1, 1), kernel = uniform({4, 3, 3, 3}, -1, 1);
  const Tensor h = uniform({4, 8}, 0.5, 1.5, low);  // a low-precision activation
  const Tensor labels = tensor<int64_t>({0, 2, 1, 7});
  amp::Autocast guard(low);
  ASSERT_TRUE(amp::is_autocast_enabled());
  ASSERT_EQ(amp::autocast_dtype(), low);
  // Low precision: GEMM-like ops, whatever their floating inputs (not f64).
  EXPECT_EQ(matmul(a, b).dtype(), low);
  EXPECT_EQ(matmul(h, b).dtype(), low);
  EXPECT_EQ(F::linear(a, w, bias).dtype(), low);
  EXPECT_EQ(conv2d(img, kernel, uniform({4}, -1, 1), 1, 1).dtype(), low);
  EXPECT_EQ(matmul(a.to(DType::F64), b.to(DType::F64)).dtype(), DType::F64);
  // f32: numerically sensitive ops, also for low-precision inputs.
  EXPECT_EQ(softmax(h, -1).dtype(), DType::F32);
  EXPECT_EQ(log_softmax(h, -1).dtype(), DType::F32);
  EXPECT_EQ(sum(h).dtype(), DType::F32);
  EXPECT_EQ(h.sum({1}).dtype(), DType::F32);
  EXPECT_EQ(mean(h).dtype(), DType::F32);
  EXPECT_EQ(var(h, {1}).dtype(), DType::F32);
  EXPECT_EQ(exp(h).dtype(), DType::F32);
  EXPECT_EQ(log(h).dtype(), DType::F32);
  EXPECT_EQ(rsqrt(h).dtype(), DType::F32);
  EXPECT_EQ(pow(h, 2.0).dtype(), DType::F32);
  EXPECT_EQ(pow(h, h).dtype(), DType::F32);
  EXPECT_EQ(F::layer_norm(h, {8}, ones({8}), zeros({8})).dtype(), DType::F32);
  EXPECT_EQ(F::batch_norm(h, zeros({8}), ones({8}), ones({8}), zeros({8}), true).dtype(), DType::F32);
  EXPECT_EQ(F::cross_entropy(h, labels).dtype(), DType::F32);
  EXPECT_EQ(F::cross_entropy_composite(h, labels).dtype(), DType::F32);
  EXPECT_EQ(F::nll_loss(h, labels).dtype(), DType::F32);
  EXPECT_EQ(F::mse_loss(h, h).dtype(), DType::F32);
  EXPECT_EQ(F::l1_loss(h, h).dtype(), DType::F32);
  EXPECT_EQ(F::kl_div(h, h).dtype(), DType::F32);
  EXPECT_EQ(F::binary_cross_entropy_with_logits(h, h).dtype(), DType::F32);
  // The widest input: every other op.
  EXPECT_EQ(add(h, h).dtype(), low);
  EXPECT_EQ(add(h, a).dtype(), DType::F32);
  EXPECT_EQ(mul(h, 2.0).dtype(), low);
  EXPECT_EQ(relu(h).dtype(), low);
  EXPECT_EQ(gelu(h).dtype(), low);
  EXPECT_EQ(sqrt(h).dtype(), low);
  EXPECT_EQ(max(h).dtype(), low);
  EXPECT_EQ(F::dropout(h, 0.5).dtype(), low);
  EXPECT_EQ(cat({h, h}).dtype(), low);
  EXPECT_EQ(F::attention_scores_softmax(uniform({2, 4, 4}, -1, 1, low), 0.5, true).dtype(), low);
  EXPECT_EQ(F::attention_scores_softmax(uniform({2, 4, 4}, -1, 1), 0.5, true).dtype(), DType::F32);
}

TEST(Autocast, DtypeOfEachOpBf16) { check_policy(DType::BF16); }
TEST(Autocast, DtypeOfEachOpF16) { check_policy(DType::F16); }

TEST(Autocast, NoGradFollowsThePolicy) {
  const Tensor a = uniform({4, 8}, -1, 1).requires_grad_(), b = uniform({8, 3}, -1, 1);
  amp::Autocast guard(DType::BF16);
  NoGradGuard no_grad;
  EXPECT_EQ(matmul(a, b).dtype(), DType::BF16);
  EXPECT_EQ(softmax(matmul(a, b), -1).dtype(), DType::F32);
  InferenceMode inference;
  EXPECT_EQ(matmul(a, b).dtype(), DType::BF16);
}

TEST(Autocast, OffOutsideAGuard) {
  EXPECT_FALSE(amp::is_autocast_enabled());
  const Tensor a = uniform({4, 8}, -1, 1), b = uniform({8, 3}, -1, 1);
  EXPECT_EQ(matmul(a, b).dtype(), DType::F32);
  EXPECT_EQ(softmax(a.to(DType::BF16), -1).dtype(), DType::BF16);  // as the op itself defines it
  EXPECT_EQ(F::cross_entropy(a.to(DType::BF16), tensor<int64_t>({0, 1, 2, 3})).dtype(), DType::BF16);
}

TEST(Autocast, NestedAndDisabledGuardsRestoreTheState) {
  const Tensor a = uniform({4, 8}, -1, 1), b = uniform({8, 3}, -1, 1);
  {
    amp::Autocast outer(DType::BF16);
    EXPECT_EQ(matmul(a, b).dtype(), DType::BF16);
    {
      amp::Autocast inner(DType::F16);
      EXPECT_EQ(matmul(a, b).dtype(), DType::F16);
      {
        amp::Autocast off(DType::F16, /*enabled=*/false);
        EXPECT_FALSE(amp::is_autocast_enabled());
        EXPECT_EQ(matmul(a, b).dtype(), DType::F32);
        EXPECT_EQ(softmax(a.to(DType::F16), -1).dtype(), DType::F16);
      }
      EXPECT_EQ(matmul(a, b).dtype(), DType::F16);
    }
    EXPECT_EQ(amp::autocast_dtype(), DType::BF16);
    EXPECT_EQ(matmul(a, b).dtype(), DType::BF16);
    {
      amp::Autocast off(DType::BF16, false);
      EXPECT_EQ(matmul(a, b).dtype(), DType::F32);
    }
    EXPECT_TRUE(amp::is_autocast_enabled());
  }
  EXPECT_FALSE(amp::is_autocast_enabled());
  EXPECT_EQ(matmul(a, b).dtype(), DType::F32);
}

TEST(Autocast, RejectsNonHalfDtypes) {
  expect_error<DTypeError>([] { amp::Autocast guard(DType::F32); }, {"amp::Autocast", "f16 or bf16", "f32"});
  expect_error<DTypeError>([] { amp::Autocast guard(DType::I64, false); }, {"i64"});
  EXPECT_FALSE(amp::is_autocast_enabled());  // a refused guard changed nothing
}

TEST(Autocast, AWeightUsedTwiceIsCastOnce) {
  Tensor w = uniform({8, 8}, -0.5, 0.5).requires_grad_();
  const Tensor x = uniform({4, 8}, -1, 1);
  Tensor loss;
  {
    amp::Autocast guard(DType::BF16);
    const Tensor h = F::linear(F::linear(x, w), w);  // the same weight twice
    EXPECT_EQ(amp::cached_casts(), 1);
    {
      amp::Autocast off(DType::BF16, false);  // a disabled guard inside keeps the cache
    }
    EXPECT_EQ(amp::cached_casts(), 1);
    loss = sum(relu(matmul(h, w)));  // and a third time
    EXPECT_EQ(amp::cached_casts(), 1);
  }
  EXPECT_EQ(amp::cached_casts(), 0);           // emptied when the outermost guard exits
  EXPECT_EQ(count_nodes(loss, "cast", w), 1);  // one cast of the weight, used three times
  EXPECT_EQ(count_nodes(loss, "linear"), 2);   // F::linear's fused op
  EXPECT_EQ(count_nodes(loss, "matmul"), 1);
  EXPECT_EQ(count_nodes(loss, "cast"), 2);  // and the other: relu's bf16 output cast up for sum
  // Each use of the weight gets its gradient, through the one cast.
  loss.backward();
  const Tensor g_amp = w.grad();
  ASSERT_TRUE(g_amp.defined());
  EXPECT_EQ(g_amp.dtype(), DType::F32);
  w.zero_grad();
  sum(relu(matmul(F::linear(F::linear(x, w), w), w))).backward();
  testing::expect_close(g_amp, w.grad().to_vector<double>(), {0.05, 0.05}, "gradient through the cast");

  // Without the weight requiring grad nothing is cached (an activation is cast where it is used).
  {
    amp::Autocast guard(DType::BF16);
    const Tensor c = uniform({8, 8}, -1, 1);
    (void)matmul(matmul(x, c), c);
    EXPECT_EQ(amp::cached_casts(), 0);
  }
}

TEST(Autocast, CacheSurvivesBackwardNoGradAndInPlaceChanges) {
  Tensor w = uniform({8, 8}, -0.5, 0.5).requires_grad_();
  const Tensor x = uniform({4, 8}, -1, 1);
  amp::Autocast guard(DType::BF16);
  // A forward under no-grad first: its cast has no node and must not be reused once recording.
  {
    NoGradGuard no_grad;
    (void)matmul(x, w);
  }
  sum(matmul(x, w)).backward();
  ASSERT_TRUE(w.grad().defined());
  const auto g1 = w.grad().to_vector<float>();
  // A second iteration in the same region: the cached cast's node was released by the first backward.
  w.zero_grad();
  sum(matmul(x, w)).backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().to_vector<float>(), g1);
  // The weight changes in place (an optimizer step): the cast is made again from the new values.
  {
    NoGradGuard no_grad;
    ops::mul_(w, 2.0);
  }
  const Tensor y = matmul(x, w);
  const Tensor expected = ops::matmul(x.to(DType::BF16), w.detach().to(DType::BF16));
  EXPECT_EQ(y.to_vector<float>(), expected.to_vector<float>());
}

TEST(Autocast, GradientsReachF32ParametersInF32) {
  Tensor w1 = uniform({16, 8}, -0.3, 0.3, DType::F32, 3).requires_grad_();
  Tensor b1 = uniform({16}, -0.1, 0.1, DType::F32, 4).requires_grad_();
  Tensor w2 = uniform({5, 16}, -0.3, 0.3, DType::F32, 5).requires_grad_();
  const Tensor x = uniform({32, 8}, -1, 1, DType::F32, 6);
  const Tensor y = randint(0, 5, {32});
  auto loss_of = [&] { return F::cross_entropy(F::linear(gelu(F::linear(x, w1, b1)), w2), y); };
  loss_of().backward();
  std::vector<std::vector<double>> ref;
  for (Tensor* p : {&w1, &b1, &w2}) {
    ref.push_back(p->grad().to_vector<double>());
    p->zero_grad();
  }
  for (DType low : {DType::BF16, DType::F16}) {
    Tensor loss;
    {
      amp::Autocast guard(low);
      loss = loss_of();
    }
    EXPECT_EQ(loss.dtype(), DType::F32);
    loss.backward();
    const double tol = low == DType::BF16 ? 2e-2 : 3e-3;
    size_t i = 0;
    for (Tensor* p : {&w1, &b1, &w2}) {
      ASSERT_TRUE(p->grad().defined());
      EXPECT_EQ(p->grad().dtype(), DType::F32);
      testing::expect_close(p->grad(), ref[i++], {tol, tol}, std::string("gradient in ") + dtype_name(low));
      p->zero_grad();
    }
  }
}

TEST(Autocast, BackwardInsideTheGuardRunsWithoutIt) {
  Tensor w = uniform({8, 8}, -0.5, 0.5).requires_grad_();
  const Tensor x = uniform({4, 8}, -1, 1);
  Tensor loss;
  {
    amp::Autocast guard(DType::BF16);
    loss = sum(relu(matmul(x, w)));
  }
  loss.backward(Tensor(), /*retain_graph=*/true);
  const auto outside = w.grad().to_vector<float>();
  w.zero_grad();
  {
    amp::Autocast guard(DType::F16);  // would change the rules' dtypes if they ran under it
    loss.backward();
  }
  EXPECT_EQ(w.grad().to_vector<float>(), outside);
}

// A small transformer-like block: linear, gelu, linear, a layer norm and a loss inside recompute segments.
TEST(Autocast, RecomputeReplaysUnderTheFirstRunsState) {
  std::vector<Tensor> params;
  for (int i = 0; i < 3; ++i) {
    params.push_back(uniform({16, 16}, -0.3, 0.3, DType::F32, 10 + uint64_t(i)).requires_grad_());
    params.push_back(uniform({16}, -0.1, 0.1, DType::F32, 20 + uint64_t(i)).requires_grad_());
  }
  const Tensor x = uniform({8, 16}, -1, 1, DType::F32, 30);
  auto block = [&](const Tensor& h, int i) {
    const Tensor& w = params[size_t(2 * i)];
    const Tensor& b = params[size_t(2 * i + 1)];
    return add(h, F::linear(gelu(F::layer_norm(h, {16})), w, b));
  };
  auto run = [&](bool segments) {
    for (auto& p : params) p.zero_grad();
    Tensor loss;
    {
      amp::Autocast guard(DType::BF16);
      Tensor h = x;
      for (int i = 0; i < 3; ++i) {
        if (segments)
          h = autograd::recompute([&, i](const std::vector<Tensor>& in) { return block(in[0], i); }, {h});
        else
          h = block(h, i);
      }
      loss = mean(mul(h, h));
    }
    loss.backward();  // outside the guard: the segments must cast as they first did
    std::vector<std::vector<float>> g;
    for (auto& p : params) g.push_back(p.grad().to_vector<float>());
    return g;
  };
  const auto plain = run(false);
  EXPECT_EQ(run(true), plain);  // bit for bit
}

}  // namespace
}  // namespace frugal
