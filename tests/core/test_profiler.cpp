// The profiler (core/profiler.h): which ops it records (the outermost scope, forward and backward), their
// shapes, dtype and bytes (checked against the memory history's events), the statistics and the table, its
// guards and bounds, and the trace with and without a memory history.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "tests/test_util.h"

namespace frugal {
namespace {

using memory::Phase;
using testing::expect_error;

class Profiler : public testing::ScratchDirTest {
 protected:
  void TearDown() override {
    memory::record_history(kCPU, false);
    ScratchDirTest::TearDown();
  }
};

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return nlohmann::json::parse(s.str());
}

std::vector<profiler::OpRecord> records_named(const std::string& name, Phase phase) {
  std::vector<profiler::OpRecord> out;
  for (const auto& r : profiler::records())
    if (r.name == name && r.phase == phase) out.push_back(r);
  return out;
}

TEST_F(Profiler, RecordsEachOpForwardAndBackwardWithShapesAndDtype) {
  Tensor a = randn({4, 3}).requires_grad_();
  Tensor b = randn({3, 2}, DType::F32);
  {
    profiler::Profile p;
    ASSERT_TRUE(p.owns());
    EXPECT_TRUE(profiler::recording());
    Tensor loss = sum(relu(matmul(a, b)));
    loss.backward();
  }
  EXPECT_FALSE(profiler::recording());
  const auto mm = records_named("matmul", Phase::Forward);
  ASSERT_EQ(mm.size(), 1u);
  EXPECT_EQ(mm[0].shapes(), "[4, 3], [3, 2]");
  EXPECT_EQ(mm[0].dtype, DType::F32);
  EXPECT_EQ(mm[0].num_inputs, 2);
  EXPECT_GE(mm[0].duration_ns, 0);
  EXPECT_GT(mm[0].bytes, 0);  // its output
  // The backward rules are records of phase backward, named after their nodes, with the gradient they get.
  std::map<std::string, int> backward;
  for (const auto& r : profiler::records())
    if (r.phase == Phase::Backward) ++backward[r.name];
  EXPECT_FALSE(backward.empty());
  const auto relu_back = records_named("relu", Phase::Backward);
  ASSERT_EQ(relu_back.size(), 1u);
  EXPECT_EQ(relu_back[0].shapes(), "[4, 2]");
  // Records are in the order the ops ended, on this thread.
  const auto all = profiler::records();
  for (size_t i = 1; i < all.size(); ++i)
    EXPECT_GE(all[i].start_ns + all[i].duration_ns, all[i - 1].start_ns + all[i - 1].duration_ns);
  EXPECT_EQ(all.front().thread, all.back().thread);
}

// An op's bytes are what it allocated, ops it called included: the memory history's Alloc events carry the
// op's name, and their rounded sizes add up to the record's bytes.
TEST_F(Profiler, BytesOfAnOpAreItsAllocationsInTheMemoryHistory) {
  Tensor x = randn({64, 300});
  Tensor w = randn({200, 300});
  Tensor bias = randn({200});
  Tensor d = randn({64, 200}, DType::F64);
  {
    memory::History h(kCPU);
    profiler::Profile p;
    Tensor y = ops::linear(x, w, bias);
    Tensor z = ops::add(y, d);  // casts y to f64 inside: the cast counts as add's
    Tensor s = ops::softmax(z, 1);
  }
  std::map<std::string, int64_t> history_bytes;
  for (const auto& e : memory::history(kCPU).events)
    if (e.kind == memory::EventKind::Alloc) history_bytes[e.op] += e.size;
  std::map<std::string, int64_t> profile_bytes;
  for (const auto& r : profiler::records()) profile_bytes[r.name] += r.bytes;
  for (const char* op : {"linear", "add", "softmax"}) {
    EXPECT_GT(profile_bytes[op], 0) << op;
    EXPECT_EQ(profile_bytes[op], history_bytes[op]) << op;
  }
  EXPECT_EQ(profile_bytes.count("cast"), 0u);         // the outermost op only
  EXPECT_GE(profile_bytes["add"], 64 * 200 * 8 * 2);  // the cast copy and the f64 sum
  EXPECT_EQ(records_named("add", Phase::Forward)[0].shapes(), "[64, 200], [64, 200]");
  EXPECT_EQ(records_named("add", Phase::Forward)[0].dtype, DType::F32);
}

TEST_F(Profiler, StatisticsAndTheTableAddUpTheRecords) {
  Tensor x = randn({100});
  {
    profiler::Profile p;
    for (int i = 0; i < 5; ++i) x = relu(x);
    for (int i = 0; i < 3; ++i) x = exp(x) * 0.5;
  }
  const auto stats = profiler::op_stats();
  std::map<std::string, profiler::OpStats> by_name;
  for (const auto& s : stats) by_name[s.name] = s;
  EXPECT_EQ(by_name["relu"].calls, 5);
  EXPECT_EQ(by_name["exp"].calls, 3);
  EXPECT_EQ(by_name["mul"].calls, 3);
  for (const auto& s : stats) {
    int64_t total = 0, bytes = 0, calls = 0;
    for (const auto& r : profiler::records())
      if (r.name == s.name && r.phase == s.phase) {
        total += r.duration_ns;
        bytes += r.bytes;
        ++calls;
        EXPECT_LE(s.min_ns, r.duration_ns);
        EXPECT_GE(s.max_ns, r.duration_ns);
      }
    EXPECT_EQ(s.calls, calls) << s.name;
    EXPECT_EQ(s.total_ns, total) << s.name;
    EXPECT_EQ(s.bytes, bytes) << s.name;
  }
  for (size_t i = 1; i < stats.size(); ++i) EXPECT_GE(stats[i - 1].total_ns, stats[i].total_ns);
  const std::string table = profiler::summary();
  EXPECT_NE(table.find("op "), std::string::npos) << table;
  EXPECT_NE(table.find("relu"), std::string::npos) << table;
  EXPECT_NE(table.find("all ops"), std::string::npos) << table;
  // Rows in the order of op_stats; a short table folds the rest into one line.
  EXPECT_LT(table.find(stats[0].name), table.find(stats.back().name)) << table;
  const std::string short_table = profiler::summary(1);
  EXPECT_NE(short_table.find("(" + std::to_string(stats.size() - 1) + " more)"), std::string::npos)
      << short_table;
}

TEST_F(Profiler, NothingIsRecordedWhileOffAndAnInnerProfileJoins) {
  Tensor x = randn({10});
  {
    profiler::Profile p;
    x = relu(x);
    {
      profiler::Profile inner;
      EXPECT_FALSE(inner.owns());
      x = relu(x);
    }
    EXPECT_TRUE(profiler::recording());  // the inner one neither stopped nor cleared it
    x = relu(x);
  }
  EXPECT_EQ(records_named("relu", Phase::Forward).size(), 3u);
  x = relu(x);  // off: the latest profile stays as it was
  EXPECT_EQ(records_named("relu", Phase::Forward).size(), 3u);
  {
    profiler::Profile p;  // a fresh one drops the previous records
    EXPECT_TRUE(profiler::records().empty());
  }
}

TEST_F(Profiler, BoundKeepsTheStatisticsExact) {
  Tensor x = randn({10});
  {
    profiler::Profile p("", 2);
    for (int i = 0; i < 7; ++i) x = relu(x);
  }
  EXPECT_EQ(profiler::records().size(), 2u);
  EXPECT_EQ(profiler::dropped_records(), 5);
  EXPECT_EQ(profiler::op_stats().at(0).calls, 7);
  expect_error<Error>([] { profiler::Profile p("", 0); }, {"max_records must be at least 1"});
}

TEST_F(Profiler, OpsOfSeveralThreadsGetTheirOwnTracks) {
  {
    profiler::Profile p(path("threads.json"));
    std::thread other([] { Tensor y = relu(randn({10})); });
    other.join();
    Tensor z = relu(randn({10}));
  }
  std::set<uint32_t> threads;
  for (const auto& r : profiler::records()) threads.insert(r.thread);
  EXPECT_EQ(threads.size(), 2u);
  std::set<int64_t> tids;
  const nlohmann::json trace = read_json(path("threads.json"));
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "X") tids.insert(e.at("tid").get<int64_t>());
  EXPECT_EQ(tids.size(), 2u);
  EXPECT_EQ(tids.count(1), 0u);  // tid 1 is the memory history's blocks
}

// The profile's trace: one "X" slice per record, with its phase, shapes, dtype and bytes; with the memory
// history of the same span, its counters too, on the same time base (each op's allocations fall inside
// its slice).
TEST_F(Profiler, TraceHoldsTheSlicesAndTheMemoryCounters) {
  Tensor a = randn({32, 16}).requires_grad_();
  {
    memory::History h(kCPU);
    profiler::Profile p(path("profile.json"));
    Tensor loss = sum(tanh(matmul(a, a.t())));
    loss.backward();
  }
  const nlohmann::json trace = read_json(path("profile.json"));
  std::vector<nlohmann::json> slices;
  int counters = 0;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "X") slices.push_back(e);
    if (e.at("ph") == "C") ++counters;
  }
  EXPECT_EQ(slices.size(), profiler::records().size());
  EXPECT_GT(counters, 0);
  EXPECT_EQ(trace.at("otherData").at("ops").get<size_t>(), slices.size());
  bool saw_backward = false;
  for (const auto& s : slices) {
    EXPECT_GE(s.at("ts").get<double>(), 0);
    EXPECT_GE(s.at("dur").get<double>(), 0);
    EXPECT_TRUE(s.at("args").contains("shapes"));
    EXPECT_EQ(s.at("args").at("dtype"), "f32");
    saw_backward |= s.at("args").at("phase") == "backward";
  }
  EXPECT_TRUE(saw_backward);
  // The matmul's output allocation (an "alloc" instant with op matmul) lies inside the matmul slice.
  double mm_start = -1, mm_end = -1;
  for (const auto& s : slices)
    if (s.at("name") == "matmul" && s.at("args").at("phase") == "forward") {
      mm_start = s.at("ts").get<double>();
      mm_end = mm_start + s.at("dur").get<double>();
    }
  ASSERT_GE(mm_start, 0);
  int inside = 0;
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "i" && e.at("args").contains("op") && e.at("args").at("op") == "matmul" &&
        e.at("args").at("phase") == "forward") {
      const double t = e.at("ts").get<double>();
      EXPECT_GE(t, mm_start - 0.001);
      EXPECT_LE(t, mm_end + 0.001);
      ++inside;
    }
  EXPECT_GT(inside, 0);
  // memory::dump_trace carries the op slices of its own span as well.
  memory::dump_trace(path("memory.json"));
  int memory_slices = 0;
  const nlohmann::json memory_trace = read_json(path("memory.json"));
  for (const auto& e : memory_trace.at("traceEvents")) memory_slices += e.at("ph") == "X";
  EXPECT_EQ(memory_slices, int(slices.size()));
}

TEST_F(Profiler, ATraceWithoutHistoryAndAnUnwritablePath) {
  {
    profiler::Profile p(path("ops.json"));
    Tensor y = relu(randn({10}));
  }
  const nlohmann::json trace = read_json(path("ops.json"));
  EXPECT_EQ(trace.at("otherData").at("producer"), "frugal profiler");
  for (const auto& e : trace.at("traceEvents")) EXPECT_NE(e.at("ph"), "C");
  profiler::Profile bad(path("no-such-dir/ops.json"));
  expect_error<Error>([&] { bad.stop(); }, {"no-such-dir/ops.json"});
  EXPECT_FALSE(profiler::recording());  // stopped, though the file could not be written
}

}  // namespace
}  // namespace frugal
