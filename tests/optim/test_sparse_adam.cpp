// SparseAdam against torch.optim.SparseAdam (tests/fixtures/sparse_adam_reference.json, written by
// tests/fixtures/gen_sparse_adam.py), its lazy rows against dense Adam, state dicts, and the errors for
// mixing dense and sparse gradients.
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "autograd/sparse.h"
#include "frugal.h"
#include "optim/sparse_adam.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_close;
using testing::expect_error;

const nlohmann::json& reference() {
  static const nlohmann::json j = [] {
    const std::string path = std::string(FRUGAL_FIXTURES_DIR) + "/sparse_adam_reference.json";
    std::ifstream in(path);
    if (!in)
      throw std::runtime_error("cannot open " + path +
                               "; regenerate it with tests/fixtures/gen_sparse_adam.py");
    return nlohmann::json::parse(in);
  }();
  return j;
}

// The script's formulas (tests/fixtures/gen_sparse_adam.py).
constexpr int64_t kRows = 10, kDim = 4;
std::vector<int64_t> step_indices(int t) {
  std::vector<int64_t> idx;
  for (int k = 0; k < 3 + t % 4; ++k) idx.push_back((t * t + 3 * k * k) % 7 + (k % 2) * 3);
  return idx;
}
Tensor loss_weight(int t, int64_t n, DType dtype) {
  std::vector<double> w;
  for (int64_t k = 0; k < n; ++k)
    for (int64_t j = 0; j < kDim; ++j) w.push_back(std::cos(0.5 * t + 0.9 * double(k) + 1.7 * double(j)));
  return tensor(w, {n, kDim}).to(dtype);
}

void run_case(const nlohmann::json& c, DType dtype, testing::Tol tol) {
  const auto& ref = reference();
  nn::Embedding emb(nn::EmbeddingOptions(kRows, kDim).sparse(true));
  emb->to(dtype);
  {
    NoGradGuard no_grad;
    std::vector<double> w0;
    for (int64_t i = 0; i < kRows; ++i)
      for (int64_t j = 0; j < kDim; ++j) w0.push_back(std::sin(0.37 * double(kDim * i + j) + 0.2));
    expect_close(w0, ref["initial"].get<std::vector<double>>(), {1e-15, 1e-14}, "initial weight formula");
    emb->weight.copy_(tensor(w0, {kRows, kDim}));
  }
  const auto& o = c["options"];
  auto opts = optim::SparseAdamOptions(o["lr"].get<double>());
  if (o.contains("betas")) opts.betas({o["betas"][0].get<double>(), o["betas"][1].get<double>()});
  if (o.contains("eps")) opts.eps(o["eps"].get<double>());
  optim::SparseAdam opt(emb->parameters(), opts);
  for (int t = 1; t <= int(ref["steps"]); ++t) {
    ASSERT_EQ(step_indices(t), ref["indices"][size_t(t - 1)].get<std::vector<int64_t>>());
    opt.zero_grad();
    if (t % 7 != 0) {
      const Tensor idx = tensor(step_indices(t));
      sum(mul(emb(idx), loss_weight(t, idx.numel(), dtype))).backward();
    }
    opt.step();
    expect_close(emb->weight, c["weights"][size_t(t - 1)].get<std::vector<double>>(), tol,
                 c["name"].get<std::string>() + " " + dtype_name(dtype) + " step " + std::to_string(t));
    if (::testing::Test::HasFailure()) return;
  }
  // Steps 7 and 14 had no gradient: 18 updates counted.
  EXPECT_EQ(opt.state_dict().at("state.0.step").item<int64_t>(), 18);
}

TEST(SparseAdam, MatchesPyTorch) {
  for (const auto& c : reference()["cases"]) {
    run_case(c, DType::F64, {1e-12, 1e-6});
    run_case(c, DType::F32, {1e-5, 1e-4});
  }
}

// Rows a gradient never touches stay as they were, state included; touched rows move as dense Adam moves them
// on the first step (with a gradient that is dense on those rows, the two agree up to where eps is applied).
TEST(SparseAdam, OnlyTouchedRowsMove) {
  nn::Embedding emb(nn::EmbeddingOptions(20, 3).sparse(true));
  const Tensor before = emb->weight.detach().clone();
  optim::SparseAdam opt(emb->parameters(), optim::SparseAdamOptions(0.1));
  sum(emb(tensor<int64_t>({2, 7, 7}))).backward();
  opt.step();
  const auto b = before.to_vector<double>(), a = emb->weight.to_vector<double>();
  for (int64_t i = 0; i < 20; ++i)
    for (int64_t j = 0; j < 3; ++j) {
      const size_t k = size_t(i * 3 + j);
      if (i == 2 || i == 7)
        EXPECT_NEAR(a[k], b[k] - 0.1, 1e-6) << "row " << i;  // Adam's first step moves by lr * sign(g)
      else
        EXPECT_EQ(a[k], b[k]) << "row " << i;
    }
  const StateDict s = opt.state_dict();
  EXPECT_EQ(s.at("state.0.exp_avg").shape(), (Shape{20, 3}));
  EXPECT_EQ(abs(s.at("state.0.exp_avg").select(0, 3)).sum().item<double>(), 0.0);
}

TEST(SparseAdam, StateDictRoundTrip) {
  nn::Embedding a(nn::EmbeddingOptions(6, 2).sparse(true)), b(nn::EmbeddingOptions(6, 2).sparse(true));
  {
    NoGradGuard no_grad;
    b->weight.copy_(a->weight);
  }
  optim::SparseAdam opt_a(a->parameters(), optim::SparseAdamOptions(0.05));
  optim::SparseAdam opt_b(b->parameters(), optim::SparseAdamOptions(0.05));
  auto step = [](nn::Embedding& e, optim::SparseAdam& o, std::vector<int64_t> idx) {
    o.zero_grad();
    sum(e(tensor(idx))).backward();
    o.step();
  };
  step(a, opt_a, {1, 3});
  opt_b.load_state_dict(opt_a.state_dict());
  {
    NoGradGuard no_grad;
    b->weight.copy_(a->weight);
  }
  step(a, opt_a, {3, 4});
  step(b, opt_b, {3, 4});
  EXPECT_EQ(a->weight.to_vector<double>(), b->weight.to_vector<double>());
}

TEST(SparseAdam, Errors) {
  Tensor dense = ones({3, 2}).requires_grad_();
  optim::SparseAdam sparse_opt({dense}, optim::SparseAdamOptions(0.1));
  sum(dense).backward();
  expect_error<Error>([&] { sparse_opt.step(); }, {"SparseAdam.step", "dense gradient", "optim::Adam"});

  nn::Embedding emb(nn::EmbeddingOptions(5, 2).sparse(true));
  sum(emb(tensor<int64_t>({1}))).backward();
  optim::Adam adam(emb->parameters(), optim::AdamOptions(0.1));
  expect_error<Error>([&] { adam.step(); }, {"Adam.step", "sparse gradient", "optim::SparseAdam"});
  optim::SGD sgd(emb->parameters(), optim::SGDOptions(0.1));
  expect_error<Error>([&] { sgd.step(); }, {"SGD.step", "SparseAdam"});

  expect_error<Error>([] { optim::SparseAdamOptions(-1).validate(); },
                      {"SparseAdamOptions", "learning rate"});
  expect_error<Error>([] { optim::SparseAdamOptions(0.1).betas({0.9, 1.0}).validate(); }, {"beta2"});
}

}  // namespace
}  // namespace frugal
