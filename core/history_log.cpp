// The memory history: the event buffer each allocator keeps (core/history_log.h), the phase and op scopes,
// the categories, and the public calls of core/memory_history.h other than the two pictures
// (core/memory_trace.cpp, core/memory_svg.cpp).
#include "core/history_log.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include <nlohmann/json.hpp>

#include "core/allocator_base.h"

namespace frugal::memory {

// Note [thread-locals on the allocation path] (core/history_log.h).
constinit FRUGAL_STATIC_TLS thread_local int detail::t_phase = -1;
constinit FRUGAL_STATIC_TLS thread_local bool detail::t_grad_mode = true;
constinit FRUGAL_STATIC_TLS thread_local const char* detail::t_current_op = nullptr;

namespace {
std::atomic<uint32_t> g_next_thread{0};
thread_local uint32_t t_thread = 0;  // 0: not numbered yet

// The category a tag decides by itself (Note [memory categories]), or -2 when the phase must.
int8_t tag_category(std::string_view tag) {
  int8_t found = -2;
  size_t begin = 0;
  while (begin <= tag.size()) {
    const size_t end = std::min(tag.find('/', begin), tag.size());
    const std::string_view part = tag.substr(begin, end - begin);
    // The innermost component that names a category wins: "backward/recompute" is activations.
    if (part == "parameters")
      found = int8_t(Category::Parameters);
    else if (part == "gradients" || part == "backward")
      found = int8_t(Category::Gradients);
    else if (part == "optimizer")
      found = int8_t(Category::OptimizerState);
    else if (part == "activations" || part == "recompute" || part == "evaluation" || part == "inference")
      found = int8_t(Category::Activations);
    else if (part == "data" || part == "dataset")
      found = int8_t(Category::Data);
    begin = end + 1;
  }
  return found;
}

Category phase_category(Phase phase) {
  switch (phase) {
    case Phase::Forward:
    case Phase::Recompute:
      return Category::Activations;
    case Phase::Backward:
      return Category::Gradients;
    case Phase::Optimizer:
      return Category::OptimizerState;
    case Phase::Data:
      return Category::Data;
    default:
      return Category::Other;
  }
}

std::mutex g_oom_mu;
std::string g_oom_prefix = "frugal-oom";
int g_oom_dumps = 0;
}  // namespace

const char* phase_name(Phase phase) {
  static constexpr const char* kNames[] = {"forward", "backward", "recompute", "optimizer", "data", "other"};
  return int(phase) < kNumPhases ? kNames[int(phase)] : "?";
}

const char* category_name(Category category) {
  static constexpr const char* kNames[] = {"parameters",  "gradients", "optimizer state",
                                           "activations", "data",      "other"};
  return int(category) < kNumCategories ? kNames[int(category)] : "?";
}

const char* event_kind_name(EventKind kind) {
  static constexpr const char* kNames[] = {"live",          "alloc",        "free",        "retag",
                                           "segment alloc", "segment free", "cache flush", "oom"};
  return int(kind) < 8 ? kNames[int(kind)] : "?";
}

Category category_of(std::string_view tag, Phase phase) {
  const int8_t c = tag_category(tag);
  return c >= 0 ? Category(c) : phase_category(phase);
}

PhaseScope::PhaseScope(Phase phase) : previous_(detail::t_phase) { detail::t_phase = int(phase); }
PhaseScope::~PhaseScope() { detail::t_phase = previous_; }

Phase current_phase() { return detail::thread_phase(); }

void detail::set_thread_grad_mode(bool enabled) { detail::t_grad_mode = enabled; }

// ---- the buffer ----

namespace detail {

uint32_t thread_number() {
  if (t_thread == 0) t_thread = g_next_thread.fetch_add(1, std::memory_order_relaxed) + 1;
  return t_thread;
}

static_assert(sizeof(HistoryEvent) <= 80, "Note [history bounds] gives 80 bytes an event");

void HistoryLog::start(size_t max_events, int64_t allocated, int64_t reserved,
                       const std::vector<Block*>& live) {
  on_ = true;
  max_events_ = max_events;
  count_ = 0;
  dropped_ = 0;
  truncated_ = false;
  // The chunks of the last record are reused, up to what the new bound needs: a program that records
  // step after step pays for fresh pages once.
  chunks_.resize(std::min(chunks_.size(), (max_events + kChunk - 1) / kChunk));
  start_allocated_ = allocated;
  start_reserved_ = reserved;
  start_ = std::chrono::steady_clock::now();
  // The blocks already live, so that the categories start from what is there; each Live event carries the
  // running sum, the last one the allocated bytes at the start.
  int64_t running = allocated;
  for (const Block* b : live) running -= b->size;
  for (Block* b : live) {
    running += b->size;
    block(EventKind::Live, *b, running, reserved);
  }
}

HistoryEvent* HistoryLog::next_slot() {
  if (count_ >= max_events_) {
    truncated_ = true;
    ++dropped_;
    return nullptr;
  }
  if (count_ / kChunk >= chunks_.size()) chunks_.push_back(std::make_unique<HistoryEvent[]>(kChunk));
  HistoryEvent* e = &chunks_[count_ / kChunk][count_ % kChunk];
  ++count_;
  return e;
}

HistoryEvent* HistoryLog::stamp(EventKind kind, int64_t allocated, int64_t reserved) {
  HistoryEvent* e = next_slot();
  if (!e) return nullptr;
  *e = HistoryEvent{};
  e->kind = kind;
  e->time_ns =
      kind == EventKind::Live
          ? 0
          : std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_)
                .count();
  e->phase = kind == EventKind::Live ? Phase::Other : current_phase();
  e->thread = thread_number();
  e->op = current_op();
  e->allocated = allocated;
  e->reserved = reserved;
  return e;
}

Category HistoryLog::category_for(uint32_t tag, Phase phase) {
  if (tag >= tag_category_.size()) tag_category_.resize(tag + 1, -1);
  if (tag_category_[tag] == -1) tag_category_[tag] = tag_category(tag_name(tag));
  return tag_category_[tag] >= 0 ? Category(tag_category_[tag]) : phase_category(phase);
}

void HistoryLog::block(EventKind kind, Block& b, int64_t allocated, int64_t reserved) {
  const uint32_t tag = b.tag;  // a freed block has lost its tag already: the event keeps the one it had
  if (kind == EventKind::Alloc || kind == EventKind::Live || b.category < 0)
    b.category = int8_t(category_for(tag, kind == EventKind::Alloc ? current_phase() : Phase::Other));
  HistoryEvent* e = stamp(kind, allocated, reserved);
  if (!e) return;
  if (kind == EventKind::Live) e->op = "";
  e->category = e->old_category = Category(b.category);
  e->tag = e->old_tag = tag;
  e->requested = b.requested;
  e->size = b.size;
  e->address = uint64_t(reinterpret_cast<uintptr_t>(b.ptr));
  e->segment = b.segment ? b.segment->id : -1;
}

void HistoryLog::retag(Block& b, uint32_t old_tag, int64_t allocated, int64_t reserved) {
  const Category old_category = b.category >= 0 ? Category(b.category) : category_for(old_tag, Phase::Other);
  const Category by_tag = category_for(b.tag, Phase::Other);
  // A tag that does not decide a category keeps the block where its allocation put it.
  const bool decides = tag_category_[b.tag] >= 0;
  b.category = int8_t(decides ? by_tag : old_category);
  HistoryEvent* e = stamp(EventKind::Retag, allocated, reserved);
  if (!e) return;
  e->category = Category(b.category);
  e->old_category = old_category;
  e->tag = b.tag;
  e->old_tag = old_tag;
  e->requested = b.requested;
  e->size = b.size;
  e->address = uint64_t(reinterpret_cast<uintptr_t>(b.ptr));
  e->segment = b.segment ? b.segment->id : -1;
}

void HistoryLog::segment(EventKind kind, const Segment& s, int64_t allocated, int64_t reserved) {
  HistoryEvent* e = stamp(kind, allocated, reserved);
  if (!e) return;
  e->size = s.size;
  e->address = uint64_t(reinterpret_cast<uintptr_t>(s.base));
  e->segment = s.id;
}

void HistoryLog::instant(EventKind kind, int64_t requested, int64_t allocated, int64_t reserved) {
  HistoryEvent* e = stamp(kind, allocated, reserved);
  if (!e) return;
  e->requested = requested;
}

HistoryRecord HistoryLog::record(Device device) const {
  HistoryRecord r;
  r.device = device;
  r.events.reserve(count_);
  uint32_t max_tag = 0;
  for (size_t i = 0; i < count_; ++i) {
    r.events.push_back(chunks_[i / kChunk][i % kChunk]);
    max_tag = std::max({max_tag, r.events.back().tag, r.events.back().old_tag});
  }
  for (uint32_t id = 0; id <= max_tag; ++id) r.tags.push_back(tag_name(id));
  r.start_allocated = start_allocated_;
  r.start_reserved = start_reserved_;
  const auto ns = [](std::chrono::steady_clock::time_point t) {
    return int64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
  };
  r.start_ns = ns(start_);
  r.end_ns = ns(on_ ? std::chrono::steady_clock::now() : stop_);
  r.max_events = max_events_;
  r.truncated = truncated_;
  r.dropped = dropped_;
  return r;
}

// ---- files ----

std::string json_string(std::string_view s) {
  // Bytes that are not UTF-8 (a tag is any string) become U+FFFD rather than an exception.
  return nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

OutputFile::OutputFile(const std::string& p, const char* w) : path(p), what(w) {
  FRUGAL_CHECK(!path.empty(), "memory::", what, ": the path is empty; give a file name");
  f = std::fopen(path.c_str(), "wb");
  FRUGAL_CHECK(f != nullptr, "memory::", what, ": cannot write '", path, "': ", std::strerror(errno),
               " (does the folder exist and is it writable?)");
}
OutputFile::~OutputFile() {
  if (f) std::fclose(f);
}
void OutputFile::write(std::string_view s) {
  if (!s.empty() && std::fwrite(s.data(), 1, s.size(), f) != s.size())
    throw Error(
        frugal::detail::str_cat("memory::", what, ": writing '", path, "' failed: ", std::strerror(errno)));
}
void OutputFile::close() {
  std::FILE* file = std::exchange(f, nullptr);
  const bool bad = std::ferror(file) != 0;
  const int err = errno;
  if (std::fclose(file) != 0 || bad)
    throw Error(frugal::detail::str_cat("memory::", what, ": writing '", path, "' failed: ",
                                        std::strerror(bad ? err : errno), " (is the disk full?)"));
}

void write_snapshot(const std::string& path, Device device, const std::vector<BlockInfo>& blocks,
                    const Stats& s) {
  OutputFile out(path, "dump_snapshot");
  std::string text = frugal::detail::str_cat(
      "{\"device\":", json_string(device.str()), ",\n\"stats\":{\"requested\":", s.requested.current,
      ",\"requested_peak\":", s.requested.peak, ",\"allocated\":", s.allocated.current,
      ",\"allocated_peak\":", s.allocated.peak, ",\"reserved\":", s.reserved.current,
      ",\"reserved_peak\":", s.reserved.peak, ",\"active_blocks\":", s.active_blocks.current,
      ",\"segments\":", s.segments.current, ",\"num_allocs\":", s.num_allocs, ",\"num_frees\":", s.num_frees,
      ",\"num_cache_flushes\":", s.num_cache_flushes, ",\"num_ooms\":", s.num_ooms,
      ",\"largest_free_block\":", s.largest_free_block, ",\"free_bytes\":", s.free_bytes, "},\n\"blocks\":[");
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockInfo& b = blocks[i];
    text += frugal::detail::str_cat(i ? ",\n" : "\n", "{\"address\":", b.address, ",\"size\":", b.size,
                                    ",\"requested\":", b.requested, ",\"segment\":", b.segment,
                                    ",\"allocated\":", b.allocated ? "true" : "false",
                                    ",\"tag\":", json_string(b.tag), ",\"stream\":", b.stream, "}");
    if (text.size() > (1 << 16)) out.write(std::exchange(text, std::string()));
  }
  text += "\n]}\n";
  out.write(text);
  out.close();
}

std::string write_oom_dump(const HistoryRecord& record, const std::vector<BlockInfo>& blocks,
                           const Stats& stats) {
  std::string prefix;
  int n = 0;
  {
    std::lock_guard lock(g_oom_mu);
    if (g_oom_dumps >= kMaxOomDumps)
      return frugal::detail::str_cat(" [memory history on, but no dump written: this process wrote ",
                                     kMaxOomDumps, " already (Note [out-of-memory dump])]");
    prefix = g_oom_prefix;
    n = ++g_oom_dumps;
  }
  const std::string base = frugal::detail::str_cat(prefix, "-", long(::getpid()), "-", n);
  const std::string trace = base + ".trace.json", snapshot = base + ".snapshot.json";
  try {
    write_trace(trace, record);
    write_snapshot(snapshot, record.device, blocks, stats);
  } catch (const Error& e) {
    return frugal::detail::str_cat(" [memory history on, but its dump failed: ", e.what(), "]");
  }
  return frugal::detail::str_cat(" [memory history written to ", trace, " (Chrome trace, ui.perfetto.dev)",
                                 " and ", snapshot, " (blocks and statistics at the failure)]");
}

}  // namespace detail

// ---- the peak ----

PeakBreakdown peak_by_category(const HistoryRecord& r) {
  FRUGAL_CHECK(!r.truncated, "memory::peak_by_category: the record is truncated (", r.dropped,
               " events dropped after ", r.max_events, "): record a shorter span or raise max_events");
  int64_t live[kNumCategories] = {};
  auto sum = [&] {
    int64_t n = 0;
    for (int64_t b : live) n += b;
    return n;
  };
  PeakBreakdown peak;
  bool started = false;
  auto take = [&](PeakBreakdown& p, bool peaks) {
    for (int c = 0; c < kNumCategories; ++c) {
      p.by_category[c] = live[c];
      if (peaks) p.category_peaks[c] = live[c];
    }
  };
  for (const HistoryEvent& e : r.events) {
    if (e.kind == EventKind::Live) {
      live[int(e.category)] += e.size;
      continue;
    }
    if (!started) {
      FRUGAL_CHECK(sum() == r.start_allocated, "memory::peak_by_category: the blocks live at the start hold ",
                   sum(), " bytes, the allocator had ", r.start_allocated, " allocated");
      peak.total = r.start_allocated;
      take(peak, true);
      started = true;
    }
    if (e.kind == EventKind::Alloc || e.kind == EventKind::Free) {
      live[int(e.category)] += e.kind == EventKind::Alloc ? e.size : -e.size;
    } else if (e.kind == EventKind::Retag) {
      live[int(e.old_category)] -= e.size;
      live[int(e.category)] += e.size;
    } else {
      continue;
    }
    FRUGAL_CHECK(sum() == e.allocated, "memory::peak_by_category: after a ", event_kind_name(e.kind),
                 " the categories hold ", sum(), " bytes, the allocator ", e.allocated);
    for (int c = 0; c < kNumCategories; ++c)
      peak.category_peaks[c] = std::max(peak.category_peaks[c], live[c]);
    if (e.allocated > peak.total) {
      peak.total = e.allocated;
      peak.time_ns = e.time_ns;
      take(peak, false);
    }
  }
  if (!started) {
    peak.total = r.start_allocated;
    take(peak, true);
  }
  return peak;
}

// ---- the public calls ----

detail::AllocatorBase& detail::allocator_base(Device device) {
  Allocator& a = allocator(device);
  auto* base = dynamic_cast<AllocatorBase*>(&a);
  FRUGAL_ASSERT(base != nullptr, "the ", a.kind(), " allocator of ", device, " is not an AllocatorBase");
  return *base;
}

std::array<Stat, kNumCategories> category_stats(Device device) {
  return detail::allocator_base(device).category_stats();
}

History::History(Device device, size_t max_events) : device_(device) {
  FRUGAL_CHECK(max_events >= 1, "memory::History: max_events must be at least 1, got ", max_events);
  generation_ = detail::allocator_base(device).start_history(max_events);
}
History::~History() {
  if (generation_ != 0) detail::allocator_base(device_).stop_history(generation_);
}

void record_history(Device device, bool enabled, size_t max_events) {
  FRUGAL_CHECK(!enabled || max_events >= 1, "memory::record_history: max_events must be at least 1, got ",
               max_events);
  detail::AllocatorBase& a = detail::allocator_base(device);
  if (enabled)
    a.start_history(max_events);
  else
    a.stop_history(0);
}
bool history_enabled(Device device) { return detail::allocator_base(device).history_on(); }
HistoryRecord history(Device device) { return detail::allocator_base(device).history(); }

void dump_trace(const std::string& path, Device device) { write_trace(path, history(device)); }
void dump_svg(const std::string& path, Device device) { write_svg(path, history(device)); }
void dump_snapshot(const std::string& path, Device device) {
  Allocator& a = allocator(device);
  detail::write_snapshot(path, device, a.snapshot(), a.stats());
}

void set_oom_dump_prefix(const std::string& prefix) {
  FRUGAL_CHECK(!prefix.empty(),
               "memory::set_oom_dump_prefix: the prefix is empty; give a path such as "
               "\"/tmp/oom\" (files <prefix>-<pid>-<n>.trace.json are written)");
  std::lock_guard lock(g_oom_mu);
  g_oom_prefix = prefix;
}
std::string oom_dump_prefix() {
  std::lock_guard lock(g_oom_mu);
  return g_oom_prefix;
}

}  // namespace frugal::memory
