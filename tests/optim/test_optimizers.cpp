// SGD, Adam and AdamW against PyTorch's trajectories (tests/fixtures/optim_reference.json), and the
// Optimizer base: skipping, gradient checks, option checks, zero_grad, groups, state dicts, memory tags.
#include <cstring>
#include <memory>

#include "core/ops.h"
#include "frugal.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tests/optim/optim_fixture.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;
using testing::fixture_params;
using testing::optim_reference;
using testing::set_fixture_grads;

// An optimizer as the fixture describes it: kind, options, and optionally one group per parameter with its
// own lr.
std::unique_ptr<optim::Optimizer> make_optimizer(const nlohmann::json& cfg,
                                                 const std::vector<Tensor>& params) {
  const std::string kind = cfg["optimizer"];
  const auto& o = cfg["options"];
  auto get = [&](const char* key, double fallback) {
    return o.contains(key) ? o[key].get<double>() : fallback;
  };
  const bool per_param_lr = !cfg["group_lrs"].is_null();
  auto groups_with = [&](const optim::OptimizerOptions& base) {
    std::vector<optim::ParamGroup> g;
    if (!per_param_lr) return std::vector<optim::ParamGroup>{optim::ParamGroup(params)};
    for (size_t k = 0; k < params.size(); ++k) {
      auto opts = base.clone();
      opts->set_lr(cfg["group_lrs"][k].get<double>());
      g.emplace_back(std::vector<Tensor>{params[k]}, *opts);
    }
    return g;
  };
  if (kind == "sgd") {
    auto opts = optim::SGDOptions(get("lr", 0))
                    .momentum(get("momentum", 0))
                    .dampening(get("dampening", 0))
                    .weight_decay(get("weight_decay", 0))
                    .nesterov(o.value("nesterov", false));
    return std::make_unique<optim::SGD>(groups_with(opts), opts);
  }
  const optim::Betas betas =
      o.contains("betas") ? optim::Betas(o["betas"][0], o["betas"][1]) : optim::Betas(0.9, 0.999);
  if (kind == "adam") {
    auto opts = optim::AdamOptions(get("lr", 1e-3))
                    .betas(betas)
                    .eps(get("eps", 1e-8))
                    .weight_decay(get("weight_decay", 0))
                    .amsgrad(o.value("amsgrad", false));
    return std::make_unique<optim::Adam>(groups_with(opts), opts);
  }
  auto opts = optim::AdamWOptions(get("lr", 1e-3))
                  .betas(betas)
                  .eps(get("eps", 1e-8))
                  .weight_decay(get("weight_decay", 1e-2))
                  .amsgrad(o.value("amsgrad", false));
  return std::make_unique<optim::AdamW>(groups_with(opts), opts);
}

TEST(OptimFixture, InputsMatchTheScript) {
  const auto& ref = optim_reference();
  ASSERT_EQ(ref["dtype"], "f64");
  auto params = fixture_params();
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(params[k].to_vector<double>(), ref["initial"][k].get<std::vector<double>>());
    std::vector<double> g;
    for (int64_t i = 0; i < params[k].numel(); ++i) g.push_back(testing::fixture_grad(1, int(k), i));
    // Within an ulp or two, not bit for bit: the compiler may fuse the formula's multiply-adds.
    testing::expect_close(g, ref["grads_step1"][k].get<std::vector<double>>(), {1e-15, 1e-14},
                          "gradient formula");
  }
}

// Every step of every configuration matches PyTorch (f64) to 1e-6 relative (plus 1e-12 absolute for values
// that pass near zero).
TEST(OptimFixture, MatchesPyTorchEveryStepF64) {
  for (const auto& cfg : optim_reference()["optimizers"]) {
    const std::string name = cfg["name"];
    SCOPED_TRACE(name);
    auto params = fixture_params(DType::F64);
    auto opt = make_optimizer(cfg, params);
    double worst = 0;
    for (int t = 1; t <= int(cfg["params"].size()); ++t) {
      set_fixture_grads(params, t);
      opt->step();
      for (size_t k = 0; k < 2; ++k) {
        const auto expected = cfg["params"][size_t(t - 1)][k].get<std::vector<double>>();
        const auto actual = params[k].to_vector<double>();
        for (size_t i = 0; i < expected.size(); ++i)
          worst =
              std::max(worst, std::fabs(actual[i] - expected[i]) / std::max(std::fabs(expected[i]), 1e-6));
        testing::expect_close(actual, expected, {1e-12, 1e-6}, name + " step " + std::to_string(t));
      }
    }
    EXPECT_LT(worst, 1e-10) << "f64 should agree far better than the 1e-6 asked";
  }
}

// f32 parameters follow the same f64 reference closely (f32 rounding only).
TEST(OptimFixture, F32TracksTheReference) {
  for (const auto& cfg : optim_reference()["optimizers"]) {
    SCOPED_TRACE(cfg["name"].get<std::string>());
    auto params = fixture_params(DType::F32);
    auto opt = make_optimizer(cfg, params);
    for (int t = 1; t <= int(cfg["params"].size()); ++t) {
      set_fixture_grads(params, t);
      opt->step();
      for (size_t k = 0; k < 2; ++k)
        testing::expect_close(params[k], cfg["params"][size_t(t - 1)][k].get<std::vector<double>>(),
                              {2e-5, 2e-5}, "step " + std::to_string(t));
    }
  }
}

TEST(Optimizer, SkipsParametersWithoutGradient) {
  auto params = fixture_params();
  optim::Adam opt(params, optim::AdamOptions(0.1));
  const auto before = params[1].to_vector<double>();
  params[0].set_grad(ones_like(params[0]));
  opt.step();
  EXPECT_EQ(params[1].to_vector<double>(), before);
  EXPECT_NE(params[0].to_vector<double>(), testing::fixture_params()[0].to_vector<double>());
  EXPECT_EQ(opt.num_state_bytes(), 2 * 12 * 8);  // exp_avg and exp_avg_sq of the first only
  const StateDict s = opt.state_dict();
  EXPECT_TRUE(s.count("state.0.exp_avg"));
  EXPECT_FALSE(s.count("state.1.exp_avg"));
}

TEST(Optimizer, RejectsGradientsOfTheWrongShapeOrDtype) {
  auto params = fixture_params();
  optim::SGD opt(params, optim::SGDOptions(0.1));
  params[1].autograd_meta()->grad = zeros({4});
  expect_error<ShapeError>([&] { opt.step(); }, {"SGD.step", "parameter 1", "[4]", "[5]"});
  params[1].autograd_meta()->grad = zeros({5}, DType::F32);
  expect_error<DTypeError>([&] { opt.step(); }, {"SGD.step", "parameter 1", "f32", "f64"});
}

TEST(Optimizer, RejectsBadParameters) {
  Tensor a = zeros({2}).requires_grad_();
  expect_error<Error>([&] { optim::SGD({a, a}, optim::SGDOptions(0.1)); }, {"SGD", "listed twice"});
  expect_error<DTypeError>([&] { optim::Adam({zeros({2}, DType::I64)}, optim::AdamOptions()); },
                           {"Adam", "i64", "floating"});
  {
    Tensor b = zeros({2}).requires_grad_();
    Tensor c = b * 2.0;
    expect_error<Error>([&] { optim::SGD({c}, optim::SGDOptions(0.1)); }, {"SGD", "not a leaf"});
  }
  optim::SGD opt({a}, optim::SGDOptions(0.1));
  expect_error<Error>([&] { opt.add_param_group({{a}}); }, {"already in group 0"});
}

TEST(Optimizer, OptionsAreValidated) {
  std::vector<Tensor> p = {zeros({2}).requires_grad_()};
  expect_error<Error>([&] { optim::SGD(p, optim::SGDOptions(-0.1)); }, {"SGDOptions", "learning rate -0.1"});
  expect_error<Error>([&] { optim::SGD(p, optim::SGDOptions(0.1).momentum(-1)); }, {"momentum -1"});
  expect_error<Error>([&] { optim::SGD(p, optim::SGDOptions(0.1).weight_decay(-1)); }, {"weight_decay -1"});
  expect_error<Error>([&] { optim::SGD(p, optim::SGDOptions(0.1).nesterov(true)); },
                      {"nesterov", "momentum > 0", "zero dampening"});
  expect_error<Error>(
      [&] { optim::SGD(p, optim::SGDOptions(0.1).momentum(0.9).dampening(0.1).nesterov(true)); },
      {"nesterov", "dampening 0.1"});
  expect_error<Error>([&] { optim::Adam(p, optim::AdamOptions(-1)); }, {"AdamOptions", "learning rate -1"});
  expect_error<Error>(
      [&] {
        optim::Adam(p, optim::AdamOptions().betas({1.0, 0.999}));
      },
      {"AdamOptions", "beta1 1", "[0, 1)"});
  expect_error<Error>([&] { optim::Adam(p, optim::AdamOptions().betas({0.9, -0.1})); }, {"beta2 -0.1"});
  expect_error<Error>([&] { optim::AdamW(p, optim::AdamWOptions().eps(-1e-8)); },
                      {"AdamWOptions", "eps -1e-08"});
  expect_error<Error>([&] { optim::AdamW(p, optim::AdamWOptions().weight_decay(-1)); }, {"weight_decay -1"});
  // A group's own options are checked too.
  expect_error<Error>(
      [&] {
        optim::SGD({{p, optim::SGDOptions(-2)}}, optim::SGDOptions(0.1));
      },
      {"learning rate -2"});
  EXPECT_EQ(optim::AdamWOptions().weight_decay(), 1e-2);
  EXPECT_EQ(optim::AdamOptions().weight_decay(), 0);
}

TEST(Optimizer, ZeroGradBothModes) {
  auto params = fixture_params();
  optim::SGD opt(params, optim::SGDOptions(0.1));
  set_fixture_grads(params, 1);
  opt.zero_grad(false);
  for (const Tensor& p : params) {
    ASSERT_TRUE(p.grad().defined());
    for (double v : p.grad().to_vector<double>()) EXPECT_EQ(v, 0);
  }
  opt.zero_grad();
  for (const Tensor& p : params) EXPECT_FALSE(p.grad().defined());
}

TEST(Optimizer, GroupsKeepTheirOwnLr) {
  Tensor a = ones({3}, DType::F64).requires_grad_(), b = ones({3}, DType::F64).requires_grad_();
  Tensor c = ones({3}, DType::F64).requires_grad_();
  optim::SGD opt({{{a}}, {{b}, optim::SGDOptions(0.5)}}, optim::SGDOptions(0.1));
  opt.add_param_group({{c}, optim::SGDOptions(0.25)});
  ASSERT_EQ(opt.param_groups().size(), 3u);
  for (Tensor t : {a, b, c}) t.set_grad(ones_like(t));
  opt.step();
  EXPECT_DOUBLE_EQ(a.to_vector<double>()[0], 0.9);
  EXPECT_DOUBLE_EQ(b.to_vector<double>()[0], 0.5);
  EXPECT_DOUBLE_EQ(c.to_vector<double>()[0], 0.75);
  opt.param_groups()[0].options().set_lr(1.0);
  opt.step();
  EXPECT_NEAR(a.to_vector<double>()[0], -0.1, 1e-15);
}

TEST(Optimizer, NonContiguousParameter) {
  Tensor base = testing::uniform({4, 3}, -1, 1, DType::F64);
  Tensor p = base.t().requires_grad_();  // a strided leaf
  ASSERT_FALSE(p.is_contiguous());
  const auto before = p.to_vector<double>();
  Tensor g = testing::uniform({3, 4}, -1, 1, DType::F64, 7);
  p.set_grad(g);
  optim::SGD opt({p}, optim::SGDOptions(0.5));
  opt.step();
  const auto gv = g.to_vector<double>(), after = p.to_vector<double>();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_DOUBLE_EQ(after[i], before[i] - 0.5 * gv[i]);
}

// Random gradients for step t of the round-trip test (a fixed stream per step and parameter).
void set_random_grads(const std::vector<Tensor>& params, int t) {
  for (size_t k = 0; k < params.size(); ++k)
    params[k].set_grad(testing::uniform(params[k].shape(), -1, 1, params[k].dtype(), uint64_t(100 * t + k)));
}

std::vector<Tensor> copies(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

template <typename Opt, typename Options>
void check_round_trip(const Options& options, DType dtype) {
  auto straight = fixture_params(dtype);
  auto resumed = copies(straight);
  Opt opt_a(straight, options);
  for (int t = 1; t <= 20; ++t) {
    set_random_grads(straight, t);
    opt_a.step();
  }
  StateDict saved;
  {
    Opt opt_b(resumed, options);
    for (int t = 1; t <= 10; ++t) {
      set_random_grads(resumed, t);
      opt_b.step();
    }
    saved = opt_b.state_dict();
  }
  auto continued = copies(resumed);      // fresh parameters, fresh optimizer
  Opt opt_c(continued, Options(123.0));  // other hyperparameters: load_state_dict restores them
  opt_c.load_state_dict(saved);
  for (int t = 11; t <= 20; ++t) {
    set_random_grads(continued, t);
    opt_c.step();
  }
  for (size_t k = 0; k < straight.size(); ++k) {
    const Tensor a = straight[k].contiguous(), b = continued[k].contiguous();
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), size_t(a.nbytes())), 0) << "parameter " << k;
  }
  EXPECT_EQ(opt_c.state_dict().size(), saved.size());
}

TEST(OptimizerStateDict, ResumesBitForBit) {
  check_round_trip<optim::SGD>(optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3),
                               DType::F32);
  check_round_trip<optim::Adam>(optim::AdamOptions(1e-2).amsgrad(true).weight_decay(1e-2), DType::F32);
  check_round_trip<optim::AdamW>(optim::AdamWOptions(1e-2).betas({0.8, 0.95}), DType::F64);
  check_round_trip<optim::AdamW>(optim::AdamWOptions(1e-2), DType::BF16);
}

TEST(OptimizerStateDict, Keys) {
  auto params = fixture_params();
  optim::Adam opt(params, optim::AdamOptions(0.01).amsgrad(true));
  set_fixture_grads(params, 1);
  opt.step();
  opt.step();
  const StateDict s = opt.state_dict();
  for (const char* key :
       {"state.0.exp_avg", "state.0.exp_avg_sq", "state.0.max_exp_avg_sq", "state.0.step", "state.1.exp_avg",
        "param_groups.0.lr", "param_groups.0.beta1", "param_groups.0.beta2", "param_groups.0.eps",
        "param_groups.0.weight_decay", "param_groups.0.amsgrad", "param_groups.0.params"})
    EXPECT_TRUE(s.count(key)) << key;
  EXPECT_EQ(s.at("state.1.step").dtype(), DType::I64);
  EXPECT_EQ(s.at("state.1.step").item<int64_t>(), 2);
  EXPECT_EQ(s.at("param_groups.0.lr").dtype(), DType::F64);
  EXPECT_EQ(s.at("param_groups.0.lr").item<double>(), 0.01);
  EXPECT_EQ(s.at("param_groups.0.amsgrad").item<int64_t>(), 1);
  EXPECT_EQ(s.at("param_groups.0.params").to_vector<int64_t>(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(s.at("state.1.exp_avg").shape(), Shape{5});
  // A saved dict is a copy: later steps leave it alone.
  const auto m = s.at("state.0.exp_avg").to_vector<double>();
  opt.step();
  EXPECT_EQ(s.at("state.0.exp_avg").to_vector<double>(), m);
}

TEST(OptimizerStateDict, MismatchesAreClearErrors) {
  auto params = fixture_params();
  optim::Adam opt(params, optim::AdamOptions(0.01));
  set_fixture_grads(params, 1);
  opt.step();
  const StateDict s = opt.state_dict();

  optim::Adam fewer({params[0]}, optim::AdamOptions(0.01));
  expect_error<ShapeError>([&] { fewer.load_state_dict(s); },
                           {"Adam.load_state_dict", "group 0 has 1 parameters", "2"});

  auto other = fixture_params();
  other[1] = zeros({6}, DType::F64).requires_grad_();
  optim::Adam shaped(other, optim::AdamOptions(0.01));
  expect_error<ShapeError>([&] { shaped.load_state_dict(s); }, {"state.1.exp_avg", "[5]", "[6]"});

  optim::SGD sgd(fixture_params(), optim::SGDOptions(0.1).momentum(0.9));
  expect_error<Error>([&] { sgd.load_state_dict(s); }, {"SGD.load_state_dict", "param_groups.0.momentum"});

  StateDict extra = s;
  extra["state.0.bogus"] = zeros({1});
  expect_error<Error>([&] { opt.load_state_dict(extra); }, {"unexpected key 'state.0.bogus'"});

  StateDict bad_dtype = s;
  bad_dtype["state.0.exp_avg"] = zeros({3, 4}, DType::F32);
  expect_error<DTypeError>([&] { opt.load_state_dict(bad_dtype); }, {"state.0.exp_avg", "f32", "f64"});

  StateDict bad_value = s;
  bad_value["param_groups.0.beta1"] = scalar_tensor(1.5, DType::F64);
  expect_error<Error>([&] { opt.load_state_dict(bad_value); }, {"beta1 1.5"});
  // Nothing was changed by the failed loads.
  EXPECT_EQ(opt.param_groups()[0].options().get_lr(), 0.01);
  EXPECT_EQ(opt.state_dict().size(), s.size());
}

TEST(Optimizer, StateIsCountedUnderTheOptimizerTag) {
  auto tagged = [] {
    for (const auto& t : memory::tag_stats())
      if (t.tag == "optimizer") return t.allocated.current;
    return int64_t(0);
  };
  const int64_t before = tagged();
  Tensor p = zeros({1000}, DType::F32).requires_grad_();
  {
    memory::Tag scope("training");  // the state is "optimizer" whatever scope step() runs in
    optim::Adam opt({p}, optim::AdamOptions(1e-3).amsgrad(true));
    EXPECT_EQ(opt.num_state_bytes(), 0);
    p.set_grad(ones_like(p));
    opt.step();
    EXPECT_EQ(opt.num_state_bytes(), 3 * 1000 * 4);
    EXPECT_GE(tagged() - before, 3 * 1000 * 4);
  }
  EXPECT_EQ(tagged(), before);  // freed with the optimizer
}

TEST(Optimizer, HalfPrecisionParametersKeepF32State) {
  Tensor p = testing::uniform({64}, -1, 1, DType::BF16).requires_grad_();
  optim::Adam opt({p}, optim::AdamOptions(1e-2));
  p.set_grad(testing::uniform({64}, -1, 1, DType::BF16, 3));
  opt.step();
  const StateDict s = opt.state_dict();
  EXPECT_EQ(s.at("state.0.exp_avg").dtype(), DType::F32);
  EXPECT_EQ(p.dtype(), DType::BF16);
  EXPECT_EQ(opt.num_state_bytes(), 2 * 64 * 4);
}

}  // namespace
}  // namespace frugal
