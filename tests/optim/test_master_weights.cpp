// Master weights (Note [master weights], optim/optimizer.h): bf16 and f16 parameters updated through f32
// copies follow an f32 run where plain 16-bit parameters lose every small update; the copy is optimizer
// state (f32, tagged, in state dicts) and a state dict resumes bit for bit.
#include <cmath>

#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;
using testing::uniform;

enum class Kind { SGD, SGDMomentum, Adam, AdamW };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::SGD:
      return "sgd";
    case Kind::SGDMomentum:
      return "sgd+momentum";
    case Kind::Adam:
      return "adam";
    case Kind::AdamW:
      return "adamw";
  }
  return "?";
}

// Learning rates that move each parameter by about 1e-3 * lr_scale per step.
std::unique_ptr<optim::Optimizer> make(Kind k, const Tensor& p, bool master, double lr_scale = 1) {
  switch (k) {
    case Kind::SGD:
      return std::make_unique<optim::SGD>(std::vector<Tensor>{p},
                                          optim::SGDOptions(5e-4 * lr_scale).master_weights(master));
    case Kind::SGDMomentum:
      return std::make_unique<optim::SGD>(
          std::vector<Tensor>{p}, optim::SGDOptions(5e-5 * lr_scale).momentum(0.9).master_weights(master));
    case Kind::Adam:
      return std::make_unique<optim::Adam>(std::vector<Tensor>{p},
                                           optim::AdamOptions(1e-3 * lr_scale).master_weights(master));
    case Kind::AdamW:
      return std::make_unique<optim::AdamW>(std::vector<Tensor>{p},
                                            optim::AdamWOptions(1e-3 * lr_scale).master_weights(master));
  }
  return nullptr;
}

// Parameters near 1 (bf16's step there is 2^-7 above and 2^-8 below), pulled towards 0 by small steps: each
// step's change (about 1e-3) is under half the rounding step, so a bf16 parameter never moves by itself.
// Returns the parameter after `steps` steps, in f32.
std::vector<float> run(Kind k, DType dt, bool master, int steps, double lr_scale = 1) {
  Tensor p = uniform({64}, 0.9, 1.1, DType::F32, 5).to(dt).requires_grad_();
  auto opt = make(k, p, master, lr_scale);
  for (int i = 0; i < steps; ++i) {
    opt->zero_grad();
    sum(mul(p, p)).backward();  // d = 2 p
    opt->step();
  }
  EXPECT_EQ(p.dtype(), dt);
  return p.to(DType::F32).to_vector<float>();
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

TEST(MasterWeights, FollowF32WhereBf16LosesTheUpdates) {
  for (Kind k : {Kind::SGD, Kind::SGDMomentum, Kind::Adam, Kind::AdamW}) {
    const int steps = 100;
    const auto f32 = run(k, DType::F32, false, steps);
    const auto start = run(k, DType::BF16, false, 0);
    const auto plain = run(k, DType::BF16, false, steps);
    const auto master = run(k, DType::BF16, true, steps);
    const double moved = max_diff(f32, run(k, DType::F32, false, 0));
    const double err_plain = max_diff(plain, f32), err_master = max_diff(master, f32);
    EXPECT_GT(moved, 0.02) << kind_name(k);  // the f32 run went somewhere
    // Within about one bf16 step of the f32 run (the rounding, and gradients taken at rounded values).
    EXPECT_LE(err_master, 8e-3) << kind_name(k);
    EXPECT_GT(err_plain, 10 * err_master) << kind_name(k);
    EXPECT_LE(max_diff(plain, start), 1e-2) << kind_name(k);  // bf16 alone barely moved
    std::printf("%-13s f32 moved %.4f; bf16 off by %.4f, bf16 + master weights off by %.4f\n", kind_name(k),
                moved, err_plain, err_master);
  }
}

// f16's step near 1 is 2^-10 (2^-11 below): steps of 1e-4 are lost without the copy.
TEST(MasterWeights, F16Too) {
  const auto f32 = run(Kind::Adam, DType::F32, false, 200, 0.1);
  const auto master = run(Kind::Adam, DType::F16, true, 200, 0.1);
  const auto plain = run(Kind::Adam, DType::F16, false, 200, 0.1);
  EXPECT_GT(max_diff(f32, run(Kind::Adam, DType::F32, false, 0)), 0.015);
  EXPECT_LE(max_diff(master, f32), 1e-3);
  EXPECT_GT(max_diff(plain, f32), 5 * max_diff(master, f32));
}

TEST(MasterWeights, TheCopyIsF32OptimizerState) {
  Tensor p = uniform({32, 8}, -1, 1, DType::BF16, 6).requires_grad_();
  const auto start = p.to(DType::F32).to_vector<float>();
  optim::Adam opt({p}, optim::AdamOptions(1e-3).master_weights(true));
  EXPECT_EQ(opt.num_state_bytes(), 0);
  sum(p).backward();
  opt.step();
  // exp_avg, exp_avg_sq and the master copy, all f32.
  EXPECT_EQ(opt.num_state_bytes(), 3 * 32 * 8 * 4);
  const StateDict s = opt.state_dict();
  ASSERT_TRUE(s.count("state.0.master"));
  EXPECT_EQ(s.at("state.0.master").dtype(), DType::F32);
  EXPECT_EQ(s.at("state.0.exp_avg").dtype(), DType::F32);
  // The parameter is the copy rounded.
  EXPECT_EQ(s.at("state.0.master").to(DType::BF16).to_vector<float>(), p.to(DType::F32).to_vector<float>());
  // It started from the parameter: one Adam step moves each value by about lr.
  const auto m = s.at("state.0.master").to_vector<float>();
  for (size_t i = 0; i < m.size(); ++i) EXPECT_NEAR(m[i], start[i] - 1e-3f, 1e-5) << i;
  // Counted under the memory tag "optimizer".
  int64_t tagged = 0;
  for (const auto& t : memory::tag_stats())
    if (t.tag == "optimizer") tagged = t.allocated.current;
  EXPECT_GE(tagged, 3 * 32 * 8 * 4);
  // f32 parameters ignore the option.
  Tensor q = uniform({4}, -1, 1).requires_grad_();
  optim::SGD sgd({q}, optim::SGDOptions(0.1).master_weights(true));
  sum(q).backward();
  sgd.step();
  EXPECT_TRUE(sgd.state_dict().count("state.0.master") == 0);
  EXPECT_EQ(sgd.num_state_bytes(), 0);
}

TEST(MasterWeights, StateDictResumesBitForBit) {
  for (Kind k : {Kind::SGD, Kind::SGDMomentum, Kind::AdamW}) {
    Tensor a = uniform({16}, -1, 1, DType::BF16, 7).requires_grad_();
    auto opt_a = make(k, a, true);
    auto step = [](optim::Optimizer& o, Tensor& p) {
      o.zero_grad();
      sum(mul(p, p)).backward();
      o.step();
    };
    for (int i = 0; i < 5; ++i) step(*opt_a, a);
    Tensor b = a.detach().clone().requires_grad_();
    auto opt_b = make(k, b, true);
    opt_b->load_state_dict(opt_a->state_dict());
    for (int i = 0; i < 5; ++i) {
      step(*opt_a, a);
      step(*opt_b, b);
    }
    EXPECT_EQ(a.to(DType::F32).to_vector<float>(), b.to(DType::F32).to_vector<float>()) << kind_name(k);
    EXPECT_EQ(opt_a->state_dict().at("state.0.master").to_vector<float>(),
              opt_b->state_dict().at("state.0.master").to_vector<float>());
    // A dict without the copy does not fit an optimizer with master weights, and one with it does not fit
    // an optimizer without.
    auto plain = make(k, b, false);
    expect_error<Error>([&] { plain->load_state_dict(opt_a->state_dict()); }, {"unexpected key", "master"});
    StateDict no_master = opt_a->state_dict();
    no_master.erase("state.0.master");
    expect_error<Error>([&] { opt_b->load_state_dict(no_master); }, {"state.0.master"});
  }
}

TEST(MasterWeights, SparseAdam) {
  nn::Embedding emb(nn::EmbeddingOptions(10, 4).sparse(true));
  emb->to(DType::BF16);
  Tensor w = emb->weight;
  {
    NoGradGuard no_grad;
    w.fill_(1.0);
  }
  nn::Embedding ref(nn::EmbeddingOptions(10, 4).sparse(true));
  {
    NoGradGuard no_grad;
    ref->weight.fill_(1.0);
  }
  optim::SparseAdam opt(emb->parameters(), optim::SparseAdamOptions(1e-3).master_weights(true));
  optim::SparseAdam opt_ref(ref->parameters(), optim::SparseAdamOptions(1e-3));
  const Tensor idx = tensor<int64_t>({1, 3, 3, 7});
  for (int i = 0; i < 50; ++i) {
    opt.zero_grad();
    opt_ref.zero_grad();
    sum(emb->forward(idx)).backward();
    sum(ref->forward(idx)).backward();
    opt.step();
    opt_ref.step();
  }
  EXPECT_EQ(w.dtype(), DType::BF16);
  const auto got = w.to(DType::F32).to_vector<float>(), want = ref->weight.to_vector<float>();
  EXPECT_LE(max_diff(got, want), 4e-3);
  EXPECT_NEAR(want[4], 1.0 - 0.05, 1e-3);  // row 1 moved by about 50 lr
  EXPECT_EQ(got[0], 1.0f);                 // row 0 never did
}

}  // namespace
}  // namespace frugal
