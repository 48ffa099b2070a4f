// CausalSelfAttention, TransformerBlock and GPT (nn/attention.h, nn/gpt.h): shapes, causality, gradients by
// finite differences, the W3 parameter count, a training step, recompute, and sampling.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "nn/attention.h"
#include "nn/gpt.h"
#include "tests/autograd/gradcheck_helpers.h"
#include "tests/nn/gpt_fixture.h"

namespace frugal::testing {
namespace {

namespace F = nn::functional;

TEST(CausalSelfAttention, OutputShapeAndParameters) {
  nn::CausalSelfAttention attn(16, 4);
  const Tensor y = attn(uniform({3, 5, 16}, -1, 1));
  EXPECT_EQ(y.shape(), (Shape{3, 5, 16}));
  EXPECT_EQ(attn->qkv->weight.shape(), (Shape{48, 16}));
  EXPECT_EQ(attn->num_parameters(), 16 * 48 + 48 + 16 * 16 + 16);
}

TEST(CausalSelfAttention, FutureTokensDoNotChangeEarlierOutputs) {
  manual_seed(3);
  nn::CausalSelfAttention attn(16, 4);
  const Tensor x = uniform({2, 6, 16}, -1, 1, DType::F32, 4);
  Tensor x2 = x.clone();
  Tensor tail = x2.narrow(1, 4, 2);
  ops::fill_(tail, 5.0);
  NoGradGuard no_grad;
  const auto y1 = attn(x).to_vector<double>(), y2 = attn(x2).to_vector<double>();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 6; ++t) {
      bool same = true;
      for (int64_t c = 0; c < 16; ++c)
        same = same && y1[size_t((b * 6 + t) * 16 + c)] == y2[size_t((b * 6 + t) * 16 + c)];
      EXPECT_EQ(same, t < 4) << "batch " << b << " position " << t;
    }
}

TEST(CausalSelfAttention, GradcheckF64) {
  manual_seed(5);
  nn::CausalSelfAttention attn(8, 2);
  attn->to(DType::F64);
  const Tensor x = leaf({2, 4, 8}, -1, 1, 6, Layout::Strided);
  // gradcheck perturbs its inputs in place, so the module's own parameters can be checked as inputs.
  expect_grads_ok([&](const std::vector<Tensor>& in) { return attn(in[0]); },
                  {x, attn->qkv->weight, attn->qkv->bias, attn->proj->weight}, "attention");
}

TEST(TransformerBlock, GradcheckF64AndShape) {
  manual_seed(7);
  nn::TransformerBlock block(8, 2);
  block->to(DType::F64);
  const Tensor x = leaf({2, 3, 8}, -1, 1, 8);
  EXPECT_EQ(block(x).shape(), x.shape());
  expect_grads_ok([&](const std::vector<Tensor>& in) { return block(in[0]); },
                  {x, block->ln1->weight, block->attn->qkv->weight, block->fc->weight, block->fc_proj->bias},
                  "block");
}

TEST(GPT, ParameterCountOfW3) {
  // By hand, d = 128, V = 114, context 64, 4 layers: embeddings V d + 64 d = 14592 + 8192; per block
  // 2 LayerNorms 4 d = 512, qkv 3 d^2 + 3 d = 49536, proj d^2 + d = 16512, fc 4 d^2 + 4 d = 66048,
  // fc_proj 4 d^2 + d = 65664 (198272 = 12 d^2 + 13 d); final LayerNorm 2 d = 256; head d V + V = 14706.
  const int64_t expected = 14592 + 8192 + 4 * 198272 + 256 + 14706;
  EXPECT_EQ(expected, 830834);
  nn::GPT gpt(nn::GPTConfig{.vocab = 114});
  EXPECT_EQ(gpt->num_parameters(), expected);
  EXPECT_EQ(gpt->config.d_model, 128);
  EXPECT_EQ(gpt->config.context, 64);
  EXPECT_EQ(gpt->blocks->size(), 4u);
}

nn::GPTConfig tiny() { return {.vocab = 13, .d_model = 16, .n_layers = 2, .n_heads = 2, .context = 8}; }

TEST(GPT, ForwardShape) {
  nn::GPT gpt(tiny());
  const Tensor logits = gpt->forward(randint(0, 13, {3, 8}));
  EXPECT_EQ(logits.shape(), (Shape{3, 8, 13}));
  EXPECT_EQ(gpt->forward(randint(0, 13, {2, 1})).shape(), (Shape{2, 1, 13}));
}

TEST(GPT, BadInputs) {
  nn::GPT gpt(tiny());
  expect_error<ShapeError>([&] { gpt->forward(randint(0, 13, {2, 9})); }, {"GPT", "context = 8", "[2, 9]"});
  expect_error<ShapeError>([&] { gpt->forward(randn({2, 4})); }, {"GPT", "i64 [B, T]", "f32"});
  expect_error<Error>([] { nn::GPT(nn::GPTConfig{.vocab = 10, .d_model = 10, .n_heads = 4}); },
                      {"GPT", "multiple of n_heads"});
  expect_error<Error>([&] { gpt->generate(randint(0, 13, {1, 2}), 3, 0.0); }, {"generate", "temperature"});
  expect_error<Error>([&] { gpt->generate(randint(0, 13, {1, 2}), 3, 1.0, 14); }, {"generate", "top_k"});
}

Tensor lm_loss(nn::GPT& gpt, const Tensor& tokens, const Tensor& targets) {
  const int64_t v = gpt->config.vocab;
  return F::cross_entropy(gpt->forward(tokens).reshape({-1, v}), targets.reshape({-1}));
}

TEST(GPT, TrainingStepLowersTheLoss) {
  manual_seed(11);
  nn::GPT gpt(tiny());
  Generator g(12);
  const Tensor tokens = randint(0, 13, {4, 8}, DType::I64, &g),
               targets = randint(0, 13, {4, 8}, DType::I64, &g);
  optim::Adam opt(gpt->parameters(), optim::AdamOptions(3e-3));
  const Tensor before = lm_loss(gpt, tokens, targets);
  before.backward();
  opt.step();
  opt.zero_grad();
  NoGradGuard no_grad;
  const double after = lm_loss(gpt, tokens, targets).item<double>();
  EXPECT_LT(after, before.item<double>());
  EXPECT_NEAR(before.item<double>(), std::log(13.0), 1.0);  // near uniform at initialisation
}

// Losses of the first AdamW steps match PyTorch's on the same weights and batch (tests/fixtures/
// gen_gpt_golden.py documents the weights and data; tests/nn/gpt_fixture.h fills the weights).
TEST(GPT, GoldenLossesMatchPyTorch) {
  std::ifstream in(std::string(FRUGAL_FIXTURES_DIR) + "/gpt_golden.json");
  ASSERT_TRUE(in) << "missing tests/fixtures/gpt_golden.json";
  const auto golden = nlohmann::json::parse(in);
  const auto& c = golden["config"];
  nn::GPT gpt(nn::GPTConfig{.vocab = c["vocab"],
                            .d_model = c["d_model"],
                            .n_layers = c["n_layers"],
                            .n_heads = c["n_heads"],
                            .context = c["context"]});
  fill_gpt_hashed(*gpt, golden["params"].get<std::vector<std::string>>());
  if (HasFatalFailure()) return;
  const int64_t b = c["batch"], t = c["context"], v = c["vocab"];
  std::vector<int64_t> tok(size_t(b * t)), tgt(size_t(b * t));
  for (int64_t i = 0; i < b * t; ++i) tok[size_t(i)] = (i * 7 + 3) % v, tgt[size_t(i)] = (i * 5 + 1) % v;
  const Tensor tokens = tensor(tok, {b, t}), targets = tensor(tgt, {b, t});
  optim::AdamW opt(gpt->parameters(), optim::AdamWOptions(1e-3));
  const auto expected = golden["losses"].get<std::vector<double>>();
  for (size_t step = 0; step < expected.size(); ++step) {
    opt.zero_grad();
    const Tensor loss = lm_loss(gpt, tokens, targets);
    loss.backward();
    opt.step();
    EXPECT_NEAR(loss.item<double>(), expected[step], 2e-5 * expected[step]) << "step " << step;
  }
}

TEST(GPT, RecomputeGivesBitIdenticalGradients) {
  nn::GPTConfig c = tiny();
  c.dropout = 0.1;  // the segments must replay the dropout masks too
  manual_seed(13);
  nn::GPT gpt(c);
  Generator g(14);
  const Tensor tokens = randint(0, 13, {3, 8}, DType::I64, &g),
               targets = randint(0, 13, {3, 8}, DType::I64, &g);
  std::vector<std::vector<double>> grads[2];
  double losses[2];
  for (int run = 0; run < 2; ++run) {
    gpt->recompute(run == 1);
    gpt->zero_grad();
    manual_seed(15);
    const Tensor loss = lm_loss(gpt, tokens, targets);
    loss.backward();
    losses[run] = loss.item<double>();
    for (const Tensor& p : gpt->parameters()) grads[run].push_back(p.grad().to_vector<double>());
  }
  EXPECT_EQ(losses[0], losses[1]);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_EQ(grads[0][i], grads[1][i]) << "parameter " << i;
}

TEST(GPT, GenerateCropsTheContextAndIsReproducible) {
  manual_seed(17);
  nn::GPT gpt(tiny());
  const Tensor prompt = randint(0, 13, {2, 3});
  Generator g1(21), g2(21), g3(22);
  const Tensor a = gpt->generate(prompt, 20, 0.9, 5, &g1);  // 23 > context 8: the window is cropped
  const Tensor b = gpt->generate(prompt, 20, 0.9, 5, &g2);
  const Tensor c = gpt->generate(prompt, 20, 0.9, 5, &g3);
  ASSERT_EQ(a.shape(), (Shape{2, 23}));
  EXPECT_EQ(a.dtype(), DType::I64);
  EXPECT_EQ(a.to_vector<int64_t>(), b.to_vector<int64_t>());
  EXPECT_NE(a.to_vector<int64_t>(), c.to_vector<int64_t>());
  EXPECT_EQ(a.narrow(1, 0, 3).contiguous().to_vector<int64_t>(), prompt.to_vector<int64_t>());
  for (int64_t tok : a.to_vector<int64_t>()) {
    EXPECT_GE(tok, 0);
    EXPECT_LT(tok, 13);
  }
  EXPECT_TRUE(gpt->is_training());  // restored after sampling in eval mode
}

TEST(GPT, GenerateWithTopKOneIsGreedy) {
  manual_seed(19);
  nn::GPT gpt(tiny());
  const Tensor prompt = randint(0, 13, {5});
  const Tensor out = gpt->generate(prompt, 1, 1.0, 1);
  ASSERT_EQ(out.shape(), (Shape{6}));
  NoGradGuard no_grad;
  const Tensor last = gpt->forward(prompt.unsqueeze(0)).select(1, 4).squeeze(0);
  EXPECT_EQ(out.to_vector<int64_t>()[5], argmax(last).item<int64_t>());
}

}  // namespace
}  // namespace frugal::testing
