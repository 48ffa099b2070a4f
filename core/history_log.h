// The event buffer behind memory::History (core/memory_history.h): one per allocator, written under the
// allocator's mutex so that the events come in the order the statistics change. Private to the library and
// its tests.
#pragma once

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "error.h"
#include "memory.h"
#include "memory_history.h"
#include "profiler.h"

// Note [thread-locals on the allocation path]
// The library is linked by the programs that use it, not dlopened (the CUDA backend is, and defines none of
// these), so the thread-locals every allocation reads (the tag, the phase, grad mode's mirror) can live in
// the static TLS block: one load each instead of a __tls_get_addr call. They are constinit (constant
// initialisers): otherwise every read in another file first checks for a TLS init function to call.
#define FRUGAL_STATIC_TLS __attribute__((tls_model("initial-exec")))

namespace frugal::memory {

struct Block;
struct Segment;

namespace detail {

// Those thread-locals, defined where their scopes set them and read inline by the allocators:
// t_current_tag is memory::Tag's id (core/memory_api.cpp); t_phase a Phase, or -1 when none is set (Note
// [memory phases]); t_grad_mode autograd's grad mode (memory::detail::set_thread_grad_mode).
extern constinit FRUGAL_STATIC_TLS thread_local uint32_t t_current_tag;
extern constinit FRUGAL_STATIC_TLS thread_local int t_phase;
extern constinit FRUGAL_STATIC_TLS thread_local bool t_grad_mode;

// memory::current_phase(), inline for the allocation path.
inline Phase thread_phase() {
  if (t_phase >= 0) return Phase(t_phase);
  return t_grad_mode ? Phase::Forward : Phase::Other;
}

// Every call is made with the owning allocator's mutex held; on() is the one check on the allocation path
// while no history records.
class HistoryLog {
 public:
  bool on() const { return on_; }
  // A fresh record; `live` are the blocks live now, recorded as Live events (their category from their tag).
  void start(size_t max_events, int64_t allocated, int64_t reserved, const std::vector<Block*>& live);
  void stop() {  // a second stop keeps the first one's time: the record's end_ns is when it really ended
    if (on_) stop_ = std::chrono::steady_clock::now();
    on_ = false;
  }

  // Each records one event with the statistics just after it (allocated, reserved). A block event also
  // stamps the block with its category, so its free counts where its allocation did.
  void block(EventKind kind, Block& b, int64_t allocated, int64_t reserved);
  void retag(Block& b, uint32_t old_tag, int64_t allocated, int64_t reserved);
  void segment(EventKind kind, const Segment& s, int64_t allocated, int64_t reserved);
  void instant(EventKind kind, int64_t requested, int64_t allocated, int64_t reserved);

  HistoryRecord record(Device device) const;

 private:
  static constexpr size_t kChunk = 4096;  // events per chunk

  HistoryEvent* next_slot();  // null once full (then counts the drop)
  HistoryEvent* stamp(EventKind kind, int64_t allocated, int64_t reserved);
  Category category_for(uint32_t tag, Phase phase);  // Note [memory categories], the tag's part cached

  bool on_ = false;
  size_t max_events_ = kDefaultMaxEvents;
  size_t count_ = 0;
  int64_t dropped_ = 0;
  bool truncated_ = false;
  int64_t start_allocated_ = 0, start_reserved_ = 0;
  std::chrono::steady_clock::time_point start_{}, stop_{};
  std::vector<std::unique_ptr<HistoryEvent[]>> chunks_;
  std::vector<int8_t> tag_category_;  // by tag id: -1 not looked up, -2 the tag does not decide
};

// A small number for the calling thread (1, 2, ...), in the order threads first ask: the events' and the
// profiler's thread.
uint32_t thread_number();
// A JSON string literal (quoted, escaped) for a name.
std::string json_string(std::string_view s);
// A file to write, or Error naming the path and the reason.
struct OutputFile {
  explicit OutputFile(const std::string& path, const char* what);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  void write(std::string_view s);
  void close();  // flushes; Error when the data did not reach the file

  std::FILE* f = nullptr;
  std::string path;
  const char* what;
};
// A Chrome trace (Note [memory trace format]) of a history (or none) and op slices, times since zero_ns
// (steady clock); `what` names the caller in errors.
void write_chrome_trace(const std::string& path, const char* what, const HistoryRecord* history,
                        const std::vector<profiler::OpRecord>& ops, int64_t zero_ns, int64_t dropped_ops);
// Note [out-of-memory dump]: writes the trace and the snapshot, returns what the error's message adds.
std::string write_oom_dump(const HistoryRecord& record, const std::vector<BlockInfo>& blocks,
                           const Stats& stats);
void write_snapshot(const std::string& path, Device device, const std::vector<BlockInfo>& blocks,
                    const Stats& stats);

}  // namespace detail
}  // namespace frugal::memory
