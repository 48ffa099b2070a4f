// Checkpoints (io/checkpoint.h): both files carry one id per save, a pair of different saves is refused, and
// a save that fails or is killed at any step (also right after another such save) leaves a load exactly the
// old checkpoint or exactly the new one, with messages that say which.
#include "io/checkpoint.h"

#include <filesystem>
#include <fstream>

#include "io/file.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

// What a checkpoint holds, as plain values: a load gives one of these or throws.
struct Contents {
  std::map<std::string, std::string> weights_metadata, state_metadata;
  std::map<std::string, std::vector<double>> weights, state;
  bool operator==(const Contents&) const = default;
};
std::map<std::string, std::vector<double>> values_of(const StateDict& d) {
  std::map<std::string, std::vector<double>> v;
  for (const auto& [name, t] : d) v[name] = t.to_vector<double>();
  return v;
}

// The tensors and metadata of checkpoint number k (different values, and a different set of names, each k).
struct Version {
  StateDict weights, state;
  std::map<std::string, std::string> weights_metadata, state_metadata;
  Contents contents() const {
    return {weights_metadata, state_metadata, values_of(weights), values_of(state)};
  }
};
Version version(int k) {
  Version v;
  v.weights["fc.weight"] = testing::uniform({8, 4}, -1, 1, DType::F32, uint64_t(k));
  v.weights["fc.bias"] = testing::uniform({8}, -1, 1, DType::BF16, uint64_t(k) + 100);
  if (k % 2) v.weights["extra"] = testing::uniform({3}, -1, 1, DType::F64, uint64_t(k) + 200);
  v.state["optimizer.state.0.exp_avg"] = testing::uniform({8, 4}, -1, 1, DType::F32, uint64_t(k) + 300);
  v.state["trainer.epoch"] = scalar_tensor(k, DType::I64);
  v.weights_metadata = {{"model", "mlp"}, {"version", std::to_string(k)}};
  v.state_metadata = {{"optimizer", "Adam"}, {"epoch", std::to_string(k)}};
  return v;
}
void save(const std::string& p, const Version& v) {
  io::save_checkpoint(p, v.weights, v.weights_metadata, v.state, v.state_metadata);
}
Contents load(const std::string& p) {
  const io::Checkpoint c = io::load_checkpoint(p);
  return {c.weights.metadata, c.state.metadata, values_of(c.weights.tensors), values_of(c.state.tensors)};
}

class CheckpointTest : public testing::ScratchDirTest {
 protected:
  void TearDown() override {
    io::detail::inject_fault(0);
    testing::ScratchDirTest::TearDown();
  }
  std::vector<std::string> listing(const fs::path& dir) const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

TEST_F(CheckpointTest, BothFilesCarryOneNewIdPerSave) {
  const std::string p = path("ckpt");
  save(p, version(1));
  const io::Checkpoint first = io::load_checkpoint(p);
  EXPECT_TRUE(load(p) == version(1).contents());  // the metadata as saved, without the id
  ASSERT_EQ(first.id.size(), 32u);
  EXPECT_EQ(first.id.find_first_not_of("0123456789abcdef"), std::string::npos) << first.id;
  EXPECT_EQ(io::load_safetensors(p).metadata.at("checkpoint_id"), first.id);
  EXPECT_EQ(io::load_safetensors(p + ".state").metadata.at("checkpoint_id"), first.id);
  EXPECT_EQ(io::load_safetensors_metadata(p), io::load_safetensors(p).metadata);
  save(p, version(1));  // the same contents again: a new save, a new id
  EXPECT_NE(io::load_checkpoint(p).id, first.id);
  EXPECT_EQ(listing(dir_), (std::vector<std::string>{"ckpt", "ckpt.state"}));

  expect_error<Error>(
      [&] {
        io::save_checkpoint(p, {}, {{"checkpoint_id", "mine"}}, {}, {});
      },
      {"\"checkpoint_id\" is reserved", p});
  expect_error<Error>(
      [&] {
        io::save_checkpoint(p, {}, {}, {}, {{"checkpoint_id", "mine"}});
      },
      {"\"checkpoint_id\" is reserved", p});
  EXPECT_TRUE(load(p) == version(1).contents());
}

TEST_F(CheckpointTest, RefusesWeightsAndStateOfDifferentSaves) {
  const std::string p = path("ckpt"), q = path("other");
  save(p, version(1));
  save(q, version(2));
  const std::string p_id = io::load_checkpoint(p).id, q_id = io::load_checkpoint(q).id;
  fs::copy_file(q, p, fs::copy_options::overwrite_existing);  // q's weights beside p's state
  expect_error<Error>([&] { io::load_checkpoint(p); },
                      {p, "another save", q_id, p_id, "two runs saved to this path at once"});
  save(q, version(3));  // a state.next of yet another save does not help
  fs::copy_file(q + ".state", p + ".state.next", fs::copy_options::overwrite_existing);
  expect_error<Error>([&] { io::load_checkpoint(p); }, {p + ".state.next", "another save"});

  io::save_safetensors(p, version(1).weights);  // a weights file of no checkpoint
  expect_error<Error>([&] { io::load_checkpoint(p); }, {p, "no \"checkpoint_id\""});
  save(p, version(1));
  fs::remove(p + ".state");
  fs::remove(p + ".state.next");
  expect_error<Error>([&] { io::load_checkpoint(p); }, {"no training state", p + ".state", "neither"});

  save(p, version(1));
  const std::string state = io::read_bytes(p + ".state");
  std::ofstream(p + ".state", std::ios::binary).write(state.data(), 100);  // truncated
  expect_error<Error>([&] { io::load_checkpoint(p); }, {p + ".state' does not load", "truncated"});
  io::save_safetensors(p, version(1).weights, {{"checkpoint_id", std::string(1000, 'z')}});
  expect_error<Error>([&] { io::load_checkpoint(p); }, {p, "malformed \"checkpoint_id\""});
}

TEST_F(CheckpointTest, NeverFollowsSymlinksPlantedAtItsNames) {
  const std::string p = path("ckpt"), victim = path("victim");
  io::atomic_write(victim, "victim's bytes");
  for (const std::string& name : {p + ".tmp", p + ".state.tmp", p + ".state.next", p + ".state.next.tmp"})
    fs::create_symlink(victim, name);
  save(p, version(1));
  save(p, version(2));
  EXPECT_TRUE(load(p) == version(2).contents());
  EXPECT_EQ(io::read_bytes(victim), "victim's bytes");
}

// Fails the save of version 2 over version 1 at step n; returns the message.
std::string fail_at(const std::string& p, int64_t n) {
  io::detail::inject_fault(n);
  std::string message;
  try {
    save(p, version(2));
  } catch (const Error& e) {
    message = e.what();
  }
  io::detail::inject_fault(0);
  return message;
}

// The steps of a save of a checkpoint over another (Note [save fault injection]).
int64_t steps_of_a_save(const std::string& dir) {
  fs::create_directories(dir);
  const std::string p = dir + "/ckpt";
  save(p, version(1));
  io::detail::inject_fault(0);
  save(p, version(2));
  return io::detail::fault_steps();
}

TEST_F(CheckpointTest, AFailureAtEveryStepLeavesTheOldOrTheNewAndSaysWhich) {
  const int64_t steps = steps_of_a_save(path("dry"));
  ASSERT_GT(steps, 15);
  int got_old = 0, got_new = 0;
  for (int64_t n = 1; n <= steps; ++n) {
    SCOPED_TRACE("failing at step " + std::to_string(n) + " of " + std::to_string(steps));
    const fs::path dir = dir_ / (std::to_string(n) + "e");
    fs::create_directories(dir);
    const std::string p = (dir / "ckpt").string();
    save(p, version(1));
    const std::string message = fail_at(p, n);
    ASSERT_FALSE(message.empty()) << "the save did not fail";
    EXPECT_NE(message.find("Input/output error"), std::string::npos) << message;
    const Contents got = load(p);
    const bool is_new = got == version(2).contents();
    EXPECT_TRUE(is_new || got == version(1).contents()) << "a mixture";
    (is_new ? got_new : got_old)++;
    // The message says which checkpoint is in place, and the failure left no temporary behind (after the
    // commit point, the new state waits at ckpt.state.next, where a load finds it).
    EXPECT_NE(message.find(is_new ? "the new checkpoint is in place" : "the previous checkpoint"),
              std::string::npos)
        << message;
    if (!is_new) {
      EXPECT_NE(message.find("is unchanged"), std::string::npos) << message;
    }
    const std::vector<std::string> files = listing(dir);
    EXPECT_TRUE(files == (std::vector<std::string>{"ckpt", "ckpt.state"}) ||
                (is_new && files == std::vector<std::string>{"ckpt", "ckpt.state", "ckpt.state.next"}))
        << ::testing::PrintToString(files);
    // The next save goes through and is what a load gets.
    save(p, version(3));
    EXPECT_TRUE(load(p) == version(3).contents());
    EXPECT_EQ(listing(dir), (std::vector<std::string>{"ckpt", "ckpt.state"}));
  }
  EXPECT_GT(got_old, 0);
  EXPECT_GT(got_new, 0);
}

// Kills the save of version `k` at step n (0: never); returns whether it was killed.
bool kill_at(const std::string& p, int k, int64_t n) {
  io::detail::inject_fault(n, io::detail::Fault::Crash);
  bool killed = false;
  try {
    save(p, version(k));
  } catch (const io::detail::SimulatedCrash&) {
    killed = true;
  }
  io::detail::inject_fault(0);
  return killed;
}

TEST_F(CheckpointTest, AKillAtEveryStepLeavesTheOldOrTheNewEvenAfterAnotherKill) {
  // Version 1 is saved, the save of version 2 is killed at step n, then the save of version 3 at step m
  // (every m, and never): each load gets exactly what the one before it got, or the newer version.
  const int64_t steps = steps_of_a_save(path("dry"));
  int got_old = 0, got_new = 0;
  for (int64_t n = 1; n <= steps; ++n) {
    SCOPED_TRACE("killed at step " + std::to_string(n) + " of " + std::to_string(steps));
    const fs::path first = dir_ / (std::to_string(n) + "k");
    fs::create_directories(first);
    save((first / "ckpt").string(), version(1));
    ASSERT_TRUE(kill_at((first / "ckpt").string(), 2, n));
    const Contents after_first = load((first / "ckpt").string());
    const bool is_new = after_first == version(2).contents();
    ASSERT_TRUE(is_new || after_first == version(1).contents()) << "a mixture";
    (is_new ? got_new : got_old)++;

    for (int64_t m = 1;; ++m) {
      SCOPED_TRACE("then killed at step " + std::to_string(m));
      const fs::path second = dir_ / (std::to_string(n) + "k" + std::to_string(m));
      fs::copy(first, second);
      const std::string p = (second / "ckpt").string();
      const bool killed = kill_at(p, 3, m);
      const Contents got = load(p);
      EXPECT_TRUE(got == after_first || got == version(3).contents()) << "a mixture";
      if (!killed) {  // m is past the last step: the save went through
        EXPECT_TRUE(got == version(3).contents());
        break;
      }
      fs::remove_all(second);
    }
    fs::remove_all(first);
  }
  EXPECT_GT(got_old, 0);
  EXPECT_GT(got_new, 0);
}

}  // namespace
}  // namespace frugal
