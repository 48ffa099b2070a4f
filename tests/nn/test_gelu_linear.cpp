// The GELU-then-linear op (frugal::gelu_linear, behind F::gelu_linear and the transformer block's MLP)
// against the layers it replaces, F::linear(gelu(x)): outputs and gradients bit for bit in f32, bf16 and
// f64 (the same ops on the same operands), both GELU forms, leading dims, strided inputs, no bias, some
// gradients not needed; finite differences in f64; what it keeps (x, not gelu(x)); the transformer block's
// gradients unchanged; bad inputs.
#include <any>

#include "nn/attention.h"
#include "tests/autograd/gradcheck_helpers.h"
#include "tests/nn/linear_case.h"

namespace frugal {
namespace {

namespace F = nn::functional;
using testing::expect_error;
using testing::uniform;

const std::vector<testing::LinearCase> kCases = {
    {{5, 7}, 3, true, false, false},      {{5, 7}, 3, false, false, false},
    {{2, 3, 4}, 6, true, false, false},   {{6, 5}, 4, true, true, false},
    {{6, 5}, 4, true, false, true},       {{300, 64}, 96, true, false, false},
    {{64, 512}, 128, true, false, false},
};

TEST(GeluLinear, IsLinearOfGeluBitForBit) {
  for (const std::string approximate : {"none", "tanh"})
    for (DType t : {DType::F32, DType::BF16, DType::F64})
      for (const testing::LinearCase& c : kCases) {
        const auto got = testing::run(c, t, [&](const Tensor& x, const Tensor& w, const Tensor& b) {
          return F::gelu_linear(x, w, b, approximate);
        });
        const auto ref = testing::run(c, t, [&](const Tensor& x, const Tensor& w, const Tensor& b) {
          return F::linear(approximate == "tanh" ? gelu_tanh(x) : gelu(x), w, b);
        });
        const char* names[] = {"y", "dx", "dweight", "dbias"};
        ASSERT_EQ(got.size(), ref.size());
        for (size_t i = 0; i < got.size(); ++i) {
          const std::string what = name(c) + " " + dtype_name(t) + " " + approximate + " " + names[i];
          ASSERT_EQ(got[i].defined(), ref[i].defined()) << what;
          if (!got[i].defined()) continue;
          EXPECT_EQ(got[i].dtype(), t) << what;
          EXPECT_EQ(got[i].to_vector<double>(), ref[i].to_vector<double>()) << what;
        }
      }
}

TEST(GeluLinear, OnlySomeGradients) {
  for (int need = 1; need < 8; ++need) {
    Tensor x = uniform({6, 8}, -2, 2, DType::F32, 1), w = uniform({5, 8}, -1, 1, DType::F32, 2),
           b = uniform({5}, -1, 1, DType::F32, 3);
    if (need & 1) x.requires_grad_();
    if (need & 2) w.requires_grad_();
    if (need & 4) b.requires_grad_();
    F::gelu_linear(x, w, b).sum().backward();
    const std::vector<Tensor> got = {x.grad(), w.grad(), b.grad()};
    Tensor x2 = x.detach(), w2 = w.detach(), b2 = b.detach();
    if (need & 1) x2.requires_grad_();
    if (need & 2) w2.requires_grad_();
    if (need & 4) b2.requires_grad_();
    F::linear(gelu(x2), w2, b2).sum().backward();
    const std::vector<Tensor> ref = {x2.grad(), w2.grad(), b2.grad()};
    for (size_t i = 0; i < 3; ++i) {
      ASSERT_EQ(got[i].defined(), bool(need & (1 << i))) << need << " " << i;
      if (got[i].defined()) {
        EXPECT_EQ(got[i].to_vector<float>(), ref[i].to_vector<float>()) << need << " " << i;
      }
    }
  }
}

TEST(GeluLinear, Gradcheck) {
  for (const std::string approximate : {"none", "tanh"}) {
    testing::expect_grads_ok(
        [&](const std::vector<Tensor>& in) { return F::gelu_linear(in[0], in[1], in[2], approximate); },
        {testing::leaf({4, 5}, -2, 2, 5), testing::leaf({3, 5}, -1, 1, 6), testing::leaf({3}, -1, 1, 7)},
        "gelu_linear " + approximate);
    testing::expect_grads_ok(
        [&](const std::vector<Tensor>& in) { return F::gelu_linear(in[0], in[1], {}, approximate); },
        {testing::leaf({2, 3, 4}, -2, 2, 8), testing::leaf({2, 4}, -1, 1, 9)}, "gelu_linear 3-d no bias");
  }
}

// It keeps x and the weight, not gelu(x); the transformer block's MLP runs it.
TEST(GeluLinear, KeepsTheGelusInputOnly) {
  const Tensor x = uniform({16, 32}, -2, 2).requires_grad_(), w = uniform({8, 32}, -1, 1).requires_grad_();
  std::vector<Tensor> kept;
  {
    testing::SavedTensors saved;
    const Tensor y = F::gelu_linear(x, w);
    EXPECT_EQ(y.grad_fn_name(), std::string("gelu_linear"));
    kept = saved.kept;
  }
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].raw_data(), x.raw_data()) << "x itself, not gelu(x)";
  EXPECT_EQ(kept[1].raw_data(), w.raw_data());
  // The block keeps one tensor of the hidden width (4 x 32) a token: the GELU's input.
  nn::TransformerBlock block(32, 4);
  const Tensor h = uniform({2, 5, 32}, -1, 1).requires_grad_();
  int hidden = 0;
  autograd::SavedTensorHooks hooks(
      [&hidden](const Tensor& t) -> std::any {
        hidden += t.numel() == 10 * 128 && t.size(-1) == 128;
        return t;
      },
      [](const std::any& a) { return std::any_cast<Tensor>(a); });
  (void)block->forward(h);
  EXPECT_EQ(hidden, 1);
}

// The block fuses only modules of exactly its classes: a subclass's forward runs (as Sequential's
// linear_relu does), with the same values.
struct CountingLinear : nn::LinearImpl {
  using nn::LinearImpl::LinearImpl;
  Tensor forward(const Tensor& x) override {
    ++calls;
    return nn::LinearImpl::forward(x);
  }
  int calls = 0;
};

TEST(GeluLinear, TheBlockRunsASubclasssForward) {
  manual_seed(4);
  nn::TransformerBlock block(32, 4);
  const Tensor h = uniform({2, 5, 32}, -1, 1);
  const std::vector<double> fused = block->forward(h).to_vector<double>();
  for (nn::Linear* slot : {&block->fc, &block->fc_proj, &block->attn->qkv}) {
    nn::Linear original = *slot;
    auto counting = std::make_shared<CountingLinear>((*slot)->options);
    {
      NoGradGuard no_grad;
      counting->weight.copy_(original->weight);
      counting->bias.copy_(original->bias);
    }
    *slot = nn::Linear(counting);
    EXPECT_EQ(block->forward(h).to_vector<double>(), fused);
    EXPECT_EQ(counting->calls, 1);
    *slot = original;
  }
}

TEST(GeluLinear, BadInputs) {
  const Tensor x = uniform({4, 3}, -1, 1), w = uniform({2, 3}, -1, 1);
  expect_error<Error>([&] { F::gelu_linear(x, w, {}, "erf"); }, {"gelu_linear", "approximate", "erf"});
  expect_error<ShapeError>(
      [&] {
        F::gelu_linear(x, uniform({2, 4}, -1, 1));
      },
      {"linear", "[4, 3]", "[2, 4]"});
  expect_error<DTypeError>([&] { F::gelu_linear(x.to(DType::I64), w.to(DType::I64)); }, {"i64"});
}

}  // namespace
}  // namespace frugal
