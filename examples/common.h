// What the example trainers share: checks of their command-line values, their out-of-memory report and the
// memory report by category from the arena's tags. Uses the public header only.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <frugal/frugal.h>

namespace examples {

using namespace frugal;

// --ddp: joins the run's processes (a dist::Guard in `guard`) and, on the ranks other than 0, silences
// stdout (their errors still go to stderr). False, having said why, when that fails.
inline bool start_ddp(std::optional<dist::Guard>& guard) {
  try {
    guard.emplace();
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return false;
  }
  if (dist::rank() != 0 && !std::freopen("/dev/null", "w", stdout))
    std::fprintf(stderr, "rank %d: cannot silence stdout\n", dist::rank());
  return true;
}

// Checks of command-line values, in the form CLI11's validators take (CLI::Validator(fn, "NAME")): "" when
// the value is good, otherwise why not. Every size flag goes through the library's one parser.
inline std::string check_byte_count(const std::string& s) {
  try {
    memory::parse_bytes(s);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}
// A decimal integer in [lo, hi]. CLI11 (2.1) would read a number beyond its type's range as the type's
// limit ("99999999999999999999" steps as 2^63 - 1 of them), and CLI::Range checks after that.
inline std::function<std::string(const std::string&)> integer_in(int64_t lo, int64_t hi) {
  return [lo, hi](const std::string& s) -> std::string {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && end == s.data() + s.size() && v >= lo && v <= hi) return "";
    return "'" + s + "' is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  };
}
// A seed: any decimal integer in [0, 2^64 - 1].
inline std::string check_seed(const std::string& s) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc() && end == s.data() + s.size()) return "";
  return "'" + s + "' is not an integer in [0, 2^64 - 1]";
}
// A finite number > 0 (a learning rate, a temperature): CLI::PositiveNumber lets "inf" through.
inline std::string check_finite_positive(const std::string& s) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size()) return "'" + s + "' is not a number";
  if (!std::isfinite(v) || v <= 0) return "'" + s + "' must be a finite number > 0";
  return "";
}

// Fails before any training when `path` cannot be written: its folder must exist and be writable, and the
// path must not be a folder itself. The save can still fail later (a full disk); then it says so.
inline void check_can_write(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path folder = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  FRUGAL_CHECK(!fs::is_directory(p, ec), flag, " ", path, ": is a folder; give a file name in it");
  FRUGAL_CHECK(fs::is_directory(folder, ec), flag, " ", path, ": the folder ", folder.string(),
               " does not exist");
  FRUGAL_CHECK(::access(folder.c_str(), W_OK) == 0, flag, " ", path, ": the folder ", folder.string(),
               " is not writable (", std::strerror(errno), ")");
}

// A loss that is not finite means the run diverged (or its input is broken): stop and say so rather than
// train on NaN. An f16 loss scaler's overflow is not this: it skips the step, and the loss stays finite.
inline void check_finite_loss(double loss, int64_t step, const char* hint) {
  FRUGAL_CHECK(std::isfinite(loss), "the loss is ", loss, " at step ", step, ": the run diverged; ", hint);
}

// Standard output goes a line at a time even into a pipe or a file, so that what a run printed before an
// error (the banner, the epochs) comes before the error on stderr, as it happened.
inline void line_buffered_stdout() { std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ); }

// A run that ran out of memory ends here: the library's error, whose advice names library calls, then the
// flags of this program that do the same (`flags`), then the arena's summary. Returns the exit status, 2.
inline int report_out_of_memory(const OutOfMemoryError& e, const char* program, const char* flags) {
  std::fflush(stdout);
  std::fprintf(stderr, "\n%s\n\n%s: to fit, try %s\n\n%s", e.what(), program, flags,
               memory::memory_summary(kCPU).c_str());
  return 2;
}

// --memory-budget: the micro-batch counts a batch of `batch` can be split into, for memory::plan.
inline std::vector<int> micro_batch_counts(int64_t batch) {
  std::vector<int> out;
  for (int k : {1, 2, 4, 8, 16, 32})
    if (batch % k == 0) out.push_back(k);
  return out;
}

// --memory-budget: prints the plan and planned_peak_bytes=N and sets the arena's limit to the budget; when
// nothing fits, says so (with what else to try) and returns false.
inline bool report_plan(const memory::Plan& plan, const char* other_options) {
  std::printf("plan: %s (%d dry runs)\n", plan.str().c_str(), plan.dry_runs);
  std::printf(
      "plan costs, from the dry runs' counted work (of the plain step's time): recomputing every block "
      "+%.2f, every block selectively +%.2f, each micro-batch past the first +%.2f\n",
      plan.costs.recompute, plan.costs.selective, plan.costs.micro_batch);
  if (!plan.fits) {
    std::fprintf(stderr,
                 "error: no plan fits in %s: the one with the lowest peak needs %s; try %s, "
                 "--allow-low-precision, or a larger budget\n",
                 memory::format_bytes(plan.budget).c_str(), memory::format_bytes(plan.peak_allocated).c_str(),
                 other_options);
    return false;
  }
  std::printf("planned_peak_bytes=%lld\n", static_cast<long long>(plan.peak_allocated));
  memory::set_memory_limit(kCPU, plan.budget);
  return true;
}

// For an OutOfMemoryError under --memory-limit: "--memory-budget N (plans ...), or " when a plan fits
// under the same limit, else "". Called once the model and its state are gone (the data still loaded); an
// error while planning only leaves the hint out.
inline std::string fitting_plan_hint(const std::function<memory::Plan(int64_t)>& plan_for) {
  try {
    const int64_t limit = memory::memory_limit(kCPU);
    if (!plan_for || limit <= 0) return "";
    // The plan must hold for a fresh run, which starts without the failed run's cached segments.
    memory::empty_cache(kCPU);
    const memory::Plan p = plan_for(limit);
    return p.fits ? "--memory-budget " + std::to_string(limit) + " (plans " + p.str() + "), or " : "";
  } catch (const Error&) {
    return "";
  }
}

// --memory-trace PATH: the memory history (core/memory_history.h) of steps kFirstStep to kLastStep of this
// run, written after step kLastStep as a Chrome trace at PATH and an SVG picture beside it (svg_path: PATH
// with its extension replaced by .svg). after_step(n) is called once each step's work is done (n counts from
// 1); finish() writes what was recorded when the run ended before step kLastStep (nothing, and no files,
// if it ended before recording began). Both files are checked for writability before any training.
class MemoryTrace {
 public:
  static constexpr int64_t kFirstStep = 3, kLastStep = 5;

  explicit MemoryTrace(std::string path) : path_(std::move(path)) {
    if (path_.empty()) return;
    FRUGAL_CHECK(std::filesystem::path(path_).extension() != ".svg", "--memory-trace ", path_,
                 ": this is the path of the Chrome trace (JSON); the SVG is written beside it with the "
                 "extension .svg. Give e.g. memory.json");
    check_can_write("--memory-trace", path_);
    check_can_write("--memory-trace", svg_path(path_));
  }
  static std::string svg_path(const std::string& path) {
    return std::filesystem::path(path).replace_extension(".svg").string();
  }
  void after_step(int64_t step) {
    if (path_.empty() || written_) return;
    if (step == kFirstStep - 1) history_ = std::make_unique<memory::History>(kCPU);
    if (step >= kLastStep) write(step);
  }
  void finish(int64_t steps) {
    if (path_.empty() || written_) return;
    if (history_)
      write(steps);
    else
      std::printf("memory trace: the run ended after %lld steps, before step %lld; nothing written to %s\n",
                  static_cast<long long>(steps), static_cast<long long>(kFirstStep), path_.c_str());
  }

 private:
  void write(int64_t last) {
    history_.reset();  // stops the recording
    written_ = true;
    const memory::HistoryRecord record = memory::history(kCPU);
    memory::write_trace(path_, record);
    memory::write_svg(svg_path(path_), record);
    std::printf("memory trace of steps %lld-%lld (%zu events): %s and %s\n",
                static_cast<long long>(kFirstStep), static_cast<long long>(std::max(last, kFirstStep - 1)),
                record.events.size(), path_.c_str(), svg_path(path_).c_str());
  }

  std::string path_;
  std::unique_ptr<memory::History> history_;
  bool written_ = false;
};

// --profile: the profiler (core/profiler.h) times every op of the run; finish() prints its table (ops by
// total time, forward and backward apart). With --memory-trace as well, the trace shows the ops of its
// steps above the memory counters.
class RunProfile {
 public:
  explicit RunProfile(bool on) {
    if (on) profile_ = std::make_unique<profiler::Profile>();
  }
  void finish() {
    if (!profile_) return;
    profile_.reset();
    std::printf("\nprofile of the run (ops by total time; --profile):\n%s", profiler::summary(25).c_str());
    if (profiler::dropped_records() > 0)
      std::printf("(the trace kept the first %zu op records; the table counts them all)\n",
                  profiler::records().size());
  }

 private:
  std::unique_ptr<profiler::Profile> profile_;
};

// Peak and current bytes per category, from the arena's statistics by category (memory::category_stats),
// each tag's category as the memory history decides it from the tag alone (Note [memory categories] in
// core/memory_history.h): parameters, gradients (the leaves' .grad and what backward allocates), optimizer
// state (and the step's temporaries), activations (what the forward keeps for backward, its recomputation,
// and evaluation), data (the dataset held in memory and the batches made from it), and other (untagged).
// Each peak is the most the category held at one moment; the peaks fall at different moments, so they add
// up to more than the total's.
inline std::string memory_report() {
  const char* order[] = {"parameters", "gradients", "optimizer state", "activations", "data", "other"};
  const std::array<memory::Stat, memory::kNumCategories> by = memory::category_stats();
  struct Row {
    int64_t current = 0, peak = 0;
  };
  std::map<std::string, Row> rows;
  for (int c = 0; c < memory::kNumCategories; ++c)
    rows[memory::category_name(memory::Category(c))] = {by[size_t(c)].current, by[size_t(c)].peak};
  std::string out = "memory by category (arena, exact)        current            peak\n";
  char line[160];
  for (const char* c : order) {
    std::snprintf(line, sizeof line, "  %-34s %12s %15s\n", c, memory::format_bytes(rows[c].current).c_str(),
                  memory::format_bytes(rows[c].peak).c_str());
    out += line;
  }
  const memory::Stats s = memory::stats();
  std::snprintf(line, sizeof line, "  %-34s %12s %15s\n  %-34s %12s %15s\n", "all allocated (exact)",
                memory::format_bytes(s.allocated.current).c_str(),
                memory::format_bytes(s.allocated.peak).c_str(), "reserved from the system",
                memory::format_bytes(s.reserved.current).c_str(),
                memory::format_bytes(s.reserved.peak).c_str());
  out += line;
  return out;
}

}  // namespace examples
