// Seeing memory over time: a history of every allocation and free of a device's allocator, written as a
// Chrome trace (Perfetto and chrome://tracing open it) or as an SVG picture, and dumped by itself when an
// OutOfMemoryError is thrown while it records. Not a profiler: it knows bytes, not kernel times.
//
//   {
//     memory::History h(kCPU);       // records from here...
//     train_step();
//   }                                 // ...to here
//   memory::dump_trace("step.json");  // ui.perfetto.dev: counters by category, allocated, reserved
//   memory::dump_svg("step.svg");     // live bytes by category, the peak and the largest blocks at it
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "device.h"
#include "memory.h"

namespace frugal {
class Tensor;
}
namespace frugal::profiler::detail {
// The profiler's side of OpScope (core/profiler.cpp): on while a profile records; begin_op returns whether
// it started timing the op (end_op then closes it).
extern std::atomic<bool> g_recording;
bool begin_op(const char* name, const Tensor* const* inputs, int count);
void end_op();
}  // namespace frugal::profiler::detail

namespace frugal::memory {

// Note [memory phases]
// What the program was doing when it allocated. A thread-local set by PhaseScope where the library knows:
// autograd's backward (autograd/engine.cpp), a recompute segment run again in backward
// (autograd/recompute.cpp), an optimizer's step (optim/optimizer.cpp) and data (data/: the loader, the
// datasets' reading and batching). Outside any scope the phase is Forward while grad mode is on (the tape may
// record what is allocated) and Other while it is off (evaluation, NoGradGuard, InferenceMode). Scopes nest;
// the innermost wins (recompute inside backward reads Recompute).
enum class Phase : uint8_t { Forward, Backward, Recompute, Optimizer, Data, Other };
inline constexpr int kNumPhases = 6;
const char* phase_name(Phase phase);  // "forward", "backward", ...

// Note [memory categories]
// What a block holds, from the tag it carries and the phase it was allocated in, decided when the event is
// recorded (and again when a block is retagged, as a gradient buffer becoming a .grad is). The tag decides
// first: the library's own tags "gradients" (a leaf's .grad, autograd/engine.cpp) and "optimizer"
// (optimizer state, optim/optimizer.cpp), then the components of the tag's path ('/'-joined scopes), the
// innermost that names a category winning ("backward/recompute" is activations): "parameters" makes
// parameters; "gradients" or "backward" gradients; "optimizer" optimizer state; "activations", "recompute",
// "evaluation" or "inference" activations; "data" or "dataset" data. The trainers tag their parts so
// (examples/). Otherwise the phase decides: Forward and Recompute allocate activations, Backward gradients
// (what flows between the nodes and the rules' temporaries that make it), Optimizer optimizer state (with
// the step's temporaries), Data data; Other (no grad mode and no tag) is other. The mapping is fixed and
// computed once per tag name, so recording stays cheap; a program that wants exact categories tags its
// parameters and data.
enum class Category : uint8_t { Parameters, Gradients, OptimizerState, Activations, Data, Other };
inline constexpr int kNumCategories = 6;
const char* category_name(Category category);  // "parameters", "gradients", "optimizer state", ...
Category category_of(std::string_view tag, Phase phase);

enum class EventKind : uint8_t {
  Live,          // a block already live when the history started (time 0)
  Alloc,         // a block became live
  Free,          // a live block was freed
  Retag,         // a live block moved to another tag (and maybe category)
  SegmentAlloc,  // memory taken from the system
  SegmentFree,   // memory returned to the system
  CacheFlush,    // the cache was emptied (empty_cache, or forced by the limit)
  Oom,           // an OutOfMemoryError was thrown
};
const char* event_kind_name(EventKind kind);

struct HistoryEvent {
  int64_t time_ns = 0;  // since the history started (steady clock)
  EventKind kind = EventKind::Alloc;
  Phase phase = Phase::Other;
  Category category = Category::Other;      // the block's (after a retag: the new one)
  Category old_category = Category::Other;  // Retag: before
  uint32_t tag = 0;                         // tag id (memory::tag_name); Retag: the new one
  uint32_t old_tag = 0;                     // Retag: before
  uint32_t thread = 0;                      // a small number per thread, in order of first recording
  const char* op = "";                      // the op that allocated (OpScope), "" when none
  int64_t requested = 0;  // bytes asked for (Alloc, Free, Live, Retag; Oom: the failed request)
  int64_t size = 0;       // bytes rounded (a block's), or the segment's bytes
  uint64_t address = 0;   // the block's (or the segment's) first byte
  int64_t segment = -1;   // id of the block's segment
  int64_t allocated = 0;  // the allocator's allocated bytes just after the event (Stats::allocated.current)
  int64_t reserved = 0;   // and its reserved bytes
};

// What a history holds: the events in order (the allocator's mutex orders them exactly as the statistics
// change), and whether it stopped early.
struct HistoryRecord {
  Device device = kCPU;
  std::vector<HistoryEvent> events;
  std::vector<std::string> tags;  // tags[id] = name, for every tag id the events use
  int64_t start_allocated = 0;    // the statistics when the history started
  int64_t start_reserved = 0;
  // When the history started and stopped (or was copied, while it records): steady-clock nanoseconds since
  // the clock's epoch, the time base the profiler's op slices share (core/profiler.h).
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  size_t max_events = 0;
  bool truncated = false;  // the buffer filled up: recording stopped there (Note [history bounds])
  int64_t dropped = 0;     // events not recorded since
};

// Note [history bounds]
// A history keeps at most max_events events (80 bytes each; the default bound is 80 MiB) in
// chunks of plain heap memory, never from the allocator it measures (kept for the next record, so that
// recording step after step touches fresh pages once). When full it stops recording, keeps what
// it has (so the start of the run stays exact) and counts what it drops; the trace and the SVG say so. A ring
// that overwrote the oldest events would lose where the live blocks came from.
inline constexpr size_t kDefaultMaxEvents = size_t(1) << 20;

// Records the history of `device`'s allocator while alive. If none is recording, it starts a fresh one
// (dropping the previous record) and stops it when it dies. If one is already recording (an outer History,
// or record_history(device, true)), it joins that one: it neither clears it nor stops it. Once its own
// recording has been stopped (record_history(device, false)), its death changes nothing, even if another
// recording has started since.
class History {
 public:
  explicit History(Device device = kCPU, size_t max_events = kDefaultMaxEvents);
  ~History();
  History(const History&) = delete;
  History& operator=(const History&) = delete;
  bool owns() const { return generation_ != 0; }  // whether this guard started the recording

 private:
  Device device_;
  uint64_t generation_ = 0;  // of the recording it started, 0 when it joined one
};

// On: starts a fresh history unless one is recording (then nothing changes). Off: stops it (the record stays
// for the dumps until the next start). max_events: Note [history bounds]; it must be at least 1.
void record_history(Device device, bool enabled, size_t max_events = kDefaultMaxEvents);
bool history_enabled(Device device = kCPU);
// A copy of the record (while recording, what has been recorded so far).
HistoryRecord history(Device device = kCPU);

// The bytes live at a record's peak, by category: the first event at which the allocated bytes are highest
// (the start, when nothing allocated beyond it), as the SVG marks it, and each category's own highest bytes
// over the record (at different moments: together more than the peak). The events are replayed and, after
// each, the categories must add up to the allocated bytes the allocator recorded with it: Error otherwise (a
// truncated record, Note [history bounds], is refused: its breakdown would be wrong).
struct PeakBreakdown {
  int64_t total = 0;                                  // allocated bytes at the peak
  int64_t time_ns = 0;                                // when (since the record's start)
  std::array<int64_t, kNumCategories> by_category{};  // by Category; adds up to total
  std::array<int64_t, kNumCategories> category_peaks{};
};
PeakBreakdown peak_by_category(const HistoryRecord& record);

// The device's live bytes by category, current and peak (since reset_tag_peaks), each tag's category as
// category_of(tag, Phase::Other) decides it; with no history needed. Exact: a category's peak is the most
// bytes it held at one moment, not the sum of its tags' peaks (Note [category statistics],
// core/allocator_base.h).
std::array<Stat, kNumCategories> category_stats(Device device = kCPU);

// The record as Chrome-trace JSON (Note [memory trace format] in core/memory_trace.cpp) and as an SVG
// picture (core/memory_svg.cpp). Throw Error naming the path when it cannot be written.
void dump_trace(const std::string& path, Device device = kCPU);
void dump_svg(const std::string& path, Device device = kCPU);
// The blocks now (memory::snapshot) and the statistics, as JSON.
void dump_snapshot(const std::string& path, Device device = kCPU);
// The same, for a record in hand.
void write_trace(const std::string& path, const HistoryRecord& record);
void write_svg(const std::string& path, const HistoryRecord& record);

// Note [out-of-memory dump]
// When an allocation throws OutOfMemoryError while its device's history records, the allocator writes the
// trace and a snapshot (blocks and statistics at the failure) before throwing, as
// <prefix>-<pid>-<n>.trace.json and <prefix>-<pid>-<n>.snapshot.json, and the error's message names both
// files. The prefix is "frugal-oom" (in the current folder) unless set here. At most kMaxOomDumps dumps are
// written per process, so a program that catches OOMs in a loop cannot fill the disk; a write that fails is
// reported in the message, never thrown instead of the OutOfMemoryError.
void set_oom_dump_prefix(const std::string& prefix);
std::string oom_dump_prefix();
inline constexpr int kMaxOomDumps = 8;

// Which phase this thread is in (Note [memory phases]), for the span of the scope.
class PhaseScope {
 public:
  explicit PhaseScope(Phase phase);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  int previous_;
};
Phase current_phase();

namespace detail {
// OpScope's name, read by every allocation: in the static TLS block (Note [thread-locals on the allocation
// path], core/history_log.h); nvcc's front end refuses the attribute, as on detail::t_default_device.
#if defined(__CUDACC__)
extern thread_local const char* t_current_op;
#else
extern constinit thread_local const char* t_current_op __attribute__((tls_model("initial-exec")));
#endif
}  // namespace detail

// Note [op names in the history]
// The op layer names itself: each op function of core/ (and each backward rule the engine runs) opens an
// OpScope with its name, a string that lives for the whole program (a literal or an op table's name), and
// its tensor inputs. The outermost scope wins, so the cast an add makes of its operand counts as the add's,
// and what a backward rule allocates counts as that node's ("relu" in phase backward). Two thread-local
// stores per op and one relaxed load of the profiler's flag; the inputs are looked at only while a profile
// records (core/profiler.h), which times the outermost scopes.
class OpScope {
 public:
  template <class... Inputs>
  explicit OpScope(const char* name, const Inputs&... inputs) : previous_(current_op_slot()) {
    static_assert((std::is_same_v<Inputs, Tensor> && ...), "OpScope's inputs are Tensors");
    if (previous_) return;
    current_op_slot() = name;
    if (profiler::detail::g_recording.load(std::memory_order_relaxed)) [[unlikely]] {
      const Tensor* in[] = {&inputs..., nullptr};
      profiled_ = profiler::detail::begin_op(name, in, int(sizeof...(Inputs)));
    }
  }
  ~OpScope() {
    if (profiled_) [[unlikely]]
      profiler::detail::end_op();
    current_op_slot() = previous_;
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

  static const char*& current_op_slot() { return detail::t_current_op; }

 private:
  const char* previous_;
  bool profiled_ = false;
};
inline const char* current_op() {
  const char* op = OpScope::current_op_slot();
  return op ? op : "";
}

}  // namespace frugal::memory

namespace frugal::memory::detail {
// Autograd tells core whenever this thread's grad mode changes, for the default phase (core cannot include
// autograd): a mirror core reads with the phase scope's, so that current_phase() is two thread-local loads
// (every allocation stamps it on its block for the out-of-memory message).
void set_thread_grad_mode(bool enabled);
}  // namespace frugal::memory::detail
