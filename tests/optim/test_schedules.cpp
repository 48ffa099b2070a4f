// LR schedules against PyTorch's values over 30 steps (tests/fixtures/optim_reference.json), with two
// parameter groups of different lrs; and their argument checks.
#include <memory>

#include "frugal.h"
#include "optim/schedule.h"
#include "optim/sgd.h"
#include "tests/optim/optim_fixture.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_error;

struct TwoGroups {
  Tensor a = zeros({2}).requires_grad_(), b = zeros({3}).requires_grad_();
  optim::SGD opt{
      std::vector<optim::ParamGroup>{{{a}, optim::SGDOptions(0.1)}, {{b}, optim::SGDOptions(0.02)}},
      optim::SGDOptions(0.1)};
};

std::unique_ptr<optim::LRScheduler> make_schedule(const std::string& name, const nlohmann::json& args,
                                                  optim::Optimizer& opt) {
  if (name == "step_lr") return std::make_unique<optim::StepLR>(opt, args["step_size"], args["gamma"]);
  if (name == "cosine")
    return std::make_unique<optim::CosineAnnealingLR>(opt, args["T_max"], args["eta_min"]);
  if (name == "warmup")
    return std::make_unique<optim::LinearWarmup>(opt, args["warmup_steps"], args["start_factor"]);
  return optim::warmup_cosine(opt, args["warmup_steps"], args["start_factor"], args["T_max"],
                              args["eta_min"]);
}

TEST(Schedules, MatchPyTorch) {
  for (const auto& s : testing::optim_reference()["schedules"]) {
    const std::string name = s["name"];
    SCOPED_TRACE(name);
    TwoGroups m;
    ASSERT_EQ(s["base_lrs"].get<std::vector<double>>(), (std::vector<double>{0.1, 0.02}));
    auto sched = make_schedule(name, s["args"], m.opt);
    for (size_t t = 0; t < s["lrs"].size(); ++t) {
      if (t > 0) sched->step();
      const auto expected = s["lrs"][t].get<std::vector<double>>();
      testing::expect_close(sched->get_last_lr(), expected, {1e-12, 1e-10},
                            "lrs after " + std::to_string(t) + " steps");
      // The optimizer's groups carry the lrs.
      EXPECT_EQ(m.opt.param_groups()[0].options().get_lr(), sched->get_last_lr()[0]);
      EXPECT_EQ(m.opt.param_groups()[1].options().get_lr(), sched->get_last_lr()[1]);
    }
  }
}

TEST(Schedules, ScaleTheInitialLrNotTheCurrentOne) {
  TwoGroups m;
  optim::StepLR first(m.opt, 1, 0.5);
  first.step();                          // lr 0.05
  optim::StepLR second(m.opt, 10, 0.5);  // starts over from the initial 0.1, as in PyTorch
  EXPECT_EQ(second.get_last_lr()[0], 0.1);
}

TEST(Schedules, ArgumentsAreChecked) {
  TwoGroups m;
  expect_error<Error>([&] { optim::StepLR(m.opt, 0); }, {"StepLR", "step_size", "0"});
  expect_error<Error>([&] { optim::CosineAnnealingLR(m.opt, 0); }, {"CosineAnnealingLR", "T_max"});
  expect_error<Error>([&] { optim::LinearWarmup(m.opt, 5, 0.0); },
                      {"LinearWarmup", "start_factor", "(0, 1]"});
  expect_error<Error>([&] { optim::LinearWarmup(m.opt, 0, 0.5); }, {"LinearWarmup", "warmup_steps"});
  auto a = std::make_shared<optim::StepLR>(m.opt, 3);
  expect_error<Error>([&] { optim::SequentialLR(m.opt, {a}, {2}); },
                      {"SequentialLR", "0 milestones", "got 1"});
  TwoGroups other;
  auto b = std::make_shared<optim::StepLR>(other.opt, 3);
  expect_error<Error>(
      [&] {
        optim::SequentialLR(m.opt, {a, b}, {2});
      },
      {"SequentialLR", "schedule 1", "another"});
}

}  // namespace
}  // namespace frugal
