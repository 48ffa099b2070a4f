// What the caching arena (core/arena.cpp) and the system allocator (core/system_allocator.cpp) share: the
// block and segment records, and AllocatorBase, which keeps the device's backing, the limit, the statistics
// (per device and per tag) and the out-of-memory error. Private to the library and its tests.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "error.h"
#include "history_log.h"
#include "memory.h"
#include "smi_page.h"

namespace frugal::memory {

struct Segment;

// A run of bytes inside a segment, live or cached free. The blocks of a segment form a doubly linked list in
// address order, so a freed block finds the neighbours it merges with in O(1).
struct Block {
  char* ptr = nullptr;
  int64_t size = 0;       // rounded
  int64_t requested = 0;  // 0 while free
  Segment* segment = nullptr;
  Block* prev = nullptr;
  Block* next = nullptr;
  uint32_t tag = 0;
  bool allocated = false;
  int8_t category = -1;        // a memory::Category, stamped while a history records (core/history_log.h)
  Phase phase = Phase::Other;  // the allocating thread's, and the op that allocated it: what an
  const char* op = "";         // out-of-memory message says of the live blocks (core/out_of_memory.cpp)
  bool binned = false;         // freed into the arena's bin of its size (Note [exact-fit bins]): in no pool
  Stream stream = 0;           // the segment's: blocks are reused only on it (Note [streams and the arena])
  int pending_events = 0;      // freed, waiting for other streams' work: in no pool, merges with nothing
  std::vector<Stream> uses{};  // other streams that use the live block (record_stream)
  Block* bin_next = nullptr;   // the next block in its bin
};

// One backing allocation. The arena carves it into blocks; the system allocator holds one block per segment.
struct Segment {
  int64_t id = 0;
  char* base = nullptr;
  int64_t size = 0;
  bool small = false;  // which pool its free blocks go to
  Block* head = nullptr;
  Stream stream = 0;
};

namespace detail {

inline constexpr int64_t kMiB = 1024 * 1024;
// The caching arena's pools (core/arena.cpp): requests up to kSmallRequest come from the small pool, whose
// blocks are split to the request (rounded to 512 bytes). A large block is split only if more than
// kLargeSplitRemainder would be left (smaller tails would only fragment the pool), so a large request may get
// a cached block up to that much larger than itself: what it takes then depends on what the arena caches.
inline constexpr int64_t kSmallRequest = 1 * kMiB;
inline constexpr int64_t kLargeSplitRemainder = 1 * kMiB;
inline constexpr int64_t kHostAlign = 64;  // a cache line, and enough for AVX-512 loads
// Beyond any memory; keeps the rounding from overflowing.
inline constexpr int64_t kMaxRequest = int64_t(1) << 56;

// Note [a simulated arena]
// The meta device's allocator (core/estimate.cpp): the caching arena over a backing of virtual addresses,
// whose allocations are not real (Note [failing an allocation] does not count them). With a source arena it
// starts as a copy of that arena's state: the same segments, free blocks and statistics, its live blocks held
// until it dies (`resident`: their bytes), so that a dry run continues from where the real device is.
std::unique_ptr<Allocator> make_simulated_arena(Device device, std::unique_ptr<Backing> backing,
                                                const Allocator* source, int64_t* resident);
// Virtual addresses that no access can reach (non-canonical on x86-64 and AArch64: a stray read faults at
// once rather than touching memory), handed out in order and never reused.
std::unique_ptr<Backing> make_meta_backing();
// Installs the meta device's allocator and returns the one before (core/estimate.cpp destroys it once no
// tensor uses it). One dry run at a time: no other thread may use meta tensors meanwhile.
std::unique_ptr<Allocator> swap_meta_allocator(std::unique_ptr<Allocator> next);

// Note [an out-of-memory message that explains itself]: what holds the bytes and what each technique would
// free, computed from the live blocks and the statistics at the failing moment (core/out_of_memory.cpp).
// It names library calls; a program adds its own flags where it catches the error (examples/).
std::string explain_out_of_memory(const std::vector<Block*>& live, const Stats& stats);

// Note [the allocators' lock]
// Every allocate and free takes the allocator's lock once, so its cost is paid twice a pair. std::mutex
// (glibc's pthread mutex) costs a call into libc and an atomic read-modify-write both to lock and to unlock:
// 6.6-7.2 ns a lock/unlock here. This lock takes one exchange to acquire and a plain release store
// to let go: 2.4 ns (AMD EPYC Zen 4, both measured by a loop of 10^8 uncontended lock/unlock pairs). A
// waiter spins briefly, then yields its core, so that a holder that runs long (a backing allocation, an
// out-of-memory dump) is not starved on a machine with few cores. The critical sections are short and
// almost always uncontended (one thread does a step's allocations), which is the case a spin lock is for; a
// futex-based lock would need a read-modify-write to unlock, to learn whether anyone sleeps.
class AllocatorLock {
 public:
  [[gnu::always_inline]] void lock() noexcept {
    if (!held_.exchange(true, std::memory_order_acquire)) [[likely]]
      return;
    lock_contended();
  }
  bool try_lock() noexcept {
    return !held_.load(std::memory_order_relaxed) && !held_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  [[gnu::noinline, gnu::cold]] void lock_contended() noexcept {
    constexpr int kSpins = 128;  // a few hundred ns: longer than an uncontended allocate or free
    for (int spins = 0;;) {
      while (held_.load(std::memory_order_relaxed)) {
        if (++spins < kSpins) {
#if defined(__x86_64__) || defined(__i386__)
          __builtin_ia32_pause();
#endif
        } else {
          std::this_thread::yield();
        }
      }
      if (!held_.exchange(true, std::memory_order_acquire)) return;
    }
  }

  std::atomic<bool> held_{false};
};

// Note [failing an allocation]: true from fail_allocation_at(n >= 1) to fail_allocation_at(0), the only time
// allocations are counted; while false, the allocators' one check (a relaxed load, not a read-modify-write of
// a counter every thread shares).
extern std::atomic<bool> g_counting_allocations;

inline int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// A peak is stored only when passed, which a run that repeats its steps seldom does: `peak = max(peak,
// current)` stored it at every change, six stores an allocation (GCC also packed them into vector inserts for
// znver4), and the 4 KiB arena pair took 15.7 ns instead of 14.0 (best of 45 alternated runs, Zen 4).
inline void add(Stat& s, int64_t delta) {
  s.current += delta;
  if (s.current > s.peak) [[unlikely]]
    s.peak = s.current;
}

// What both allocators share: device, backing, limit, statistics (per device and per tag), the out-of-memory
// error. Subclasses hold mu_ whenever they touch any of it.
class AllocatorBase : public Allocator {
 public:
  AllocatorBase(Device device, std::unique_ptr<Backing> backing)
      : device_(device), backing_(std::move(backing)) {
    FRUGAL_CHECK(backing_ != nullptr, "memory: the allocator of ", device, " needs a backing, got nullptr");
  }

  std::vector<BlockInfo> snapshot() const final {
    std::lock_guard lock(mu_);
    return snapshot_locked();
  }
  Stats stats() const override {
    std::lock_guard lock(mu_);
    return stats_locked();
  }
  Stats stats_locked() const {
    Stats s = stats_;
    s.largest_free_block = largest_free_locked();
    s.free_bytes = s.reserved.current - s.allocated.current;
    s.fragmentation = s.free_bytes > 0 ? 1.0 - double(s.largest_free_block) / double(s.free_bytes) : 0.0;
    return s;
  }
  void reset_peak() override {
    std::lock_guard lock(mu_);
    for (Stat* s : {&stats_.requested, &stats_.allocated, &stats_.reserved, &stats_.active_blocks,
                    &stats_.segments, &stats_.mapped, &stats_.footprint})
      s->peak = s->current;
    publish_locked(kNoTag, true);
  }
  void set_limit(int64_t bytes) override {
    std::lock_guard lock(mu_);
    limit_ = std::max<int64_t>(bytes, 0);
    publish_locked(kNoTag, true);
  }
  int64_t limit() const override {
    std::lock_guard lock(mu_);
    return limit_;
  }
  std::vector<TagStats> tag_stats() const override {
    std::lock_guard lock(mu_);
    std::vector<TagStats> out;
    for (size_t id = 0; id < tags_.size(); ++id)
      if (tags_[id].seen) out.push_back({tag_name(uint32_t(id)), tags_[id].allocated, tags_[id].mapped});
    return out;
  }
  void reset_tag_peaks() override {
    std::lock_guard lock(mu_);
    for (TagStat& t : tags_) {
      t.allocated.peak = t.allocated.current;
      t.mapped.peak = t.mapped.current;
    }
    for (Stat& c : categories_) c.peak = c.current;
  }
  // Note [category statistics].
  std::array<Stat, kNumCategories> category_stats() const {
    std::lock_guard lock(mu_);
    return categories_;
  }
  void count_mapped(uint32_t tag, int64_t bytes) final {
    std::lock_guard lock(mu_);
    FRUGAL_ASSERT(bytes >= 0 || stats_.mapped.current >= -bytes, "count_mapped: more bytes unmapped (",
                  -bytes, ") than mapped (", stats_.mapped.current, ")");
    add(stats_.mapped, bytes);
    add(stats_.footprint, bytes);
    if (tag >= tags_.size()) tags_.resize(tag + 1);
    see_tag_locked(tag);
    add(tags_[tag].mapped, bytes);
  }
  void retag_mapped(uint32_t from, uint32_t to, int64_t bytes) final {
    std::lock_guard lock(mu_);
    if (std::max(from, to) >= tags_.size()) tags_.resize(std::max(from, to) + 1);
    add(tags_[from].mapped, -bytes);
    see_tag_locked(to);
    add(tags_[to].mapped, bytes);
  }
  void retag(Block* b, uint32_t tag) override {
    std::lock_guard lock(mu_);
    FRUGAL_ASSERT(b != nullptr && b->allocated, "retag: the block is not live");
    if (tag >= tags_.size()) tags_.resize(tag + 1);
    add(tags_[b->tag].allocated, -b->size);
    categories_[tags_[b->tag].category].current -= b->size;
    const uint32_t old_tag = std::exchange(b->tag, tag);
    see_tag_locked(tag);
    add(tags_[tag].allocated, b->size);
    add(categories_[tags_[tag].category], b->size);
    publish_locked(old_tag);
    publish_locked(tag);
    if (history_.on()) [[unlikely]]
      history_.retag(*b, old_tag, stats_.allocated.current, stats_.reserved.current);
  }
  // Publishes this allocator's figures in the process's frugal-smi page from now on (Note [frugal-smi page]
  // in core/smi_page.h); the device registry does, for the allocators it makes.
  void publish_to(smi::SlotWriter writer) {
    std::lock_guard lock(mu_);
    smi_ = writer;
    publish_locked(kNoTag, true);
  }

  // The history (core/memory_history.h). Starting one stamps the blocks live now as its first events.
  // The history of core/memory_history.h. start_history starts a fresh one unless one records, and returns
  // its number (0: one was recording already). stop_history stops the recording if it is number
  // `generation` (0: whichever records).
  uint64_t start_history(size_t max_events) {
    std::lock_guard lock(mu_);
    if (history_.on()) return 0;
    history_.start(max_events, stats_.allocated.current, stats_.reserved.current, live_blocks_locked());
    return ++history_generation_;
  }
  void stop_history(uint64_t generation) {
    std::lock_guard lock(mu_);
    if (generation == 0 || generation == history_generation_) history_.stop();
  }
  bool history_on() const {
    std::lock_guard lock(mu_);
    return history_.on();
  }
  HistoryRecord history() const {
    std::lock_guard lock(mu_);
    return history_.record(device_);
  }

 protected:
  struct TagStat {
    Stat allocated;
    Stat mapped;        // Note [mapped bytes]
    bool seen = false;  // ever had bytes: listed by tag_stats() even once they are all freed
    int8_t listed = smi::SlotWriter::kNotListed;  // its place in the frugal-smi page's top tags
    uint8_t category = uint8_t(Category::Other);  // category_of(its name), set when first seen
  };

  // Marks tag `id` (< tags_.size()) seen, giving it its category the first time: inline, the check alone
  // (it runs at every allocate and free).
  void see_tag_locked(uint32_t id) {
    if (!tags_[id].seen) [[unlikely]]
      first_see_locked(id);
  }
  [[gnu::noinline, gnu::cold]] void first_see_locked(uint32_t id) {
    TagStat& t = tags_[id];
    t.seen = true;
    t.category = uint8_t(category_of(tag_name(id), Phase::Other));
  }

  virtual int64_t largest_free_locked() const = 0;
  virtual std::vector<Block*> live_blocks_locked() const = 0;
  virtual std::vector<BlockInfo> snapshot_locked() const = 0;

  // Records an event in the history, if one records: the one check on the fast path while none does. Called
  // just after the statistics changed, so that every event carries them as they are then.
  void note_block_locked(EventKind kind, Block* b) {
    if (history_.on()) [[unlikely]]
      history_.block(kind, *b, stats_.allocated.current, stats_.reserved.current);
  }
  void note_segment_locked(EventKind kind, const Segment& s) {
    if (history_.on()) [[unlikely]]
      history_.segment(kind, s, stats_.allocated.current, stats_.reserved.current);
  }
  void note_cache_flush_locked() {
    if (history_.on()) [[unlikely]]
      history_.instant(EventKind::CacheFlush, 0, stats_.allocated.current, stats_.reserved.current);
  }
  // Note [out-of-memory dump]: records the OOM and writes the files; what the message adds ("" when no
  // history records).
  std::string oom_dump_locked(int64_t nbytes) {
    if (!history_.on() || simulated_) return "";  // a dry run's failure is an answer, not an incident
    history_.instant(EventKind::Oom, nbytes, stats_.allocated.current, stats_.reserved.current);
    return write_oom_dump(history_.record(device_), snapshot_locked(), stats_locked());
  }

  bool fits_locked(int64_t segment_bytes) const {
    return limit_ <= 0 || stats_.reserved.current + segment_bytes <= limit_;
  }
  void count_segment_locked(int64_t bytes, int sign) {
    add(stats_.reserved, sign * bytes);
    add(stats_.segments, sign);
    ++(sign > 0 ? stats_.num_segment_allocs : stats_.num_segment_frees);
    publish_locked(kNoTag);
  }
  // Accounts a block that has just become live (sign +1) or free (sign -1). A peak can only rise with its
  // value, so a free leaves the peaks alone.
  template <int sign>
  void count_block_locked(const Block* b) {
    static_assert(sign == 1 || sign == -1);
    auto change = [](Stat& s, int64_t delta) {
      if constexpr (sign > 0)
        add(s, delta);
      else
        s.current += delta;
    };
    change(stats_.requested, sign * b->requested);
    change(stats_.allocated, sign * b->size);
    change(stats_.footprint, sign * b->size);
    change(stats_.active_blocks, sign);
    ++(sign > 0 ? stats_.num_allocs : stats_.num_frees);
    if (b->tag >= tags_.size()) [[unlikely]]
      tags_.resize(b->tag + 1);
    see_tag_locked(b->tag);
    TagStat& t = tags_[b->tag];
    change(t.allocated, sign * b->size);
    change(categories_[t.category], sign * b->size);
    // publish_locked(b->tag), without its call and its look-up of the tag, and with only what a block's
    // change moves (reserved and the limit are written at their own changes): this runs at every allocate and
    // free.
    if (smi_.on() && smi_.write_allocated(stats_.allocated.current, stats_.allocated.peak, t.listed,
                                          t.allocated.current)) [[unlikely]]
      publish_top_tags_locked();
  }

  // The figures to the frugal-smi page, if this allocator publishes: after every change, so that the page
  // says what stats() would. The tags are ranked only now and then (Note [frugal-smi page]).
  static constexpr uint32_t kNoTag = UINT32_MAX;  // a change of no tag's bytes
  void publish_locked(uint32_t changed_tag, bool rank_tags = false) {
    if (smi_.on()) publish_on_locked(changed_tag, rank_tags);
  }
  [[gnu::noinline]] void publish_on_locked(uint32_t changed_tag, bool rank_tags) {
    const TagStat* t = changed_tag < tags_.size() ? &tags_[changed_tag] : nullptr;
    const bool due = smi_.write(figures_locked(), t ? t->listed : smi::SlotWriter::kNotListed,
                                t ? t->allocated.current : 0);
    if (due || rank_tags) publish_top_tags_locked();
  }
  smi::Figures figures_locked() const {
    return {stats_.allocated.current, stats_.allocated.peak, stats_.reserved.current, stats_.reserved.peak,
            limit_};
  }
  // Never throws: it runs where the arena must not fail any more (a tag list that could not be made just
  // stays as it was).
  void publish_top_tags_locked() noexcept {
    try {
      std::vector<std::pair<uint32_t, int64_t>> top;
      for (size_t id = 0; id < tags_.size(); ++id)
        if (tags_[id].allocated.current > 0) top.push_back({uint32_t(id), tags_[id].allocated.current});
      const size_t n = std::min<size_t>(top.size(), smi::kTopTags);
      std::partial_sort(top.begin(), top.begin() + n, top.end(),
                        [](const auto& a, const auto& b) { return a.second > b.second; });
      std::vector<smi::TagBytes> named(n);
      for (size_t i = 0; i < n; ++i)
        named[i] = {top[i].first == 0 ? "(untagged)" : tag_name(top[i].first), top[i].second};
      // Nothing below throws: the places the tags are given are the ones the page shows.
      for (TagStat& t : tags_) t.listed = smi::SlotWriter::kNotListed;
      for (size_t i = 0; i < n; ++i) tags_[top[i].first].listed = int8_t(i);
      smi_.write_top_tags(named);
    } catch (...) {
    }
  }

  // Note [failing an allocation]: throws before anything is touched when this allocation is to fail.
  void count_allocation_locked(int64_t nbytes) {
    if (!g_counting_allocations.load(std::memory_order_relaxed)) [[likely]]
      return;
    try {
      detail::count_allocation(device_, kind(), nbytes);
    } catch (const OutOfMemoryError& e) {
      ++stats_.num_ooms;
      if (history_.on()) [[unlikely]]
        throw OutOfMemoryError(e.what() + oom_dump_locked(nbytes));
      throw;
    }
  }

  [[noreturn, gnu::cold, gnu::noinline]] void throw_oom_locked(int64_t nbytes, int64_t segment_bytes,
                                                               bool system_refused) {
    ++stats_.num_ooms;
    const int64_t reserved = stats_.reserved.current, allocated = stats_.allocated.current;
    const std::string limit = limit_ > 0
                                  ? frugal::detail::str_cat(format_bytes(limit_), " (", limit_, " bytes)")
                                  : std::string("none");
    throw OutOfMemoryError(frugal::detail::str_cat(
        "out of memory on ", device_, " (", kind(), " allocator): tried to allocate ", nbytes, " bytes (",
        format_bytes(nbytes), ")",
        segment_bytes > nbytes
            ? frugal::detail::str_cat(", which needs a new segment of ", format_bytes(segment_bytes))
            : std::string(),
        system_refused ? "; the system has no memory left" : "", "; limit ", limit, ", reserved ",
        format_bytes(reserved), ", allocated ", format_bytes(allocated), ", free in cache ",
        format_bytes(reserved - allocated), ".", explain_out_of_memory(live_blocks_locked(), stats_locked()),
        oom_dump_locked(nbytes)));
  }

  BlockInfo info(const Block* b) const {
    return {
        uint64_t(reinterpret_cast<uintptr_t>(b->ptr)),   b->size,  b->requested, b->segment->id, b->allocated,
        b->allocated ? tag_name(b->tag) : std::string(), b->stream};
  }

  // Compares the statistics with the totals recomputed from the blocks (tag_bytes: live bytes per tag id).
  void check_totals_locked(int64_t requested, int64_t allocated, int64_t reserved, int64_t active_blocks,
                           int64_t segments, std::vector<int64_t> tag_bytes) const {
    FRUGAL_ASSERT(stats_.requested.current == requested, "requested ", stats_.requested.current,
                  " != ", requested);
    FRUGAL_ASSERT(stats_.allocated.current == allocated, "allocated ", stats_.allocated.current,
                  " != ", allocated);
    FRUGAL_ASSERT(stats_.reserved.current == reserved, "reserved ", stats_.reserved.current,
                  " != ", reserved);
    FRUGAL_ASSERT(stats_.active_blocks.current == active_blocks, "active blocks ",
                  stats_.active_blocks.current, " != ", active_blocks);
    FRUGAL_ASSERT(stats_.segments.current == segments, "segments ", stats_.segments.current,
                  " != ", segments);
    FRUGAL_ASSERT(stats_.footprint.current == stats_.allocated.current + stats_.mapped.current, "footprint ",
                  stats_.footprint.current, " != allocated ", stats_.allocated.current, " + mapped ",
                  stats_.mapped.current);
    for (const Stat* s : {&stats_.requested, &stats_.allocated, &stats_.reserved, &stats_.active_blocks,
                          &stats_.segments, &stats_.mapped, &stats_.footprint})
      FRUGAL_ASSERT(s->peak >= s->current, "a peak (", s->peak, ") below its current value (", s->current,
                    ")");
    tag_bytes.resize(std::max(tag_bytes.size(), tags_.size()));
    std::array<int64_t, kNumCategories> category_bytes{};
    for (size_t id = 0; id < tag_bytes.size(); ++id) {
      const int64_t counted = id < tags_.size() ? tags_[id].allocated.current : 0;
      FRUGAL_ASSERT(counted == tag_bytes[id], "tag '", tag_name(uint32_t(id)), "': ", counted,
                    " != ", tag_bytes[id]);
      if (id < tags_.size()) category_bytes[tags_[id].category] += counted;
    }
    for (int c = 0; c < kNumCategories; ++c) {
      FRUGAL_ASSERT(categories_[size_t(c)].current == category_bytes[size_t(c)], "category '",
                    category_name(Category(c)), "': ", categories_[size_t(c)].current,
                    " != ", category_bytes[size_t(c)]);
      FRUGAL_ASSERT(categories_[size_t(c)].peak >= categories_[size_t(c)].current, "category '",
                    category_name(Category(c)), "': a peak below its current value");
    }
  }

  // Note [the allocators' lock]. On a cache line of its own: beside the statistics, which every allocate and
  // free writes just before unlocking, a 4 KiB arena pair took 46-48 ns instead of 32-33 (best of 30 runs,
  // alternated).
  alignas(64) mutable AllocatorLock mu_;
  alignas(64) Device device_;
  std::unique_ptr<Backing> backing_;
  int64_t limit_ = 0;  // 0: none
  Stats stats_;
  std::vector<TagStat> tags_;  // by tag id
  // Note [category statistics]: live bytes by Category, each tag's category as category_of decides it from
  // the tag alone (Phase::Other), current and peak since reset_tag_peaks. Exact at every moment, where the
  // sum of a category's tags' peaks over-counts (they peak at different moments). Kept beside the tags'
  // (one more Stat change an allocate or free), so that a program's memory report needs no history.
  std::array<Stat, kNumCategories> categories_{};
  int64_t next_segment_id_ = 0;
  HistoryLog history_;
  uint64_t history_generation_ = 0;  // of the latest history started
  smi::SlotWriter smi_;              // off unless publish_to was called
  bool simulated_ = false;           // Note [a simulated arena]: its allocations are not real ones
};

// The allocator of `device` as the base both allocators share (for the history, which lives there).
AllocatorBase& allocator_base(Device device);

}  // namespace detail
}  // namespace frugal::memory
