// An OutOfMemoryError's message explains the failure from the state at that moment (Note [an out-of-memory
// message that explains itself], core/out_of_memory.cpp): categories, tags, the largest blocks with their
// op, the cache's free pieces, and the bytes each technique would free.
#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace frugal {
namespace {

constexpr int64_t kMiB = 1 << 20;

class OutOfMemory : public ::testing::Test {
 protected:
  void TearDown() override {
    memory::set_memory_limit(kCPU, 0);
    memory::empty_cache();
  }
};

// f32 tensors of exactly `bytes` bytes (a multiple of the arena's rounding).
Tensor tensor_of(int64_t bytes) { return empty({bytes / 4}); }

std::string failure(int64_t bytes) {
  try {
    Tensor t = tensor_of(bytes);
  } catch (const OutOfMemoryError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected OutOfMemoryError";
  return "";
}

void expect_has(const std::string& msg, const std::string& part) {
  EXPECT_NE(msg.find(part), std::string::npos) << msg << "\nlacks: " << part;
}

TEST_F(OutOfMemory, TheMessageSaysWhatHoldsTheBytesAndWhatEachTechniqueWouldFree) {
  memory::empty_cache();
  Tensor params, acts, big_act, state, batches, grads;
  {
    memory::Tag t("parameters");
    params = tensor_of(1 * kMiB);
  }
  {
    memory::Tag t("activations");
    acts = tensor_of(2 * kMiB);
    big_act = tensor_of(6 * kMiB);
  }
  {
    memory::Tag t("optimizer/state");
    state = tensor_of(2 * kMiB);
  }
  {
    memory::Tag t("data");  // the data loader's tag
    batches = tensor_of(1 * kMiB);
  }
  {
    memory::Tag t("backward");
    grads = tensor_of(1 * kMiB);
  }
  memory::set_memory_limit(kCPU, memory::stats().reserved.current + 4 * kMiB);
  const std::string msg = failure(64 * kMiB);
  expect_has(msg, "out of memory on cpu");
  expect_has(msg,
             "\n  live by category: activations 8.00 MiB, optimizer state 2.00 MiB, parameters 1.00 MiB, "
             "gradients 1.00 MiB, data 1.00 MiB");
  expect_has(msg, "\n  largest tags: activations 8.00 MiB, optimizer/state 2.00 MiB");
  expect_has(msg, "\n  largest live blocks: 6.00 MiB (tag activations, op empty, forward), 2.00 MiB");
  expect_has(msg,
             "recompute activations in backward (autograd::recompute, nn::Sequential::recompute_every): "
             "up to 8.00 MiB");
  expect_has(msg, "(amp::Autocast, bf16 or f16): about 4.00 MiB");
  expect_has(msg, "6.00 MiB for k = 4");
  expect_has(msg, "SGD with momentum instead of Adam (optim::SGD): about 1.00 MiB");
  expect_has(msg, "the loader's batches hold 1.00 MiB");
  expect_has(msg, "lower the batch size");
  EXPECT_EQ(msg.substr(msg.size() - std::string("memory::set_memory_limit").size()),
            "memory::set_memory_limit");
  // Freed bytes move: the same failure after the big activation is gone says so.
  big_act = Tensor();
  const std::string after = failure(64 * kMiB);
  expect_has(after, "live by category: optimizer state 2.00 MiB, activations 2.00 MiB");
  expect_has(after, "\n  cached and free: ");  // at least the 6 MiB just freed
  expect_has(after, "a request larger than the largest piece needs a new segment");
  expect_has(after, "up to 2.00 MiB");
}

TEST_F(OutOfMemory, UntaggedBytesFollowThePhaseAndNothingLiveStillAdvises) {
  memory::empty_cache();
  memory::set_memory_limit(kCPU, 4 * kMiB);
  const std::string empty_state = failure(64 * kMiB);
  expect_has(empty_state, "no activations are live now");
  EXPECT_EQ(empty_state.find("live by category"), std::string::npos) << empty_state;
  Tensor fwd = tensor_of(1 * kMiB);  // grad mode on, no tag: forward, activations
  Tensor off;
  {
    NoGradGuard no_grad;  // no tag, no grad mode: other
    off = tensor_of(kMiB / 2);
  }
  const std::string msg = failure(64 * kMiB);
  expect_has(msg, "live by category: activations 1.00 MiB, other 512.00 KiB");
  expect_has(msg, "largest tags: (untagged) 1.50 MiB");
}

}  // namespace
}  // namespace frugal
