// The memory history (core/memory_history.h): what it records (exact statistics at every event, requested
// and rounded bytes, phases, ops, categories), its guards and bounds, the Chrome trace, the SVG picture and
// the out-of-memory dump.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "core/allocator_base.h"
#include "optim/adam.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using memory::Category;
using memory::EventKind;
using memory::HistoryEvent;
using memory::Phase;
using testing::expect_error;

class MemoryHistory : public testing::ScratchDirTest {
 protected:
  void TearDown() override {
    memory::record_history(kCPU, false);
    memory::set_memory_limit(kCPU, 0);
    ScratchDirTest::TearDown();
  }
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_file(path)); }

// The values of one counter track of a trace, in file order.
std::vector<int64_t> counter_values(const nlohmann::json& trace, const std::string& name) {
  std::vector<int64_t> out;
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "C" && e.at("name") == name) out.push_back(e.at("args").at("bytes").get<int64_t>());
  return out;
}

uint64_t address_of(const Tensor& t) { return uint64_t(reinterpret_cast<uintptr_t>(t.raw_data())); }

std::vector<HistoryEvent> events_of(EventKind kind) {
  std::vector<HistoryEvent> out;
  for (const HistoryEvent& e : memory::history(kCPU).events)
    if (e.kind == kind) out.push_back(e);
  return out;
}

// The trace's "allocated" counter is the arena's statistic at every alloc and free: the test keeps its own
// list from memory::stats after each one, through new segments, frees that merge, and a cache flush.
TEST_F(MemoryHistory, AllocatedCounterEqualsTheStatisticAtEveryEvent) {
  Tensor kept = empty({1000});  // live before the history starts: it is the starting value
  std::vector<int64_t> expected;
  {
    memory::History h(kCPU);
    ASSERT_TRUE(h.owns());
    expected.push_back(memory::stats().allocated.current);
    std::vector<Tensor> live;
    const int64_t sizes[] = {1, 100, 129, 4096, 70000, 300000, 3 << 20, 4 << 20};  // elements of f32
    for (int round = 0; round < 3; ++round) {
      for (int64_t n : sizes) {
        live.push_back(empty({n + round}));
        expected.push_back(memory::stats().allocated.current);
      }
      for (size_t i = 0; i < live.size(); i += 2) {  // every other one: frees next to live blocks
        live[i] = Tensor();
        expected.push_back(memory::stats().allocated.current);
      }
      std::erase_if(live, [](const Tensor& t) { return !t.defined(); });
    }
    live.clear();  // the rest, in order
    // clear() frees them one by one; the statistic after all is the last expected value, and each free in
    // between is the running difference, which the history gives exactly.
    memory::empty_cache(kCPU);
  }
  const std::string path = this->path("trace.json");
  memory::dump_trace(path);
  const nlohmann::json trace = read_json(path);
  const std::vector<int64_t> allocated = counter_values(trace, "allocated");
  // Everything up to the clear() is checked value by value; the frees of clear() end at today's statistic.
  ASSERT_GE(allocated.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(allocated[i], expected[i]) << "counter event " << i;
  EXPECT_EQ(allocated.back(), memory::stats().allocated.current);
  // Each of clear()'s frees lowers the counter by its block's size, exactly.
  for (size_t i = expected.size(); i < allocated.size(); ++i) EXPECT_LT(allocated[i], allocated[i - 1]);
  // The reserved track ends where the statistic is after the flush, and the flush is an instant.
  EXPECT_EQ(counter_values(trace, "reserved").back(), memory::stats().reserved.current);
  bool flush = false;
  for (const auto& e : trace.at("traceEvents")) flush |= e.at("ph") == "i" && e.at("name") == "cache flush";
  EXPECT_TRUE(flush);
  // The category tracks add up to the allocated one at the end.
  int64_t sum = 0;
  for (int c = 0; c < memory::kNumCategories; ++c)
    sum += counter_values(trace, memory::category_name(Category(c))).back();
  EXPECT_EQ(sum, memory::stats().allocated.current);
  EXPECT_EQ(trace.at("otherData").at("truncated"), false);
}

// Each event's own statistics match a replay of the sizes: the order of the events is the order in which
// the statistics changed, also when two threads allocate at once.
TEST_F(MemoryHistory, EventOrderIsStatisticOrderAcrossThreads) {
  memory::History h(kCPU);
  auto work = [](int seed) {
    for (int i = 0; i < 300; ++i) {
      Tensor a = empty({int64_t(100 + (i * 37 + seed) % 5000)});
      Tensor b = empty({int64_t(10 + (i * 11 + seed) % 300)});
      a = Tensor();
    }
  };
  std::thread t1(work, 1), t2(work, 2);
  t1.join();
  t2.join();
  const memory::HistoryRecord r = memory::history(kCPU);
  int64_t allocated = r.start_allocated;
  std::set<uint32_t> threads;
  for (const HistoryEvent& e : r.events) {
    if (e.kind == EventKind::Alloc) allocated += e.size;
    if (e.kind == EventKind::Free) allocated -= e.size;
    if (e.kind == EventKind::Alloc || e.kind == EventKind::Free) {
      ASSERT_EQ(e.allocated, allocated);
      threads.insert(e.thread);
    }
  }
  EXPECT_EQ(threads.size(), 2u);
}

// An event holds the bytes asked for and the rounded size of the block the arena gave, as its snapshot has
// them.
TEST_F(MemoryHistory, RecordsRequestedAndRoundedBytes) {
  memory::History h(kCPU);
  const Tensor t = empty({1001}, DType::F32);
  const std::vector<HistoryEvent> allocs = events_of(EventKind::Alloc);
  ASSERT_EQ(allocs.size(), 1u);
  EXPECT_EQ(allocs[0].requested, 1001 * 4);
  EXPECT_EQ(allocs[0].address, address_of(t));
  bool found = false;
  for (const memory::BlockInfo& b : memory::snapshot())
    if (b.address == address_of(t)) {
      found = true;
      EXPECT_EQ(allocs[0].size, b.size);
      EXPECT_EQ(allocs[0].segment, b.segment);
    }
  EXPECT_TRUE(found);
  EXPECT_GT(allocs[0].size, allocs[0].requested);  // 4004 bytes is not a multiple of the arena's rounding
  EXPECT_EQ(allocs[0].op, std::string("empty"));
}

// A small training step: the forward's ops, the backward's nodes, the optimizer's state, the gradients.
TEST_F(MemoryHistory, RecordsPhasesOpsAndCategories) {
  Tensor w = randn({8, 4}).requires_grad_();
  const Tensor x = randn({16, 8});
  optim::Adam opt({w}, optim::AdamOptions(1e-3));
  memory::History h(kCPU);
  Tensor loss = mean(relu(matmul(x, w)));
  loss.backward();
  opt.step();
  {
    NoGradGuard no_grad;
    Tensor y = matmul(x, w.detach());
  }
  {
    memory::PhaseScope data(Phase::Data);
    Tensor batch = empty({4});
  }
  std::map<std::pair<Phase, std::string>, int> seen;
  std::set<Category> categories;
  for (const HistoryEvent& e : events_of(EventKind::Alloc)) {
    ++seen[{e.phase, e.op}];
    categories.insert(e.category);
  }
  EXPECT_TRUE(seen.count({Phase::Forward, "matmul"})) << "matmul's output in the forward";
  EXPECT_TRUE(seen.count({Phase::Forward, "relu"}));
  EXPECT_TRUE(seen.count({Phase::Forward, "mean"}));
  EXPECT_TRUE(seen.count({Phase::Other, "matmul"})) << "grad mode off: phase other";
  EXPECT_TRUE(seen.count({Phase::Data, "empty"}));
  int optimizer = 0;
  std::set<std::string> backward_ops;
  for (const auto& [key, n] : seen) {
    if (key.first == Phase::Backward) backward_ops.insert(key.second);
    if (key.first == Phase::Optimizer) ++optimizer;
  }
  // A backward rule's bytes carry the node's name (Note [op names in the history]); the engine's own (the
  // loss's implicit gradient, sums of gradients) their op's. Every one is named.
  EXPECT_TRUE(backward_ops.count("matmul") || backward_ops.count("relu") || backward_ops.count("mean"));
  EXPECT_FALSE(backward_ops.empty());
  EXPECT_FALSE(backward_ops.count("")) << "an allocation in backward without an op";
  EXPECT_GT(optimizer, 0);
  EXPECT_TRUE(categories.count(Category::Activations));
  EXPECT_TRUE(categories.count(Category::Data));
  EXPECT_TRUE(categories.count(Category::Other));
  // The gradient and the optimizer state are retagged after allocation: their category follows.
  std::set<Category> retagged;
  for (const HistoryEvent& e : events_of(EventKind::Retag)) retagged.insert(e.category);
  EXPECT_TRUE(retagged.count(Category::Gradients));
  EXPECT_TRUE(retagged.count(Category::OptimizerState));
  // Blocks live before the history started are its first events (w: its tag decides nothing; phase other).
  EXPECT_FALSE(events_of(EventKind::Live).empty());
}

// The breakdown at the peak adds up to it, each category's own peak is at least its share there, and a
// truncated record is refused.
TEST_F(MemoryHistory, PeakByCategoryAddsUpToThePeak) {
  Tensor params;
  {
    memory::Tag t("parameters");
    params = empty({1000});
  }
  memory::HistoryRecord record;
  int64_t peak = 0;
  {
    memory::History h(kCPU);
    memory::reset_peak();
    {
      memory::Tag t("activations");
      Tensor a = empty({50000}), b = empty({70000});
      peak = memory::stats().allocated.peak;
    }
    memory::Tag t("data");
    Tensor c = empty({20000});
    record = memory::history(kCPU);
  }
  const memory::PeakBreakdown p = memory::peak_by_category(record);
  EXPECT_EQ(p.total, peak);
  int64_t sum = 0;
  for (int c = 0; c < memory::kNumCategories; ++c) {
    sum += p.by_category[c];
    EXPECT_GE(p.category_peaks[c], p.by_category[c]);
  }
  EXPECT_EQ(sum, p.total);
  EXPECT_EQ(p.by_category[int(Category::Parameters)], 4096);  // 4000 bytes, rounded to 512
  EXPECT_EQ(p.by_category[int(Category::Data)], 0);           // c came after the peak
  EXPECT_GT(p.category_peaks[int(Category::Data)], 0);
  EXPECT_GT(p.time_ns, 0);
  memory::HistoryRecord truncated = record;
  truncated.truncated = true;
  expect_error<Error>([&] { memory::peak_by_category(truncated); }, {"truncated"});
}

TEST(MemoryCategories, FollowTheTagThenThePhase) {
  EXPECT_EQ(memory::category_of("gradients", Phase::Backward), Category::Gradients);
  EXPECT_EQ(memory::category_of("optimizer", Phase::Optimizer), Category::OptimizerState);
  EXPECT_EQ(memory::category_of("optimizer/step", Phase::Other), Category::OptimizerState);
  EXPECT_EQ(memory::category_of("optimizer step", Phase::Other), Category::Other);  // components, not words
  EXPECT_EQ(memory::category_of("parameters", Phase::Other), Category::Parameters);
  EXPECT_EQ(memory::category_of("model/parameters/fc1", Phase::Forward), Category::Parameters);
  EXPECT_EQ(memory::category_of("dataset", Phase::Other), Category::Data);
  EXPECT_EQ(memory::category_of("data", Phase::Forward), Category::Data);
  EXPECT_EQ(memory::category_of("activations/block3", Phase::Forward), Category::Activations);
  // The innermost component that names a category wins, whatever the phase.
  EXPECT_EQ(memory::category_of("backward/recompute", Phase::Recompute), Category::Activations);
  EXPECT_EQ(memory::category_of("backward/recompute", Phase::Other), Category::Activations);
  EXPECT_EQ(memory::category_of("recompute/backward", Phase::Recompute), Category::Gradients);
  EXPECT_EQ(memory::category_of("parameters/data", Phase::Other), Category::Data);
  EXPECT_EQ(memory::category_of("backward", Phase::Other), Category::Gradients);
  EXPECT_EQ(memory::category_of("evaluation", Phase::Other), Category::Activations);
  EXPECT_EQ(memory::category_of("model/inference", Phase::Other), Category::Activations);
  // A tag that names none: the phase decides.
  EXPECT_EQ(memory::category_of("", Phase::Forward), Category::Activations);
  EXPECT_EQ(memory::category_of("", Phase::Recompute), Category::Activations);
  EXPECT_EQ(memory::category_of("", Phase::Backward), Category::Gradients);
  EXPECT_EQ(memory::category_of("step 3", Phase::Optimizer), Category::OptimizerState);
  EXPECT_EQ(memory::category_of("", Phase::Data), Category::Data);
  EXPECT_EQ(memory::category_of("", Phase::Other), Category::Other);
  EXPECT_EQ(memory::category_of("backwards", Phase::Other), Category::Other);
}

TEST_F(MemoryHistory, OffRecordsNothing) {
  EXPECT_FALSE(memory::history_enabled(kCPU));
  const size_t before = memory::history(kCPU).events.size();  // what an earlier test left, if any
  { Tensor t = empty({100}); }
  EXPECT_EQ(memory::history(kCPU).events.size(), before);
  size_t n = 0;
  {
    memory::History h(kCPU);
    Tensor t = empty({100});
    n = memory::history(kCPU).events.size();
    EXPECT_GT(n, 0u);
  }
  EXPECT_FALSE(memory::history_enabled(kCPU));
  { Tensor t = empty({100}); }
  memory::empty_cache(kCPU);
  EXPECT_EQ(memory::history(kCPU).events.size(), n + 1) << "only the free inside the scope was added";
}

// Guards nest: the outermost starts and stops the recording; an inner one joins it. record_history(false)
// stops it whatever guards are alive (their destructors then change nothing).
TEST_F(MemoryHistory, NestedAndDuplicateGuardsJoinTheOutermost) {
  memory::History outer(kCPU);
  EXPECT_TRUE(outer.owns());
  Tensor a = empty({10});
  {
    memory::History inner(kCPU);
    memory::History again(kCPU);
    EXPECT_FALSE(inner.owns());
    EXPECT_FALSE(again.owns());
    Tensor b = empty({10});
  }
  EXPECT_TRUE(memory::history_enabled(kCPU)) << "the inner guards did not stop the outer one";
  memory::record_history(kCPU, true);  // already on: nothing changes, nothing is cleared
  EXPECT_EQ(events_of(EventKind::Alloc).size(), 2u);
  memory::record_history(kCPU, false);
  EXPECT_FALSE(memory::history_enabled(kCPU));
  { Tensor c = empty({10}); }
  EXPECT_EQ(events_of(EventKind::Alloc).size(), 2u);
  memory::record_history(kCPU, true);  // a fresh record: a's block is live, b's is gone
  EXPECT_EQ(events_of(EventKind::Alloc).size(), 0u);
  bool a_live = false;
  for (const HistoryEvent& e : events_of(EventKind::Live)) a_live |= e.address == address_of(a);
  EXPECT_TRUE(a_live);
  {
    memory::History late(kCPU);  // joins the recording record_history started
    EXPECT_FALSE(late.owns());
  }
  EXPECT_TRUE(memory::history_enabled(kCPU));
}

// A guard whose recording was stopped does not stop a later one.
TEST_F(MemoryHistory, AGuardStopsOnlyTheRecordingItStarted) {
  auto first = std::make_unique<memory::History>(kCPU);
  EXPECT_TRUE(first->owns());
  memory::record_history(kCPU, false);
  memory::History second(kCPU);
  EXPECT_TRUE(second.owns());
  first.reset();
  EXPECT_TRUE(memory::history_enabled(kCPU)) << "the first guard stopped the second's recording";
}

// Note [history bounds]: the buffer stops when full and says how much it dropped.
TEST_F(MemoryHistory, StopsWhenFullAndSaysSo) {
  {
    memory::History h(kCPU, 10);
    for (int i = 0; i < 20; ++i) Tensor t = empty({64});
  }
  const memory::HistoryRecord r = memory::history(kCPU);
  EXPECT_EQ(r.events.size(), 10u);
  EXPECT_TRUE(r.truncated);
  EXPECT_GE(r.dropped, int64_t(40 - 10));  // 20 allocs and 20 frees, and what was live first
  memory::dump_trace(path("t.json"));
  EXPECT_EQ(read_json(path("t.json")).at("otherData").at("truncated"), true);
  memory::dump_svg(path("t.svg"));
  EXPECT_NE(read_file(path("t.svg")).find("truncated"), std::string::npos);
  expect_error<Error>([] { memory::History h(kCPU, 0); }, {"max_events", "at least 1"});
  expect_error<Error>([] { memory::record_history(kCPU, true, 0); }, {"max_events"});
}

TEST_F(MemoryHistory, APathThatCannotBeWrittenIsAClearError) {
  memory::History h(kCPU);
  Tensor t = empty({10});
  const std::string bad = "/nonexistent-folder/x.json";
  expect_error<Error>([&] { memory::dump_trace(bad); }, {"dump_trace", bad, "cannot write"});
  expect_error<Error>([&] { memory::dump_svg(bad); }, {"dump_svg", bad, "cannot write"});
  expect_error<Error>([&] { memory::dump_snapshot(bad); }, {"dump_snapshot", bad});
  expect_error<Error>([&] { memory::dump_trace(""); }, {"dump_trace", "empty"});
  expect_error<Error>([&] { memory::dump_svg(dir_.string()); }, {"dump_svg", dir_.string()});  // a folder
  expect_error<Error>([] { memory::set_oom_dump_prefix(""); }, {"set_oom_dump_prefix", "empty"});
  EXPECT_TRUE(memory::history_enabled(kCPU)) << "a failed dump leaves the history as it was";
}

// A tiny XML well-formedness check (what the SVG needs): every element closed in order, attribute values
// quoted, no stray '<' or '&' in text. Returns "" or what is wrong.
std::string xml_problem(const std::string& s) {
  std::vector<std::string> open;
  size_t i = 0;
  if (s.rfind("<?xml", 0) == 0) i = s.find("?>") + 2;
  while (i < s.size()) {
    if (s[i] == '&') {
      const size_t semi = s.find(';', i);
      const std::string ent = s.substr(i, semi == std::string::npos ? 8 : semi - i + 1);
      if (ent != "&amp;" && ent != "&lt;" && ent != "&gt;" && ent != "&quot;" && ent != "&apos;")
        return "bad entity " + ent;
      i = semi + 1;
      continue;
    }
    if (s[i] != '<') {
      if (open.empty() && !std::isspace(static_cast<unsigned char>(s[i]))) return "text outside the root";
      ++i;
      continue;
    }
    const size_t end = s.find('>', i);
    if (end == std::string::npos) return "unclosed tag";
    std::string tag = s.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.find('<') != std::string::npos) return "'<' inside a tag";
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return "mismatched </" + tag.substr(1) + ">";
      open.pop_back();
      if (open.empty() && s.find('<', i) != std::string::npos) return "a second root";
      continue;
    }
    const bool self_closing = tag.back() == '/';
    if (self_closing) tag.pop_back();
    const std::string name = tag.substr(0, tag.find_first_of(" \n\t"));
    // Attributes: name="value", values without '<' or a bare '&' (checked by the regex).
    const std::string attrs = tag.substr(name.size());
    static const std::regex attr(
        R"re(^(\s+[A-Za-z_:][-A-Za-z0-9_:.]*="([^"<&]|&(amp|lt|gt|quot|apos);)*")*\s*$)re");
    if (!std::regex_match(attrs, attr)) return "bad attributes in <" + name + ">";
    if (!self_closing) open.push_back(name);
  }
  return open.empty() ? "" : "unclosed <" + open.back() + ">";
}

TEST(XmlCheck, CatchesWhatItShould) {
  EXPECT_EQ(xml_problem("<a x=\"1\"><b/>t &amp; u</a>"), "");
  EXPECT_NE(xml_problem("<a><b></a></b>"), "");
  EXPECT_NE(xml_problem("<a x=1></a>"), "");
  EXPECT_NE(xml_problem("<a>&</a>"), "");
  EXPECT_NE(xml_problem("<a>"), "");
  EXPECT_NE(xml_problem("<a></a><b></b>"), "");
}

// A step with a named big block: the SVG is well-formed, names the peak and lists that block with its tag
// and op.
TEST_F(MemoryHistory, SvgIsWellFormedAndNamesThePeakAndTheLargestBlocks) {
  {
    memory::History h(kCPU);
    Tensor small = empty({100});
    {
      memory::Tag tag("odd <tag> & \"quotes\"");  // escaped in the picture
      Tensor big = randn({512, 512});
      Tensor bigger = exp(big);
    }
    Tensor after = empty({10});
  }
  const std::string path = this->path("step.svg");
  memory::dump_svg(path);
  const std::string svg = read_file(path);
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_NE(svg.find("peak "), std::string::npos);
  EXPECT_NE(svg.find("odd &lt;tag&gt; &amp; &quot;quotes&quot;"), std::string::npos);
  EXPECT_NE(svg.find(">randn<"), std::string::npos);
  EXPECT_NE(svg.find(">exp<"), std::string::npos);
  // The peak's value is the largest allocated statistic of the record.
  int64_t peak = 0;
  for (const HistoryEvent& e : memory::history(kCPU).events) peak = std::max(peak, e.allocated);
  EXPECT_NE(svg.find("(" + std::to_string(peak) + " bytes)"), std::string::npos);
  for (int c = 0; c < memory::kNumCategories; ++c)
    EXPECT_NE(svg.find(memory::category_name(Category(c))), std::string::npos);
}

// The picture renders (rsvg-convert, Debian's librsvg2-bin) to something other than its background: the PNG
// differs from that of an SVG of the same size holding the background alone, and from that of the same SVG
// without its stacked area (PNG is lossless and rsvg-convert deterministic, so equal files would mean equal
// pixels).
TEST_F(MemoryHistory, SvgRendersToANonBlankPicture) {
  if (std::system("command -v rsvg-convert > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "rsvg-convert is not installed (Debian package librsvg2-bin)";
  {
    memory::History h(kCPU);
    Tensor a = randn({256, 256});
    Tensor b = relu(a);
  }
  memory::dump_svg(path("step.svg"));
  const std::string svg = read_file(path("step.svg"));
  std::smatch size;
  ASSERT_TRUE(std::regex_search(svg, size, std::regex(R"re(width="(\d+)" height="(\d+)")re")));
  std::ofstream(path("blank.svg")) << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << size[1]
                                   << "\" height=\"" << size[2]
                                   << "\"><rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/></svg>\n";
  // And the stacked area itself draws: without its polygons the picture renders differently.
  std::ofstream(path("no_area.svg")) << std::regex_replace(svg, std::regex("<polygon[^>]*>.*?</polygon>"),
                                                           "");
  for (const char* name : {"step", "blank", "no_area"}) {
    const std::string cmd = "rsvg-convert -o '" + path(std::string(name) + ".png") + "' '" +
                            path(std::string(name) + ".svg") + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  const std::string png = read_file(path("step.png")), blank = read_file(path("blank.png"));
  ASSERT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  ASSERT_EQ(blank.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_NE(png, blank) << "the picture renders as its background alone";
  EXPECT_NE(read_file(path("no_area.svg")), svg) << "the SVG has no polygons to remove";
  EXPECT_NE(png, read_file(path("no_area.png"))) << "the stacked area draws nothing";
}

// Note [out-of-memory dump]: with history on, the error names the trace and the snapshot written at the
// failure; without, it names none.
TEST_F(MemoryHistory, OutOfMemoryWritesTheTraceAndASnapshot) {
  memory::empty_cache(kCPU);  // what earlier tests left cached would count against the limit
  memory::set_oom_dump_prefix(path("oom"));
  memory::set_memory_limit(kCPU, 8 << 20);
  try {
    Tensor t = empty({64 << 20});
    FAIL() << "no OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(std::string(e.what()).find(".trace.json"), std::string::npos) << "history is off: no dump";
  }
  memory::History h(kCPU);
  Tensor small = empty({1000});
  std::string message;
  try {
    memory::Tag tag("too big");
    Tensor t = empty({64 << 20});
    FAIL() << "no OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    message = e.what();
  }
  std::smatch m;
  ASSERT_TRUE(std::regex_search(message, m, std::regex(R"((\S+\.trace\.json) .* (\S+\.snapshot\.json))")))
      << message;
  EXPECT_EQ(m[1].str().rfind(path("oom"), 0), 0u) << message;
  const nlohmann::json trace = read_json(m[1].str());
  bool oom = false;
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "i" && e.at("name") == "out of memory") {
      oom = true;
      EXPECT_EQ(e.at("args").at("requested"), int64_t(64 << 20) * 4);
    }
  EXPECT_TRUE(oom);
  EXPECT_EQ(counter_values(trace, "allocated").back(), memory::stats().allocated.current);
  const nlohmann::json snapshot = read_json(m[2].str());
  EXPECT_EQ(snapshot.at("stats").at("allocated"), memory::stats().allocated.current);
  bool small_listed = false;
  for (const auto& b : snapshot.at("blocks")) small_listed |= b.at("address") == address_of(small);
  EXPECT_TRUE(small_listed);
  // The injected failure of Note [failing an allocation] dumps too.
  memory::detail::fail_allocation_at(1);
  try {
    Tensor t = empty({10});
    FAIL() << "no OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find(".snapshot.json"), std::string::npos) << e.what();
  }
}

// A dump that cannot be written does not replace the OutOfMemoryError; the message says why.
TEST_F(MemoryHistory, AnOomDumpThatFailsIsReportedInTheMessage) {
  memory::set_oom_dump_prefix("/nonexistent-folder/oom");
  memory::set_memory_limit(kCPU, 8 << 20);
  memory::History h(kCPU);
  testing::expect_exact_error<OutOfMemoryError>([] { Tensor t = empty({64 << 20}); },
                                                {"out of memory", "dump failed", "/nonexistent-folder/oom"});
}

// Both allocators record through the same base: a fresh arena and a fresh system allocator, driven directly.
TEST(MemoryHistoryAllocators, BothKindsRecordExactStatistics) {
  for (bool system : {false, true}) {
    SCOPED_TRACE(system ? "system" : "arena");
    auto owned = system ? memory::make_system_allocator(kCPU, memory::make_host_backing())
                        : memory::make_arena(kCPU, memory::make_host_backing());
    auto* a = dynamic_cast<memory::detail::AllocatorBase*>(owned.get());
    ASSERT_NE(a, nullptr);
    const memory::Allocation kept = a->allocate(777);
    const uint64_t generation = a->start_history(1000);
    ASSERT_NE(generation, 0u);
    EXPECT_EQ(a->start_history(1000), 0u) << "one records already";
    a->stop_history(generation + 1);  // not the one recording: nothing changes
    EXPECT_TRUE(a->history_on());
    std::vector<int64_t> expected;
    std::vector<memory::Allocation> blocks;
    for (int64_t n : {1, 513, 5000, 2 << 20}) {
      blocks.push_back(a->allocate(n));
      expected.push_back(a->stats().allocated.current);
    }
    for (const memory::Allocation& b : blocks) {
      a->deallocate(b.block);
      expected.push_back(a->stats().allocated.current);
    }
    a->stop_history(generation);
    EXPECT_FALSE(a->history_on());
    std::vector<int64_t> got;
    int segment_events = 0;
    for (const HistoryEvent& e : a->history().events) {
      if (e.kind == EventKind::Alloc || e.kind == EventKind::Free) got.push_back(e.allocated);
      segment_events += e.kind == EventKind::SegmentAlloc || e.kind == EventKind::SegmentFree;
    }
    EXPECT_EQ(got, expected);
    EXPECT_GT(segment_events, 0);
    EXPECT_EQ(a->history().events.front().kind, EventKind::Live);
    a->deallocate(kept.block);
    a->check_invariants();
  }
}

// Note [category statistics]: a category's peak is the most it held at one moment. Two tags of the
// gradients category that peak one after the other add up to twice the bytes; the category held them once.
// A retag moves the bytes between categories, and the invariant checker recounts them.
TEST(CategoryStats, APeakIsOneMomentsBytesNotTheSumOfTheTagsPeaks) {
  memory::Allocator& a = memory::allocator(kCPU);
  a.reset_tag_peaks();
  const auto before = memory::category_stats();
  const auto grads = size_t(Category::Gradients), params = size_t(Category::Parameters);
  constexpr int64_t kBytes = 1 << 20;
  {
    memory::Tag t("gradients");
    a.deallocate(a.allocate(kBytes).block);
  }
  memory::Allocation b;
  {
    memory::Tag t("backward/category-stats-test");
    b = a.allocate(kBytes);
  }
  auto now = memory::category_stats();
  EXPECT_EQ(now[grads].current, before[grads].current + kBytes);
  EXPECT_EQ(now[grads].peak, std::max(before[grads].peak, before[grads].current + kBytes));
  int64_t tag_peaks = 0;
  for (const memory::TagStats& t : memory::tag_stats())
    if (t.tag == "gradients" || t.tag == "backward/category-stats-test") tag_peaks += t.allocated.peak;
  EXPECT_GE(tag_peaks, 2 * kBytes) << "the tags' peaks add up to both blocks";
  a.retag(b.block, memory::intern_tag("parameters"));
  now = memory::category_stats();
  EXPECT_EQ(now[grads].current, before[grads].current);
  EXPECT_EQ(now[params].current, before[params].current + kBytes);
  a.check_invariants();
  a.deallocate(b.block);
  now = memory::category_stats();
  EXPECT_EQ(now[params].current, before[params].current);
  a.reset_tag_peaks();
  now = memory::category_stats();
  for (const memory::Stat& c : now) EXPECT_EQ(c.peak, c.current);
}

}  // namespace
}  // namespace frugal
