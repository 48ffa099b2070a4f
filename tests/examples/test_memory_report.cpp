// The memory report (examples/techniques.h, examples/memory_report.cpp): a row's peak is the allocator's and
// its categories add up to it, the Markdown table and the JSON carry the rows' numbers, the techniques that
// must save memory do, and bad flags end with clear errors. Small sizes, a few steps each.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "examples/techniques.h"

namespace {

using namespace frugal;

bool have_text() { return std::filesystem::is_directory(data::kFortunesRoot); }
bool have_images() {
  return std::filesystem::exists(std::string(data::kFashionMNISTRoot) + "/train-images-idx3-ubyte.gz");
}

// A GPT small enough for a few steps per technique in well under a second each, where activations still
// outweigh the weights (as in W3).
techniques::Config tiny_gpt(int64_t steps = 2) {
  techniques::Config c;
  c.model = "gpt";
  c.steps = steps;
  c.batch = 16;
  c.layers = 2;
  c.width = 32;
  c.heads = 2;
  c.context = 32;
  return c;
}

techniques::Technique by_key(const std::string& model, const std::string& key) {
  for (const techniques::Technique& t : techniques::techniques_for(model))
    if (t.key == key) return t;
  ADD_FAILURE() << "no technique " << key << " for " << model;
  return {};
}

int64_t sum(const std::array<int64_t, memory::kNumCategories>& a) {
  return std::accumulate(a.begin(), a.end(), int64_t(0));
}
int64_t category(const std::array<int64_t, memory::kNumCategories>& a, memory::Category c) {
  return a[size_t(c)];
}

TEST(MemoryReport, RowPeakIsTheAllocatorsAndItsCategoriesAddUpToIt) {
  if (!have_text()) GTEST_SKIP() << "the fortunes corpus is not installed (apt-get install fortunes)";
  const techniques::Workload w(tiny_gpt());
  for (const char* key : {"baseline", "recompute", "grad_accumulation", "inference"}) {
    memory::HistoryRecord record;
    const techniques::Row row = w.run(by_key("gpt", key), &record);
    EXPECT_EQ(row.peak, memory::stats().allocated.peak) << key;
    EXPECT_EQ(sum(row.at_peak), row.peak) << key;
    EXPECT_EQ(row.steps, 2) << key;
    // The categories are those of the record handed out, at its highest allocated bytes.
    const memory::PeakBreakdown p = memory::peak_by_category(record);
    EXPECT_EQ(p.total, row.peak) << key;
    EXPECT_EQ(p.by_category, row.at_peak) << key;
    int64_t highest = record.start_allocated;
    for (const memory::HistoryEvent& e : record.events) highest = std::max(highest, e.allocated);
    EXPECT_EQ(highest, row.peak) << key;
    for (size_t c = 0; c < row.at_peak.size(); ++c) EXPECT_LE(row.at_peak[c], row.category_peaks[c]) << key;
    // The dataset stays live through every run; parameters exist in every run.
    EXPECT_GT(category(row.at_peak, memory::Category::Data), 0) << key;
    EXPECT_GT(category(row.at_peak, memory::Category::Parameters), 0) << key;
  }
}

// Every technique's dry run (Workload::estimate) predicts its measured peak byte for byte: W3's at small
// sizes, and W1's and W2's at small batches.
TEST(MemoryReport, EveryTechniquesDryRunEqualsItsPeak) {
  std::vector<techniques::Config> configs;
  if (have_text()) configs.push_back(tiny_gpt());
  if (have_images())
    for (const char* model : {"mlp", "cnn"}) {
      techniques::Config c;
      c.model = model;
      c.steps = 2;
      c.batch = 16;
      configs.push_back(c);
    }
  if (configs.empty()) GTEST_SKIP() << "neither the fortunes corpus nor Fashion-MNIST is installed";
  for (const techniques::Config& c : configs) {
    const techniques::Workload w(c);
    std::vector<techniques::Row> rows;
    for (const techniques::Technique& t : techniques::techniques_for(c.model)) {
      rows.push_back(w.run(t));
      rows.back().estimated_peak = w.estimate(t);
      EXPECT_EQ(rows.back().estimated_peak, rows.back().peak) << c.model << " " << t.key;
    }
    EXPECT_EQ(techniques::estimate_line(rows),
              "dry run: the estimated peak equals the measured one for all " + std::to_string(rows.size()) +
                  " techniques");
  }
}

TEST(MemoryReport, EachRunStartsFresh) {
  if (!have_text()) GTEST_SKIP() << "the fortunes corpus is not installed";
  const techniques::Workload w(tiny_gpt());
  const techniques::Row a = w.run(by_key("gpt", "baseline"));
  w.run(by_key("gpt", "bf16_autocast"));
  const techniques::Row b = w.run(by_key("gpt", "baseline"));
  EXPECT_EQ(a.peak, b.peak);
  EXPECT_EQ(a.at_peak, b.at_peak);
  EXPECT_EQ(a.losses, b.losses);  // same seed, same windows
}

// Splits a Markdown table line "| a | b |" into its cells, trimmed.
std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream in(line);
  std::string cell;
  std::getline(in, cell, '|');  // before the first bar
  while (std::getline(in, cell, '|')) {
    const size_t b = cell.find_first_not_of(' '), e = cell.find_last_not_of(' ');
    out.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
  }
  return out;
}

TEST(MemoryReport, TableAndJsonCarryTheRowsNumbers) {
  if (!have_text()) GTEST_SKIP() << "the fortunes corpus is not installed";
  const techniques::Workload w(tiny_gpt());
  std::vector<techniques::Row> rows;
  for (const char* key : {"baseline", "sgd_momentum", "bf16_parameters_master_weights", "inference"})
    rows.push_back(w.run(by_key("gpt", key)));
  const techniques::Row& base = rows[0];

  std::vector<std::vector<std::string>> table;
  std::stringstream md(techniques::markdown_table(rows));
  for (std::string line; std::getline(md, line);) table.push_back(cells(line));
  ASSERT_EQ(table.size(), rows.size() + 2);  // the header and the alignment line
  const std::vector<std::string>& header = table[0];
  ASSERT_EQ(header.size(), size_t(memory::kNumCategories) + 8);
  EXPECT_EQ(header[1], "peak");
  for (int c = 0; c < memory::kNumCategories; ++c)
    EXPECT_EQ(header[size_t(3 + c)], memory::category_name(memory::Category(c)));
  for (size_t i = 0; i < rows.size(); ++i) {
    const techniques::Row& r = rows[i];
    const std::vector<std::string>& t = table[i + 2];
    ASSERT_EQ(t.size(), header.size());
    EXPECT_EQ(t[0], r.technique.name);
    EXPECT_EQ(t[1], memory::format_bytes(r.peak));
    EXPECT_EQ(t[2], techniques::fixed(double(r.peak) / double(base.peak), 2));
    for (int c = 0; c < memory::kNumCategories; ++c)
      EXPECT_EQ(t[size_t(3 + c)], memory::format_bytes(r.at_peak[size_t(c)])) << header[size_t(3 + c)];
    const size_t k = 3 + memory::kNumCategories;
    EXPECT_EQ(t[k], techniques::fixed(r.median_step_ms, 1));
    EXPECT_EQ(t[k + 1], techniques::fixed(r.median_step_ms / base.median_step_ms, 2));
    EXPECT_EQ(t[k + 2], techniques::fixed(r.loss, 4));
    EXPECT_EQ(t[k + 3], techniques::fixed(base.loss, 4));
    EXPECT_EQ(t[k + 4], r.technique.when);
  }

  const nlohmann::json j = nlohmann::json::parse(techniques::to_json(rows, w.config()).dump());
  EXPECT_EQ(j["model"], "gpt");
  EXPECT_EQ(j["steps"], 2);
  ASSERT_EQ(j["techniques"].size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const techniques::Row& r = rows[i];
    const nlohmann::json& t = j["techniques"][i];
    EXPECT_EQ(t["key"], r.technique.key);
    EXPECT_EQ(t["peak_bytes"].get<int64_t>(), r.peak);
    int64_t cats = 0;
    for (int c = 0; c < memory::kNumCategories; ++c) {
      const char* name = memory::category_name(memory::Category(c));
      EXPECT_EQ(t["peak_by_category"][name].get<int64_t>(), r.at_peak[size_t(c)]) << name;
      EXPECT_EQ(t["category_peaks"][name].get<int64_t>(), r.category_peaks[size_t(c)]) << name;
      cats += t["peak_by_category"][name].get<int64_t>();
    }
    EXPECT_EQ(cats, t["peak_bytes"].get<int64_t>());
    EXPECT_EQ(t["peak_ratio"].get<double>(), double(r.peak) / double(base.peak));
    EXPECT_EQ(t["median_step_ms"].get<double>(), r.median_step_ms);
    EXPECT_EQ(t["step_time_ratio"].get<double>(), r.median_step_ms / base.median_step_ms);
    EXPECT_EQ(t["loss"].get<double>(), r.loss);
    EXPECT_EQ(t["baseline_loss"].get<double>(), base.loss);
    EXPECT_EQ(t["losses"].get<std::vector<double>>(), r.losses);
  }
}

TEST(MemoryReport, TechniquesThatMustSaveMemoryDo) {
  if (!have_text()) GTEST_SKIP() << "the fortunes corpus is not installed";
  const techniques::Workload w(tiny_gpt());
  const techniques::Row base = w.run(by_key("gpt", "baseline"));
  const techniques::Row recompute = w.run(by_key("gpt", "recompute"));
  const techniques::Row accum = w.run(by_key("gpt", "grad_accumulation"));
  const techniques::Row sgd = w.run(by_key("gpt", "sgd_momentum"));
  const techniques::Row inference = w.run(by_key("gpt", "inference"));
  const techniques::Row adafactor = w.run(by_key("gpt", "adafactor"));
  const techniques::Row adam8bit = w.run(by_key("gpt", "adam8bit"));
  const techniques::Row selective = w.run(by_key("gpt", "selective_recompute"));
  const techniques::Row in_backward = w.run(by_key("gpt", "step_in_backward"));
  const techniques::Row both = w.run(by_key("gpt", "recompute_step_in_backward"));
  using C = memory::Category;
  EXPECT_LT(category(recompute.category_peaks, C::Activations),
            category(base.category_peaks, C::Activations));
  EXPECT_LT(recompute.peak, base.peak);
  EXPECT_LT(accum.peak, base.peak);
  // SGD keeps one tensor per parameter, Adam two: exactly half.
  EXPECT_EQ(2 * category(sgd.category_peaks, C::OptimizerState),
            category(base.category_peaks, C::OptimizerState));
  // Adafactor keeps one factored moment: less than SGD's one full buffer a parameter.
  EXPECT_LT(category(adafactor.category_peaks, C::OptimizerState),
            category(sgd.category_peaks, C::OptimizerState));
  // AdamW 8-bit keeps about 2 bytes a parameter of AdamW's 8 (the tiny GPT's small tensors stay f32).
  EXPECT_LT(category(adam8bit.category_peaks, C::OptimizerState),
            category(base.category_peaks, C::OptimizerState));
  EXPECT_LT(inference.peak, base.peak);
  EXPECT_EQ(category(inference.category_peaks, C::Gradients), 0);
  EXPECT_EQ(category(inference.category_peaks, C::OptimizerState), 0);
  // Selective recompute keeps more than recompute (and, as the GPT's blocks keep only their GEMMs' inputs,
  // about what no recompute keeps).
  EXPECT_GT(category(selective.category_peaks, C::Activations),
            category(recompute.category_peaks, C::Activations));
  // Stepping in backward never holds every gradient at once.
  EXPECT_LT(category(in_backward.category_peaks, C::Gradients), category(base.category_peaks, C::Gradients));
  // With recompute, the gradients that stepping in backward frees are part of the peak: it falls below
  // recompute's by most of their bytes.
  EXPECT_LT(category(both.category_peaks, C::Gradients), category(recompute.category_peaks, C::Gradients));
  EXPECT_LE(both.peak, recompute.peak);
  // Recompute, selective or not, and stepping in backward change no number: the same losses bit for bit.
  EXPECT_EQ(recompute.losses, base.losses);
  EXPECT_EQ(selective.losses, base.losses);
  EXPECT_EQ(in_backward.losses, base.losses);
  EXPECT_EQ(both.losses, base.losses);
}

TEST(MemoryReport, TimingNoteSaysWhenTheBaselineDrifted) {
  techniques::Row first, again;
  first.peak = again.peak = 1000;
  first.median_step_ms = 10;
  again.median_step_ms = 11.5;  // within kTimingDrift
  EXPECT_EQ(techniques::timing_note(first, again), "");
  again.median_step_ms = 13;
  EXPECT_NE(techniques::timing_note(first, again).find("10.0 ms first and 13.0 ms again"), std::string::npos);
  EXPECT_NE(techniques::timing_note(first, again).find("the time ratios are unreliable"), std::string::npos);
  again.median_step_ms = 10;
  again.peak = 1001;
  EXPECT_NE(techniques::timing_note(first, again).find("did not start fresh"), std::string::npos);
}

TEST(MemoryReport, SparseAdamIsForTheGptOnly) {
  const auto has = [](const std::string& model, const std::string& key) {
    for (const techniques::Technique& t : techniques::techniques_for(model))
      if (t.key == key) return true;
    return false;
  };
  EXPECT_TRUE(has("gpt", "sparse_adam"));
  EXPECT_FALSE(has("mlp", "sparse_adam"));
  EXPECT_FALSE(has("cnn", "sparse_adam"));
  EXPECT_TRUE(has("mlp", "bf16_data"));
  EXPECT_FALSE(has("gpt", "bf16_data"));  // token ids are integers
  EXPECT_EQ(techniques::techniques_for("gpt").front().key, "baseline");
}

TEST(MemoryReport, TheMlpRunsEveryTechnique) {
  if (!have_images())
    GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  techniques::Config c;
  c.model = "mlp";
  c.steps = 2;
  const techniques::Workload w(c);
  for (const techniques::Technique& t : techniques::techniques_for("mlp")) {
    const techniques::Row row = w.run(t);
    EXPECT_EQ(row.steps, 2) << t.key;
    EXPECT_EQ(sum(row.at_peak), row.peak) << t.key;
    EXPECT_TRUE(std::isfinite(row.loss)) << t.key;
  }
}

// Runs the program with `args`, its stdout (and stderr, unless `stderr_to` says where else) in `output`;
// returns its exit status.
// The program, "" when the examples are not built (the sanitizer build has none).
std::string program() {
#ifdef FRUGAL_MEMORY_REPORT
  return FRUGAL_MEMORY_REPORT;
#else
  return "";
#endif
}

int run_program(const std::string& args, std::string& output, const char* stderr_to = "&1") {
  FILE* p = popen((program() + " " + args + " 2>" + stderr_to).c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  output.clear();
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) output.append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(MemoryReport, BadFlagsAreClearErrors) {
  if (!program().empty()) {
    std::string out;
    EXPECT_NE(run_program("--model xyz", out), 0);
    EXPECT_NE(out.find("--model"), std::string::npos) << out;
    EXPECT_NE(out.find("xyz"), std::string::npos) << out;
    EXPECT_NE(run_program("--steps 0", out), 0);
    EXPECT_NE(out.find("--steps"), std::string::npos) << out;
    EXPECT_NE(out.find("'0' is not an integer in [1, 1000000]"), std::string::npos) << out;
    EXPECT_NE(run_program("--svg-dir /no/such/folder", out), 0);
    EXPECT_NE(out.find("the folder '/no/such/folder' does not exist"), std::string::npos) << out;
  }
  // In-process, the same checks throw frugal::Error.
  techniques::Config c;
  c.model = "xyz";
  EXPECT_THROW(
      {
        try {
          techniques::Workload w(c);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("valid: mlp (W1), cnn (W2), gpt (W3)"), std::string::npos);
          throw;
        }
      },
      Error);
  c.model = "gpt";
  c.steps = 0;
  EXPECT_THROW(techniques::Workload{c}, Error);
}

TEST(MemoryReport, SvgDirGetsOneTimelinePerTechnique) {
  if (!have_images()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  if (program().empty()) GTEST_SKIP() << "the examples are not built";
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "frugal-memory-report-svg";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string out;
  ASSERT_EQ(run_program("--model mlp --steps 1 --json --svg-dir " + dir.string(), out, "/dev/null"), 0)
      << out;
  const nlohmann::json j = nlohmann::json::parse(out);  // stdout is the JSON alone
  ASSERT_EQ(j["techniques"].size(), techniques::techniques_for("mlp").size());
  EXPECT_EQ(j["baseline_again"]["peak_bytes"], j["techniques"][0]["peak_bytes"]);  // a fresh state each run
  for (const auto& t : j["techniques"]) {
    const std::filesystem::path svg = dir / ("mlp-" + t["key"].get<std::string>() + ".svg");
    EXPECT_TRUE(std::filesystem::exists(svg)) << svg;
    EXPECT_GT(std::filesystem::file_size(svg), 1000u) << svg;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
