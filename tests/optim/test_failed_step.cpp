// Out of memory at every allocation of a training step (Note [failing an allocation] in core/memory.h): a W1
// step (an MLP 784-256-256-10 with ReLU, cross-entropy, Adam, a batch of 128 random images) with its n-th
// allocation made to fail, for every n. Each time the failure surfaces as OutOfMemoryError from the step,
// the parameters and the optimizer's state are as before it (Note [a failed step changes nothing] in
// optim/optimizer.h), no byte is left allocated once the step's tensors are gone, and the step run again
// gives exactly what a run without the fault gives. Also FRUGAL_FAIL_ALLOC_AT's values.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace frugal {
namespace {

namespace F = nn::functional;
using testing::expect_error;

nn::Sequential make_mlp() {
  nn::Sequential net;
  net->push_back(nn::Linear(784, 256));
  net->push_back(nn::ReLU());
  net->push_back(nn::Linear(256, 256));
  net->push_back(nn::ReLU());
  net->push_back(nn::Linear(256, 10));
  return net;
}

struct Batch {
  Tensor x, y;
};
Batch batch(uint64_t k) {
  Generator g(100 + k);
  return {rand({128, 784}, DType::F32, &g), randint(0, 10, {128}, DType::I64, &g)};
}

void train_step(nn::Module& model, optim::Optimizer& opt, const Batch& b) {
  opt.zero_grad();
  const Tensor loss = F::cross_entropy(model.forward(b.x), b.y);
  loss.backward();
  opt.step();
}

// Every parameter and every optimizer state tensor (and step count), by name, as f64 values (exact for f32).
using Snapshot = std::map<std::string, std::vector<double>>;
Snapshot snapshot(const nn::Module& model, const optim::Optimizer& opt) {
  Snapshot s;
  for (const auto& [name, p] : model.named_parameters()) s["param." + name] = p.to_vector<double>();
  for (const auto& [key, t] : opt.state_dict()) s["opt." + key] = t.to_vector<double>();
  return s;
}

struct Trainer {
  nn::Sequential model{nullptr};
  std::unique_ptr<optim::Adam> opt;
};
// A fresh model and optimizer after `steps` clean steps.
Trainer run_after(int steps) {
  manual_seed(7);
  Trainer r{make_mlp(), nullptr};
  r.opt = std::make_unique<optim::Adam>(r.model->parameters(), optim::AdamOptions(1e-3));
  for (int k = 0; k < steps; ++k) train_step(*r.model, *r.opt, batch(uint64_t(k)));
  return r;
}

TEST(FailedStep, EveryAllocationOfATrainingStepCanFail) {
  // The first step makes Adam's state; a later one has it already.
  for (int before_steps : {0, 1}) {
    const Snapshot expected = [&] {
      Trainer clean = run_after(before_steps + 1);
      return snapshot(*clean.model, *clean.opt);
    }();
    int64_t allocations = 0;
    for (int64_t n = 1;; ++n) {
      SCOPED_TRACE("after " + std::to_string(before_steps) + " steps, allocation " + std::to_string(n));
      Trainer r = run_after(before_steps);
      const Snapshot before = snapshot(*r.model, *r.opt);
      r.opt->zero_grad();
      const int64_t baseline = memory::stats().allocated.current;
      bool failed = false;
      memory::detail::fail_allocation_at(n);
      try {
        train_step(*r.model, *r.opt, batch(uint64_t(before_steps)));
      } catch (const OutOfMemoryError& e) {
        failed = true;
        EXPECT_NE(std::string(e.what()).find("made to fail"), std::string::npos) << e.what();
      }
      const int64_t counted = memory::detail::allocations_counted();
      memory::detail::fail_allocation_at(0);
      if (!failed) {  // n is past the step's last allocation
        allocations = counted;
        break;
      }
      ASSERT_EQ(snapshot(*r.model, *r.opt), before) << "the failed step changed the model or the optimizer";
      r.opt->zero_grad();
      EXPECT_EQ(memory::stats().allocated.current, baseline) << "the failed step left bytes allocated";
      memory::allocator(kCPU).check_invariants();
      train_step(*r.model, *r.opt, batch(uint64_t(before_steps)));
      ASSERT_EQ(snapshot(*r.model, *r.opt), expected)
          << "the step after the failure differs from a clean run";
    }
    std::printf("after %d step(s): each of the step's %lld allocations failed in turn\n", before_steps,
                static_cast<long long>(allocations));
    EXPECT_GT(allocations, 20) << "the sweep covered too few allocations";
  }
}

TEST(FailedStep, FailAllocAtCountsFromTheCallAndFailsOnce) {
  memory::detail::fail_allocation_at(3);
  const Tensor a = empty({4}), b = empty({4});
  expect_error<OutOfMemoryError>([] { empty({4}); },
                                 {"out of memory", "allocation 3", "FRUGAL_FAIL_ALLOC_AT"});
  const Tensor c = empty({4});  // the next one succeeds again
  EXPECT_EQ(memory::detail::allocations_counted(), 4);
  memory::detail::fail_allocation_at(0);
  EXPECT_EQ(memory::detail::fail_alloc_at_from_env(nullptr), 0);
  EXPECT_EQ(memory::detail::fail_alloc_at_from_env(""), 0);
  EXPECT_EQ(memory::detail::fail_alloc_at_from_env("17"), 17);
  for (const char* bad : {"abc", "-1", "3x", " 4"})
    expect_error<Error>([&] { memory::detail::fail_alloc_at_from_env(bad); },
                        {"FRUGAL_FAIL_ALLOC_AT", std::string("'") + bad + "'", "n >= 1"});
}

// Run by ctest with FRUGAL_FAIL_ALLOC_AT=3 (tests/CMakeLists.txt): counted from the first allocation of the
// program, the third fails, and only that one.
TEST(FailedStep, FailAllocAtFromTheEnvironment) {
  if (!std::getenv("FRUGAL_TEST_FAIL_ALLOC_AT"))
    GTEST_SKIP() << "run with FRUGAL_FAIL_ALLOC_AT (tests/CMakeLists.txt)";
  const Tensor a = empty({4}), b = empty({4});
  expect_error<OutOfMemoryError>([] { empty({4}); }, {"allocation 3", "FRUGAL_FAIL_ALLOC_AT"});
  const Tensor c = empty({4});
  EXPECT_EQ(memory::stats().num_ooms, 1);
}

}  // namespace
}  // namespace frugal
