// Every flag of the trainers with absurd values (0, -1, a large number, a number beyond int64, garbage): each
// run either does what --help says that value means or ends with a clear error. None crashes, hangs, or
// goes on as if nothing were wrong. The programs run for real, as a user starts them, a few steps each.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Outcome {
  bool finished = false;  // false: killed after the time limit
  bool signaled = false;
  int status = -1;     // the exit status when it exited
  std::string output;  // stdout and stderr together
};

// Runs argv with its output captured, killing it after `limit_s` seconds.
Outcome run(const std::vector<std::string>& argv, int limit_s) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  Outcome out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(limit_s);
  bool timed_out = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, int(left.count())) <= 0) continue;
    char buf[4096];
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    out.output.append(buf, size_t(n));
  }
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  out.finished = !timed_out;
  out.signaled = WIFSIGNALED(st);
  out.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

// One flag of one program: the values --help gives a meaning to run to the end; every other value fails.
struct FlagCase {
  std::string program;  // "fmnist" or "chargpt"
  std::string flag;
  std::set<std::string> meaningful;  // of the values below, those that must run to exit status 0
  // Values with a meaning that may still end in a clear error (a learning rate that makes the run
  // diverge), and values whose meaning is a long run (a million steps), not run here.
  std::set<std::string> either = {}, long_runs = {};
};
void PrintTo(const FlagCase& c, std::ostream* os) { *os << c.program << " " << c.flag; }

const std::vector<std::string> kValues = {"0", "-1", "1000000", "99999999999999999999", "abc"};

// Short runs: a few steps, a memory limit that makes a huge shape fail at once with OutOfMemoryError.
const std::map<std::string, std::map<std::string, std::string>> kBase = {
    {"fmnist", {{"--epochs", "1"}, {"--max-steps", "2"}, {"--memory-limit", "300M"}}},
    {"chargpt",
     {{"--steps", "2"},
      {"--layers", "1"},
      {"--width", "32"},
      {"--heads", "2"},
      {"--context", "16"},
      {"--batch", "4"},
      {"--eval-every", "1"},
      {"--sample", "8"},
      {"--memory-limit", "300M"}}},
};

std::string binary(const std::string& program) {
#ifdef FRUGAL_TRAIN_FMNIST
  return program == "fmnist" ? FRUGAL_TRAIN_FMNIST : FRUGAL_TRAIN_CHARGPT;
#else
  (void)program;
  return "";
#endif
}

class TrainerFlags : public ::testing::TestWithParam<FlagCase> {};

TEST_P(TrainerFlags, AbsurdValuesGiveAClearErrorOrTheirDocumentedMeaning) {
  const FlagCase& c = GetParam();
  const std::string exe = binary(c.program);
  if (exe.empty()) GTEST_SKIP() << "the examples are not built (FRUGAL_BUILD_EXAMPLES=OFF)";
  if (c.program == "fmnist" &&
      !std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST is not installed";
  if (c.program == "chargpt" && !std::filesystem::exists("/usr/share/games/fortunes"))
    GTEST_SKIP() << "the fortunes corpus is not installed";
  for (const std::string& value : kValues) {
    if (c.long_runs.count(value)) continue;
    std::vector<std::string> argv{exe};
    for (const auto& [flag, v] : kBase.at(c.program))
      if (flag != c.flag) argv.insert(argv.end(), {flag, v});
    argv.insert(argv.end(), {c.flag, value});
    std::string cmd;
    for (const std::string& a : argv) cmd += a + " ";
    SCOPED_TRACE(cmd);
    // A hang guard, not a timing: a whole epoch (--max-steps 0) takes a few seconds alone, minutes on a busy
    // machine.
    const Outcome o = run(argv, 600);
    ASSERT_TRUE(o.finished) << "still running after 600 s:\n" << o.output;
    ASSERT_FALSE(o.signaled) << "killed by a signal:\n" << o.output;
    EXPECT_EQ(o.output.find("terminate called"), std::string::npos) << o.output;
    if (c.meaningful.count(value)) {
      EXPECT_EQ(o.status, 0) << "a documented value failed:\n" << o.output;
    } else if (c.either.count(value) && o.status == 0) {
      continue;
    } else {
      EXPECT_NE(o.status, 0) << "an absurd value was accepted:\n" << o.output;
      // Clear: it names the flag (CLI11's checks, the trainer's own) or is the library's error or advice.
      const bool clear = o.output.find(c.flag) != std::string::npos ||
                         o.output.find("error: ") != std::string::npos ||
                         o.output.find("out of memory on") != std::string::npos;
      EXPECT_TRUE(clear) << "the error does not say what is wrong:\n" << o.output;
    }
  }
}

std::string name_of(const ::testing::TestParamInfo<FlagCase>& info) {
  std::string n = info.param.program + "_" + info.param.flag.substr(2);
  for (char& ch : n)
    if (ch == '-') ch = '_';
  return n;
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(Fmnist, TrainerFlags, ::testing::Values(
    FlagCase{"fmnist", "--model", {}},
    FlagCase{"fmnist", "--epochs", {}},
    FlagCase{"fmnist", "--batch", {"0"}},  // 0: the model's default
    FlagCase{"fmnist", "--lr", {}, {"1000000", "99999999999999999999"}},  // may diverge: then it stops
    FlagCase{"fmnist", "--optimizer", {}},
    FlagCase{"fmnist", "--schedule", {}},
    FlagCase{"fmnist", "--accum", {}},
    FlagCase{"fmnist", "--amp", {}},
    FlagCase{"fmnist", "--memory-limit", {}},
    FlagCase{"fmnist", "--resume", {}},
    FlagCase{"fmnist", "--threads", {"0"}},  // 0: all cores
    FlagCase{"fmnist", "--seed", {"0", "1000000"}},
    FlagCase{"fmnist", "--data", {}},
    FlagCase{"fmnist", "--max-steps", {"0", "1000000"}}),  // 0: no limit; more than an epoch has: the epoch
    name_of);
INSTANTIATE_TEST_SUITE_P(CharGpt, TrainerFlags, ::testing::Values(
    FlagCase{"chargpt", "--layers", {}},
    FlagCase{"chargpt", "--width", {}},
    FlagCase{"chargpt", "--heads", {}},
    FlagCase{"chargpt", "--context", {}},
    FlagCase{"chargpt", "--batch", {}},
    FlagCase{"chargpt", "--steps", {}, {}, {"1000000"}},
    FlagCase{"chargpt", "--lr", {}, {"1000000", "99999999999999999999"}},
    FlagCase{"chargpt", "--accum", {}},
    FlagCase{"chargpt", "--amp", {}},
    FlagCase{"chargpt", "--clip", {"0", "1000000", "99999999999999999999"}},  // 0: off
    FlagCase{"chargpt", "--memory-limit", {}},
    FlagCase{"chargpt", "--resume", {}},
    FlagCase{"chargpt", "--threads", {"0"}},
    FlagCase{"chargpt", "--seed", {"0", "1000000"}},
    FlagCase{"chargpt", "--data", {}},
    FlagCase{"chargpt", "--eval-every", {"1000000"}},  // only after the last step
    FlagCase{"chargpt", "--sample", {"0"}},            // 0: no sample
    FlagCase{"chargpt", "--temperature", {"1000000", "99999999999999999999"}},
    FlagCase{"chargpt", "--top-k", {"0", "1000000"}}),  // 0, or more than the vocabulary: every byte
    name_of);
// clang-format on

// --save is checked before any training: a folder that does not exist, or a folder given as the file.
TEST(TrainerFlags, SaveToAPathThatCannotBeWrittenFailsBeforeTraining) {
  for (const std::string program : {"fmnist", "chargpt"}) {
    const std::string exe = binary(program);
    if (exe.empty()) GTEST_SKIP() << "the examples are not built";
    for (const std::string path : {"/nonexistent-folder/model.safetensors", "/tmp"}) {
      std::vector<std::string> argv{exe};
      for (const auto& [flag, v] : kBase.at(program)) argv.insert(argv.end(), {flag, v});
      argv.insert(argv.end(), {"--save", path});
      SCOPED_TRACE(program + " --save " + path);
      const Outcome o = run(argv, 120);
      ASSERT_TRUE(o.finished && !o.signaled) << o.output;
      EXPECT_NE(o.status, 0) << o.output;
      EXPECT_NE(o.output.find("--save " + path), std::string::npos) << o.output;
      EXPECT_EQ(o.output.find("step 1"), std::string::npos) << "it trained before failing:\n" << o.output;
    }
  }
}

// A diverging run stops with a clear message instead of training on NaN and exiting 0; an f16 run whose
// loss scaler skips overflowing steps is not diverging, and runs to the end.
TEST(TrainerFlags, NonFiniteLossStopsTheRunButSkippedF16StepsDoNot) {
  for (const std::string program : {"fmnist", "chargpt"}) {
    const std::string exe = binary(program);
    if (exe.empty()) GTEST_SKIP() << "the examples are not built";
    std::vector<std::string> argv{exe};
    for (const auto& [flag, v] : kBase.at(program)) argv.insert(argv.end(), {flag, v});
    std::vector<std::string> diverging = argv;
    diverging.insert(diverging.end(), {"--lr", "1e30"});
    const Outcome d = run(diverging, 120);
    ASSERT_TRUE(d.finished && !d.signaled) << d.output;
    EXPECT_NE(d.status, 0) << program << " trained on to the end:\n" << d.output;
    EXPECT_NE(d.output.find("the run diverged"), std::string::npos) << d.output;
    std::vector<std::string> f16 = argv;
    f16.insert(f16.end(), {"--amp", "f16"});
    const Outcome h = run(f16, 120);
    ASSERT_TRUE(h.finished && !h.signaled) << h.output;
    EXPECT_EQ(h.status, 0) << h.output;
  }
}

}  // namespace

namespace {

// Whether the data `program` trains on is installed: a trainer test skips the program without it.
bool has_data(const std::string& program) {
  if (program == "fmnist")
    return std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
  return std::filesystem::exists("/usr/share/games/fortunes");
}

// An empty folder of this process for one test's files.
std::filesystem::path fresh_dir(const std::string& name, const std::string& program) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("frugal_" + name + "_" + std::to_string(getpid()) + "_" + program);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// --memory-trace PATH: the history of steps 3-5 as a Chrome trace at PATH (JSON, with the allocated counter
// and a track per category) and an SVG beside it (the extension replaced by .svg); a path that cannot be
// written fails before training.
TEST(TrainerFlags, MemoryTraceWritesTheTraceAndThePicture) {
  for (const std::string program : {"fmnist", "chargpt"}) {
    const std::string exe = binary(program);
    if (exe.empty()) GTEST_SKIP() << "the examples are not built";
    if (!has_data(program)) continue;
    SCOPED_TRACE(program);
    const std::filesystem::path dir = fresh_dir("memory_trace", program);
    const std::string trace = (dir / "memory.json").string(), svg = (dir / "memory.svg").string();
    std::vector<std::string> argv{exe};
    for (const auto& [flag, v] : kBase.at(program))
      if (flag != "--max-steps" && flag != "--steps") argv.insert(argv.end(), {flag, v});
    argv.insert(argv.end(), {program == "fmnist" ? "--max-steps" : "--steps", "6", "--memory-trace", trace});
    const Outcome o = run(argv, 300);
    ASSERT_TRUE(o.finished && !o.signaled) << o.output;
    ASSERT_EQ(o.status, 0) << o.output;
    EXPECT_NE(o.output.find("memory trace of steps 3-5"), std::string::npos) << o.output;

    std::ifstream in(trace);
    const nlohmann::json j = nlohmann::json::parse(in);
    int allocated = 0, categories = 0, frees = 0;
    for (const auto& e : j.at("traceEvents")) {
      if (e.at("ph") == "C" && e.at("name") == "allocated") ++allocated;
      if (e.at("ph") == "C" && e.at("name") == "activations") ++categories;
      if (e.at("ph") == "i" && e.at("name").get<std::string>().rfind("free ", 0) == 0) ++frees;
    }
    EXPECT_GT(allocated, 10) << "three steps allocate and free many blocks";
    EXPECT_GT(categories, 1);
    EXPECT_GT(frees, 0);
    std::ifstream svg_in(svg);
    const std::string picture((std::istreambuf_iterator<char>(svg_in)), std::istreambuf_iterator<char>());
    EXPECT_NE(picture.find("<svg"), std::string::npos);
    EXPECT_NE(picture.find("</svg>"), std::string::npos);
    EXPECT_NE(picture.find("peak "), std::string::npos);
    EXPECT_NE(picture.find("parameters"), std::string::npos);

    // An unwritable path is refused before the first step.
    std::vector<std::string> bad = argv;
    bad.back() = "/nonexistent-folder/memory.json";
    const Outcome b = run(bad, 120);
    ASSERT_TRUE(b.finished && !b.signaled) << b.output;
    EXPECT_NE(b.status, 0) << b.output;
    EXPECT_NE(b.output.find("--memory-trace /nonexistent-folder/memory.json"), std::string::npos) << b.output;
    EXPECT_EQ(b.output.find("step 1"), std::string::npos) << "it trained before failing:\n" << b.output;
    std::filesystem::remove_all(dir);
  }
}

// A size as memory::format_bytes writes it ("512 B", "1.50 MiB"), in bytes.
double parse_size(const std::string& text) {
  std::istringstream in(text);
  double v = 0;
  std::string unit;
  in >> v >> unit;
  const std::map<std::string, double> scale{
      {"B", 1}, {"KiB", 1024.0}, {"MiB", 1024.0 * 1024}, {"GiB", 1024.0 * 1024 * 1024}};
  return v * scale.at(unit);
}

// The peak column of one line of the trainers' memory report ("  other   0 B   32.00 KiB").
double report_peak(const std::string& output, const std::string& row) {
  const size_t at = output.find("\n  " + row + " ");
  if (at == std::string::npos) return -1;
  const size_t begin = at + 3 + row.size(), end = output.find('\n', begin);
  // Two sizes, each a number and a unit: the second is the peak.
  std::istringstream in(output.substr(begin, end - begin));
  std::string v1, u1, v2, u2;
  in >> v1 >> u1 >> v2 >> u2;
  return parse_size(v2 + " " + u2);
}

// --profile prints the op table at the end; with --memory-trace the trace holds the op slices of its steps.
// The memory report leaves at most 1% of the peak unexplained ("other").
TEST(TrainerFlags, ProfilePrintsTheTableAndOtherIsAtMostOnePercent) {
  for (const std::string program : {"fmnist", "chargpt"}) {
    const std::string exe = binary(program);
    if (exe.empty()) GTEST_SKIP() << "the examples are not built";
    if (!has_data(program)) continue;
    SCOPED_TRACE(program);
    const std::filesystem::path dir = fresh_dir("profile", program);
    const std::string trace = (dir / "memory.json").string();
    std::vector<std::string> argv{exe};
    for (const auto& [flag, v] : kBase.at(program))
      if (flag != "--max-steps" && flag != "--steps") argv.insert(argv.end(), {flag, v});
    argv.insert(argv.end(),
                {program == "fmnist" ? "--max-steps" : "--steps", "6", "--memory-trace", trace, "--profile"});
    const Outcome o = run(argv, 300);
    ASSERT_TRUE(o.finished && !o.signaled) << o.output;
    ASSERT_EQ(o.status, 0) << o.output;
    for (const char* part : {"profile of the run", "total ms", "linear", "backward", "optimizer", "all ops"})
      EXPECT_NE(o.output.find(part), std::string::npos) << part << "\n" << o.output;
    std::ifstream in(trace);
    const nlohmann::json j = nlohmann::json::parse(in);
    int slices = 0;
    for (const auto& e : j.at("traceEvents")) slices += e.at("ph") == "X";
    EXPECT_GT(slices, 10) << "three steps run many ops";
    const double other = report_peak(o.output, "other"), all = report_peak(o.output, "all allocated (exact)");
    ASSERT_GE(other, 0) << o.output;
    ASSERT_GT(all, 0) << o.output;
    EXPECT_LE(other, 0.01 * all) << o.output;
    std::filesystem::remove_all(dir);
  }
}

// The number after "name=" on its own line of a run's output, -1 when there is none.
long long value_after(const std::string& output, const std::string& name) {
  const size_t at = output.find("\n" + name + "=");
  return at == std::string::npos ? -1 : std::atoll(output.c_str() + at + name.size() + 2);
}

// --estimate predicts the peak of the very run the same flags make, byte for byte (core/estimate.h), without
// training, for each technique the trainers offer (the loaders' queues included: data::DataLoaderOptions'
// in_caller_thread).
TEST(TrainerFlags, EstimateEqualsTheRunsPeak) {
  const std::map<std::string, std::vector<std::vector<std::string>>> variants = {
      {"fmnist",
       {{"--epochs", "1", "--max-steps", "4"},
        {"--epochs", "1", "--max-steps", "4", "--recompute"},
        {"--epochs", "1", "--max-steps", "4", "--accum", "4"},
        {"--epochs", "1", "--max-steps", "4", "--amp", "bf16"},
        {"--epochs", "1", "--max-steps", "4", "--optimizer", "sgd"},
        {"--epochs", "1", "--max-steps", "4", "--optimizer", "adafactor"},
        {"--epochs", "1", "--max-steps", "4", "--optimizer", "adam8bit"},
        {"--epochs", "1", "--max-steps", "4", "--optimizer", "adam8bit-float8"},
        {"--epochs", "1", "--max-steps", "4", "--step-in-backward"},
        {"--epochs", "1", "--max-steps", "4", "--step-in-backward", "--recompute"},
        {"--epochs", "1", "--max-steps", "4", "--model", "cnn", "--batch", "32"}}},
      {"chargpt",
       {{},
        {"--recompute"},
        {"--accum", "2"},
        {"--amp", "bf16"},
        {"--sparse-embeddings"},
        {"--clip", "1"},
        {"--optimizer", "adafactor"},
        {"--optimizer", "adamw8bit"},
        {"--optimizer", "adamw8bit-float8"},
        {"--selective-recompute"},
        {"--step-in-backward"},
        {"--step-in-backward", "--recompute"}}}};
  int ran = 0;
  for (const auto& [program, runs] : variants) {
    const std::string exe = binary(program);
    if (exe.empty()) GTEST_SKIP() << "the examples are not built";
    if (!has_data(program)) continue;
    for (const std::vector<std::string>& flags : runs) {
      std::vector<std::string> argv{exe};
      if (program == "chargpt") {  // a small GPT, a few steps, a validation on the way
        for (const auto& [flag, v] : kBase.at(program))
          if (flag != "--steps" && flag != "--eval-every") argv.insert(argv.end(), {flag, v});
        argv.insert(argv.end(), {"--steps", "4", "--eval-every", "2"});
      }
      argv.insert(argv.end(), flags.begin(), flags.end());
      std::string what = program + " ";
      for (const std::string& f : flags) what += f + " ";
      SCOPED_TRACE(what);
      std::vector<std::string> dry = argv;
      dry.push_back("--estimate");
      const Outcome e = run(dry, 120), o = run(argv, 300);
      ASSERT_TRUE(e.finished && !e.signaled && e.status == 0) << e.output;
      ASSERT_TRUE(o.finished && !o.signaled && o.status == 0) << o.output;
      EXPECT_EQ(e.output.find("train loss"), std::string::npos) << "--estimate trains nothing\n" << e.output;
      EXPECT_NE(e.output.find("optimizer state"), std::string::npos) << e.output;
      const long long estimated = value_after(e.output, "estimated_peak_bytes");
      EXPECT_GT(estimated, 0) << e.output;
      EXPECT_EQ(estimated, value_after(o.output, "peak_allocated_bytes")) << o.output;
      ++ran;
    }
  }
  if (ran == 0) GTEST_SKIP() << "no data for either trainer";
}

// --memory-budget: under 0.6 of the plain peak the plan fits, the run peaks exactly where the plan's dry run
// said, under the budget; a budget nothing fits in is a clear error before any training.
TEST(TrainerFlags, MemoryBudgetPlansARunThatFits) {
  const std::string exe = binary("chargpt");
  if (exe.empty()) GTEST_SKIP() << "the examples are not built";
  if (!has_data("chargpt")) GTEST_SKIP() << "no corpus";
  // W3's GPT: its peak is well above the 20 MiB segment that holds the corpus, which a budget must cover too.
  const std::vector<std::string> base{exe, "--steps", "3", "--eval-every", "3", "--sample", "0"};
  std::vector<std::string> dry = base;
  dry.push_back("--estimate");
  const Outcome e = run(dry, 120);
  ASSERT_TRUE(e.finished && e.status == 0) << e.output;
  const long long plain = value_after(e.output, "estimated_peak_bytes");
  ASSERT_GT(plain, 0) << e.output;
  std::vector<std::string> argv = base;
  const long long budget = plain * 6 / 10;
  argv.insert(argv.end(), {"--memory-budget", std::to_string(budget)});
  const Outcome o = run(argv, 300);
  ASSERT_TRUE(o.finished && !o.signaled && o.status == 0) << o.output;
  EXPECT_NE(o.output.find("plan: "), std::string::npos) << o.output;
  const long long planned = value_after(o.output, "planned_peak_bytes"),
                  measured = value_after(o.output, "peak_allocated_bytes");
  EXPECT_EQ(planned, measured) << o.output;
  EXPECT_LE(measured, budget) << o.output;
  std::vector<std::string> tiny = base;
  tiny.insert(tiny.end(), {"--memory-budget", "8M"});
  const Outcome t = run(tiny, 120);
  ASSERT_TRUE(t.finished && !t.signaled) << t.output;
  EXPECT_EQ(t.status, 1) << t.output;
  EXPECT_NE(t.output.find("no plan fits in 8.00 MiB"), std::string::npos) << t.output;
  EXPECT_EQ(t.output.find("train loss"), std::string::npos) << t.output;
  // A run that runs out of memory under --memory-limit is told which --memory-budget would fit, and it does.
  std::vector<std::string> limited = base;
  limited.insert(limited.end(), {"--memory-limit", std::to_string(budget)});
  const Outcome l = run(limited, 300);
  ASSERT_TRUE(l.finished && !l.signaled) << l.output;
  EXPECT_EQ(l.status, 2) << l.output;
  const std::string hint = "to fit, try --memory-budget " + std::to_string(budget) + " (plans ";
  EXPECT_NE(l.output.find(hint), std::string::npos) << l.output;
}

// train_fmnist's plan: a budget of the plain run's reserved bytes needs nothing changed, and the run peaks
// where the plan said; W2 fits 80 MiB with micro-batches and peaks where the plan said, but not 70 MiB: its
// evaluation (batches of 250, 71.7 MiB with the dataset) needs more than a training plan can save.
TEST(TrainerFlags, MemoryBudgetPlansTheFashionMnistRun) {
  const std::string exe = binary("fmnist");
  if (exe.empty()) GTEST_SKIP() << "the examples are not built";
  if (!has_data("fmnist")) GTEST_SKIP() << "no Fashion-MNIST";
  const std::vector<std::string> base{exe, "--epochs", "1", "--max-steps", "4"};
  std::vector<std::string> argv = base;
  argv.insert(argv.end(), {"--memory-budget", "200M"});
  const Outcome o = run(argv, 300);
  ASSERT_TRUE(o.finished && !o.signaled && o.status == 0) << o.output;
  EXPECT_NE(o.output.find("plan: 1 micro-batch, recompute 0 of 1 blocks, f32"), std::string::npos)
      << o.output;
  EXPECT_EQ(value_after(o.output, "planned_peak_bytes"), value_after(o.output, "peak_allocated_bytes"))
      << o.output;
  std::vector<std::string> cnn = base;
  cnn.insert(cnn.end(), {"--model", "cnn", "--memory-budget", "80M"});
  const Outcome c = run(cnn, 300);
  ASSERT_TRUE(c.finished && !c.signaled && c.status == 0) << c.output;
  EXPECT_NE(c.output.find("plan: 2 micro-batches, recompute 0 of 1 blocks, f32"), std::string::npos)
      << c.output;
  EXPECT_EQ(value_after(c.output, "planned_peak_bytes"), value_after(c.output, "peak_allocated_bytes"))
      << c.output;
  cnn.back() = "70M";
  const Outcome d = run(cnn, 300);
  ASSERT_TRUE(d.finished && !d.signaled) << d.output;
  EXPECT_EQ(d.status, 1) << d.output;
  EXPECT_NE(d.output.find("no plan fits in 70.00 MiB"), std::string::npos) << d.output;
  // W1 at batch 1024 (its plain peak 69 MiB allocated) out of memory under a limit of 66 MiB, which it fits
  // with 4 micro-batches: the message names that plan. (At batch 128 the evaluation's batches of 250 set the
  // peak, and no plan lowers it.)
  std::vector<std::string> limited = base;
  limited.insert(limited.end(), {"--batch", "1024", "--memory-limit", "66M"});
  const Outcome l = run(limited, 300);
  ASSERT_TRUE(l.finished && !l.signaled) << l.output;
  EXPECT_EQ(l.status, 2) << l.output;
  EXPECT_NE(l.output.find("to fit, try --memory-budget 69206016 (plans 4 micro-batches"), std::string::npos)
      << l.output;
}

// Note [a planned run makes its batches in order] (examples/train_fmnist.cpp): under --memory-budget the
// loaders' batches are made in the training thread, where the plan's dry run made them; without it a worker
// thread makes them. The memory trace of steps 3-5 names the thread of every block event.
TEST(TrainerFlags, APlannedRunMakesItsBatchesInTheTrainingThread) {
  const std::string exe = binary("fmnist");
  if (exe.empty()) GTEST_SKIP() << "the examples are not built";
  if (!has_data("fmnist")) GTEST_SKIP() << "no Fashion-MNIST";
  for (const bool planned : {false, true}) {
    SCOPED_TRACE(planned ? "--memory-budget" : "no budget");
    const std::filesystem::path dir = fresh_dir("batch_threads", planned ? "planned" : "plain");
    const std::string trace = (dir / "memory.json").string();
    std::vector<std::string> argv{exe, "--epochs", "1", "--max-steps", "6", "--memory-trace", trace};
    if (planned) argv.insert(argv.end(), {"--memory-budget", "200M"});
    const Outcome o = run(argv, 300);
    ASSERT_TRUE(o.finished && !o.signaled && o.status == 0) << o.output;
    std::ifstream in(trace);
    const nlohmann::json j = nlohmann::json::parse(in);
    std::set<int> all_threads, data_threads;
    for (const auto& e : j.at("traceEvents")) {
      if (e.at("ph") != "i" || !e.contains("args") || !e.at("args").contains("thread")) continue;
      const int thread = e.at("args").at("thread").get<int>();
      all_threads.insert(thread);
      if (e.at("name").get<std::string>().rfind("alloc ", 0) == 0 && e.at("args").value("tag", "") == "data")
        data_threads.insert(thread);
    }
    ASSERT_FALSE(data_threads.empty()) << "three steps take three batches";
    if (planned)
      EXPECT_EQ(all_threads.size(), 1u) << "a batch made by a thread other than the training one";
    else
      EXPECT_EQ(all_threads.size(), 2u) << "the worker thread makes the batches";
  }
}

}  // namespace
