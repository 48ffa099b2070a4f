// The profiler (core/profiler.h): the op scopes' timing, the records and statistics of the latest profile,
// its table and its trace.
#include "core/profiler.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "core/history_log.h"
#include "core/tensor.h"

namespace frugal::profiler {

namespace detail {
std::atomic<bool> g_recording{false};
}  // namespace detail

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The op this thread is timing (only the outermost scope times: one at a time per thread), and the bytes
// this thread has allocated while a profile records.
struct Pending {
  bool open = false;
  int64_t bytes_before = 0;
  OpRecord record;
};
thread_local Pending t_pending;
thread_local int64_t t_bytes = 0;

struct Totals {
  int64_t calls = 0, total_ns = 0, min_ns = 0, max_ns = 0, bytes = 0;
};
struct Key {
  const char* name;
  memory::Phase phase;
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    return std::hash<const void*>()(k.name) ^ (size_t(k.phase) * 0x9e3779b97f4a7c15ull);
  }
};

// The latest profile, under mu. Never destroyed: ops may still run while the program's statics are torn
// down.
struct State {
  std::mutex mu;
  bool on = false;
  uint64_t generation = 0;  // of the latest recording started
  size_t max_records = kDefaultMaxRecords;
  int64_t start_ns = 0, end_ns = 0;
  std::vector<OpRecord> records;
  int64_t dropped = 0;
  // By the name's pointer: one op's name is one string; op_stats() merges equal names behind two pointers.
  std::unordered_map<Key, Totals, KeyHash> totals;
};
State& state() {
  static State* s = new State;
  return *s;
}

// Starts a fresh recording unless one is on; returns its generation, or 0 when it joined one.
uint64_t start(size_t max_records) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.on) return 0;
  s.on = true;
  s.max_records = max_records;
  s.records.clear();
  s.totals.clear();
  s.dropped = 0;
  s.start_ns = now_ns();
  s.end_ns = 0;
  detail::g_recording.store(true, std::memory_order_relaxed);
  return ++s.generation;
}

// Stops the recording of `generation`; false when that one is no longer on.
bool stop(uint64_t generation) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (!s.on || s.generation != generation) return false;
  s.on = false;
  s.end_ns = now_ns();
  detail::g_recording.store(false, std::memory_order_relaxed);
  return true;
}

}  // namespace

bool detail::begin_op(const char* name, const Tensor* const* inputs, int count) {
  Pending& p = t_pending;
  if (p.open) return false;
  OpRecord& r = p.record;
  r = OpRecord{};
  r.name = name;
  r.phase = memory::current_phase();
  r.num_inputs = uint8_t(std::min(count, 255));
  if (count > 0 && inputs[0]->defined()) r.dtype = inputs[0]->dtype();
  for (int i = 0; i < std::min(count, kMaxInputs); ++i) {
    if (!inputs[i]->defined()) continue;
    const Shape& shape = inputs[i]->shape();
    r.ndim[i] = int8_t(shape.size());
    for (int d = 0; d < std::min(shape.size(), kMaxDims); ++d) r.dims[i][d] = shape[d];
  }
  r.thread = memory::detail::thread_number();
  p.bytes_before = t_bytes;
  p.open = true;
  r.start_ns = now_ns();  // last: the bookkeeping above is not the op's time
  return true;
}

void detail::end_op() {
  const int64_t end = now_ns();
  Pending& p = t_pending;
  if (!p.open) return;
  p.open = false;
  OpRecord& r = p.record;
  r.duration_ns = end - r.start_ns;
  r.bytes = t_bytes - p.bytes_before;
  State& s = state();
  std::lock_guard lock(s.mu);
  // An op that began before this recording started is not its op.
  if (!s.on || r.start_ns < s.start_ns) return;
  Totals& t = s.totals[{r.name, r.phase}];
  t.min_ns = t.calls == 0 ? r.duration_ns : std::min(t.min_ns, r.duration_ns);
  t.max_ns = std::max(t.max_ns, r.duration_ns);
  ++t.calls;
  t.total_ns += r.duration_ns;
  t.bytes += r.bytes;
  if (s.records.size() < s.max_records)
    s.records.push_back(r);
  else
    ++s.dropped;
}

void detail::count_allocation(int64_t bytes) { t_bytes += bytes; }

std::string OpRecord::shapes() const {
  std::string out;
  for (int i = 0; i < std::min<int>(num_inputs, kMaxInputs); ++i) {
    if (i > 0) out += ", ";
    out += '[';
    for (int d = 0; d < std::min<int>(ndim[i], kMaxDims); ++d) {
      if (d > 0) out += ", ";
      out += std::to_string(dims[i][d]);
    }
    if (ndim[i] > kMaxDims) out += ", ...";
    out += ']';
  }
  if (num_inputs > kMaxInputs) out += ", ...";
  return out;
}

Profile::Profile(std::string trace_path, size_t max_records) : path_(std::move(trace_path)) {
  FRUGAL_CHECK(max_records >= 1, "profiler::Profile: max_records must be at least 1, got ", max_records);
  generation_ = start(max_records);
}

Profile::~Profile() {
  try {
    stop();
  } catch (const Error& e) {
    std::fprintf(stderr, "profiler::Profile: %s\n", e.what());
  }
}

void Profile::stop() {
  if (generation_ == 0) return;
  const bool stopped = ::frugal::profiler::stop(std::exchange(generation_, 0));
  if (stopped && !path_.empty()) write_trace(path_);
}

bool recording() {
  State& s = state();
  std::lock_guard lock(s.mu);
  return s.on;
}

std::vector<OpRecord> records() {
  State& s = state();
  std::lock_guard lock(s.mu);
  return s.records;
}

int64_t dropped_records() {
  State& s = state();
  std::lock_guard lock(s.mu);
  return s.dropped;
}

std::vector<OpStats> op_stats() {
  std::vector<OpStats> out;
  {
    State& s = state();
    std::lock_guard lock(s.mu);
    for (const auto& entry : s.totals) {
      const Key& key = entry.first;  // not a structured binding: a lambda below captures it (clang 14)
      const Totals& t = entry.second;
      auto same = std::find_if(out.begin(), out.end(),
                               [&](const OpStats& o) { return o.phase == key.phase && o.name == key.name; });
      if (same == out.end()) {
        out.push_back({key.name, key.phase, t.calls, t.total_ns, t.min_ns, t.max_ns, t.bytes});
        continue;
      }
      same->min_ns = std::min(same->min_ns, t.min_ns);
      same->max_ns = std::max(same->max_ns, t.max_ns);
      same->calls += t.calls;
      same->total_ns += t.total_ns;
      same->bytes += t.bytes;
    }
  }
  std::sort(out.begin(), out.end(), [](const OpStats& a, const OpStats& b) {
    if (a.total_ns != b.total_ns) return a.total_ns > b.total_ns;
    if (a.name != b.name) return a.name < b.name;
    return a.phase < b.phase;
  });
  return out;
}

std::string summary(size_t max_rows) {
  const std::vector<OpStats> stats = op_stats();
  int64_t total = 0, calls = 0, bytes = 0;
  for (const OpStats& o : stats) {
    total += o.total_ns;
    calls += o.calls;
    bytes += o.bytes;
  }
  std::string out;
  char line[200];
  auto row = [&](const std::string& name, const char* phase, int64_t n, int64_t ns, int64_t b) {
    std::snprintf(line, sizeof line, "%-28s %-10s %9" PRId64 " %12.3f %11.2f %7.1f%% %12s\n",
                  name.substr(0, 28).c_str(), phase, n, double(ns) * 1e-6,
                  n > 0 ? double(ns) * 1e-3 / double(n) : 0.0,
                  total > 0 ? 100.0 * double(ns) / double(total) : 0.0, memory::format_bytes(b).c_str());
    out += line;
  };
  std::snprintf(line, sizeof line, "%-28s %-10s %9s %12s %11s %8s %12s\n", "op", "phase", "calls", "total ms",
                "mean us", "% time", "bytes");
  out += line;
  for (size_t i = 0; i < stats.size() && i < max_rows; ++i)
    row(stats[i].name, memory::phase_name(stats[i].phase), stats[i].calls, stats[i].total_ns, stats[i].bytes);
  if (stats.size() > max_rows) {
    int64_t n = 0, ns = 0, b = 0;
    for (size_t i = max_rows; i < stats.size(); ++i) {
      n += stats[i].calls;
      ns += stats[i].total_ns;
      b += stats[i].bytes;
    }
    row(frugal::detail::str_cat("(", stats.size() - max_rows, " more)"), "", n, ns, b);
  }
  row("all ops", "", calls, total, bytes);
  return out;
}

void write_trace(const std::string& path) {
  std::vector<OpRecord> ops;
  int64_t start = 0, end = 0, dropped = 0;
  {
    State& s = state();
    std::lock_guard lock(s.mu);
    ops = s.records;
    start = s.start_ns;
    end = s.on ? now_ns() : s.end_ns;
    dropped = s.dropped;
  }
  // The CPU's memory history, when it recorded while the profile did (not one before or after).
  const memory::HistoryRecord history = memory::history(kCPU);
  const bool with_history = history.start_ns != 0 && history.start_ns < end && history.end_ns > start;
  memory::detail::write_chrome_trace(path, "profiler::write_trace", with_history ? &history : nullptr, ops,
                                     with_history ? std::min(start, history.start_ns) : start, dropped);
}

}  // namespace frugal::profiler
