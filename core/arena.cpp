// The caching arena (blocks split from and merged back into cached segments, like PyTorch's CUDA caching
// allocator but device-agnostic), the plain system allocator it is compared with, and the aligned host
// backing.
//
// Note [streams and the arena]
// A device such as a GPU runs work asynchronously, in order within a stream but not across streams. A block
// freed by the host may still be read by kernels queued before the free, so reusing it is safe only for work
// queued after those kernels: on the same stream. Hence every segment, and every block carved from it,
// belongs to the stream that was current when the segment was made, and a free block is reused only by an
// allocation on its own stream. A block also used by work on other streams (record_stream, or freed while
// another stream was current) gets an event recorded on each of those streams when it is freed, and stays out
// of the free pools until every event has completed; its bytes stop counting as allocated at the free. When
// memory runs short, the arena first waits for those events, then returns whole free segments to the system
// (which is how memory moves from one stream to another). On the host every block is on stream 0, no event
// is ever recorded, and the algorithm is the plain one; tests/core/test_arena_streams.cpp plays a device with
// several streams on the CPU.
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/memory.h"

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
  Stream stream = 0;           // the segment's: blocks are reused only on it (Note [streams and the arena])
  int pending_events = 0;      // freed, waiting for other streams' work: in no pool, merges with nothing
  std::vector<Stream> uses{};  // other streams that use the live block (record_stream)
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

namespace {

constexpr int64_t kMiB = 1024 * 1024;
constexpr int64_t kMinBlock = 512;                  // every arena block is a multiple of this
constexpr int64_t kSmallRequest = 1 * kMiB;         // requests up to this come from the small pool...
constexpr int64_t kSmallSegment = 2 * kMiB;         // ...carved out of segments of this size
constexpr int64_t kLargeSegment = 20 * kMiB;        // shared by large requests under kLargeSegmentCutoff
constexpr int64_t kLargeSegmentCutoff = 10 * kMiB;  // larger requests get a segment of their own...
constexpr int64_t kLargeRound = 2 * kMiB;           // ...rounded up to this
// A large block is split only if more than this would be left: smaller tails would only fragment the pool.
constexpr int64_t kLargeSplitRemainder = 1 * kMiB;
constexpr int64_t kHostAlign = 64;                 // a cache line, and enough for AVX-512 loads
constexpr int64_t kMaxRequest = int64_t(1) << 56;  // beyond any memory; keeps the rounding from overflowing

// The library's own calls; a program adds its flags for them where it catches the error (examples/).
constexpr const char* kAdvice =
    "free tensors you no longer need, lower the batch size, accumulate gradients over smaller micro-batches "
    "(backward() on each, then one optimizer step), recompute activations in backward (autograd::recompute, "
    "nn::Sequential::recompute_every), run in mixed precision (amp::Autocast), or raise the limit with "
    "memory::set_memory_limit";

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

void add(Stat& s, int64_t delta) {
  s.current += delta;
  s.peak = std::max(s.peak, s.current);
}

class HostBacking final : public Backing {
 public:
  void* alloc(int64_t nbytes) override {
    // aligned_alloc wants a size that is a multiple of the alignment (and 0 bytes would give no usable
    // pointer).
    return std::aligned_alloc(kHostAlign, std::max(kHostAlign, round_up(nbytes, kHostAlign)));
  }
  void free(void* ptr, int64_t) override { std::free(ptr); }
};

// What both allocators share: device, backing, limit, statistics (per device and per tag), the out-of-memory
// error. Subclasses hold mu_ whenever they touch any of it.
class AllocatorBase : public Allocator {
 public:
  AllocatorBase(Device device, std::unique_ptr<Backing> backing)
      : device_(device), backing_(std::move(backing)) {
    FRUGAL_CHECK(backing_ != nullptr, "memory: the allocator of ", device, " needs a backing, got nullptr");
  }

  Stats stats() const override {
    std::lock_guard lock(mu_);
    Stats s = stats_;
    s.largest_free_block = largest_free_locked();
    s.free_bytes = s.reserved.current - s.allocated.current;
    s.fragmentation = s.free_bytes > 0 ? 1.0 - double(s.largest_free_block) / double(s.free_bytes) : 0.0;
    return s;
  }
  void reset_peak() override {
    std::lock_guard lock(mu_);
    for (Stat* s :
         {&stats_.requested, &stats_.allocated, &stats_.reserved, &stats_.active_blocks, &stats_.segments})
      s->peak = s->current;
  }
  void set_limit(int64_t bytes) override {
    std::lock_guard lock(mu_);
    limit_ = std::max<int64_t>(bytes, 0);
  }
  int64_t limit() const override {
    std::lock_guard lock(mu_);
    return limit_;
  }
  std::vector<TagStats> tag_stats() const override {
    std::lock_guard lock(mu_);
    std::vector<TagStats> out;
    for (size_t id = 0; id < tags_.size(); ++id)
      if (tags_[id].seen) out.push_back({tag_name(uint32_t(id)), tags_[id].allocated});
    return out;
  }
  void reset_tag_peaks() override {
    std::lock_guard lock(mu_);
    for (TagStat& t : tags_) t.allocated.peak = t.allocated.current;
  }
  void retag(Block* b, uint32_t tag) override {
    std::lock_guard lock(mu_);
    FRUGAL_ASSERT(b != nullptr && b->allocated, "retag: the block is not live");
    if (tag >= tags_.size()) tags_.resize(tag + 1);
    add(tags_[b->tag].allocated, -b->size);
    b->tag = tag;
    tags_[tag].seen = true;
    add(tags_[tag].allocated, b->size);
  }

 protected:
  struct TagStat {
    Stat allocated;
    bool seen = false;  // ever had bytes: listed by tag_stats() even once they are all freed
  };

  virtual int64_t largest_free_locked() const = 0;

  bool fits_locked(int64_t segment_bytes) const {
    return limit_ <= 0 || stats_.reserved.current + segment_bytes <= limit_;
  }
  void count_segment_locked(int64_t bytes, int sign) {
    add(stats_.reserved, sign * bytes);
    add(stats_.segments, sign);
    ++(sign > 0 ? stats_.num_segment_allocs : stats_.num_segment_frees);
  }
  // Accounts a block that has just become live (sign +1) or free (sign -1).
  void count_block_locked(const Block* b, int sign) {
    add(stats_.requested, sign * b->requested);
    add(stats_.allocated, sign * b->size);
    add(stats_.active_blocks, sign);
    ++(sign > 0 ? stats_.num_allocs : stats_.num_frees);
    if (b->tag >= tags_.size()) tags_.resize(b->tag + 1);
    tags_[b->tag].seen = true;
    add(tags_[b->tag].allocated, sign * b->size);
  }

  // Note [failing an allocation]: throws before anything is touched when this allocation is to fail.
  void count_allocation_locked(int64_t nbytes) {
    try {
      detail::count_allocation(device_, kind(), nbytes);
    } catch (const OutOfMemoryError&) {
      ++stats_.num_ooms;
      throw;
    }
  }

  [[noreturn]] void throw_oom_locked(int64_t nbytes, int64_t segment_bytes, bool system_refused) {
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
        format_bytes(reserved - allocated), ". To fit: ", kAdvice));
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
    for (const Stat* s :
         {&stats_.requested, &stats_.allocated, &stats_.reserved, &stats_.active_blocks, &stats_.segments})
      FRUGAL_ASSERT(s->peak >= s->current, "a peak (", s->peak, ") below its current value (", s->current,
                    ")");
    tag_bytes.resize(std::max(tag_bytes.size(), tags_.size()));
    for (size_t id = 0; id < tag_bytes.size(); ++id) {
      const int64_t counted = id < tags_.size() ? tags_[id].allocated.current : 0;
      FRUGAL_ASSERT(counted == tag_bytes[id], "tag '", tag_name(uint32_t(id)), "': ", counted,
                    " != ", tag_bytes[id]);
    }
  }

  mutable std::mutex mu_;
  Device device_;
  std::unique_ptr<Backing> backing_;
  int64_t limit_ = 0;  // 0: none
  Stats stats_;
  std::vector<TagStat> tags_;  // by tag id
  int64_t next_segment_id_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------
// The caching arena.

class Arena final : public AllocatorBase {
 public:
  using AllocatorBase::AllocatorBase;
  ~Arena() override {
    // Live blocks die with the arena: only tests destroy one (the device registry never does).
    for (const PendingFree& p : pending_) backing_->release_event(p.event);
    for (auto& [id, segment] : segments_) {
      for (Block* b = segment->head; b;) delete std::exchange(b, b->next);
      backing_->free(segment->base, segment->size);
    }
    for (Block* b : spare_blocks_) delete b;
  }

  Allocation allocate(int64_t nbytes) override {
    FRUGAL_CHECK(nbytes >= 0, "memory: cannot allocate a negative number of bytes (", nbytes, ") on ",
                 device_);
    const uint32_t tag = current_tag();
    const Stream stream = backing_->current_stream();
    std::lock_guard lock(mu_);
    count_allocation_locked(nbytes);
    if (nbytes > kMaxRequest) throw_oom_locked(nbytes, 0, false);
    // A new segment and a split need a Block record each: get them now, so that nothing below can fail once
    // the free set or the backing has been touched.
    while (spare_blocks_.size() < 2) spare_blocks_.push_back(new Block);
    const int64_t size = std::max(kMinBlock, round_up(nbytes, kMinBlock));
    const bool small = size <= kSmallRequest;
    FreeSet& pool = small ? small_free_ : large_free_;
    if (!pending_.empty()) process_events_locked(false);

    FreeSet::node_type node;  // reused for the split-off tail, so a split does not allocate a set node
    Block* block = take_free_locked(pool, size, stream, node);
    bool refused = false;
    if (!block) block = new_segment_locked(size, small, stream, refused);
    // Short of memory. Unless the request would not fit under the limit even alone (then the cache stays):
    // wait for the blocks other streams' work holds back, then return the cached segments, retrying each
    // time.
    const int64_t minimal = small ? kSmallSegment : round_up(size, kLargeRound);
    const bool could_fit = limit_ <= 0 || minimal <= limit_;
    if (!block && could_fit && !pending_.empty()) {
      process_events_locked(true);
      block = take_free_locked(pool, size, stream, node);
      if (!block) block = new_segment_locked(size, small, stream, refused);
    }
    if (!block && could_fit) {
      release_free_segments_locked();
      block = new_segment_locked(size, small, stream, refused);
    }
    if (!block) throw_oom_locked(nbytes, minimal, refused);

    const int64_t remainder = block->size - size;
    if (small ? remainder >= kMinBlock : remainder > kLargeSplitRemainder) {
      Block* rest = take_spare_block();
      *rest = Block{.ptr = block->ptr + size,
                    .size = remainder,
                    .segment = block->segment,
                    .prev = block,
                    .next = block->next,
                    .stream = stream};
      if (block->next) block->next->prev = rest;
      block->next = rest;
      block->size = size;
      if (node) {
        node.value() = rest;
        pool.insert(std::move(node));
      } else {
        pool.insert(rest);
      }
    }
    block->allocated = true;
    block->requested = nbytes;
    block->tag = tag;
    count_block_locked(block, +1);
    return {block->ptr, block->size, block};
  }

  void deallocate(Block* block) override {
    if (!block) return;
    const Stream current = backing_->current_stream();
    std::lock_guard lock(mu_);
    FRUGAL_ASSERT(block->allocated, "deallocate of a block that is not live (freed twice?)");
    count_block_locked(block, -1);
    block->allocated = false;
    block->requested = 0;
    block->tag = 0;
    // Freed while another stream is current: that stream may have queued work on the block too.
    if (current != block->stream) add_use(block, current);
    for (Stream s : block->uses) {
      if (Event e = backing_->record_event(s)) {
        pending_.push_back({e, block});
        ++block->pending_events;
      }
    }
    block->uses.clear();
    if (block->pending_events == 0) insert_free_locked(block);
  }

  void record_stream(Block* block, Stream stream) override {
    std::lock_guard lock(mu_);
    FRUGAL_ASSERT(block != nullptr && block->allocated, "record_stream: the block is not live");
    if (stream != block->stream) add_use(block, stream);
  }

  void empty_cache() override {
    std::lock_guard lock(mu_);
    process_events_locked(
        true);  // blocks waiting for other streams come back first, so their segments can go
    release_free_segments_locked();
  }

  std::vector<BlockInfo> snapshot() const override {
    std::lock_guard lock(mu_);
    std::vector<BlockInfo> out;
    for (const auto& [id, segment] : segments_)
      for (const Block* b = segment->head; b; b = b->next) out.push_back(info(b));
    return out;
  }

  void check_invariants() const override {
    std::lock_guard lock(mu_);
    int64_t requested = 0, allocated = 0, reserved = 0, active = 0, free_blocks = 0;
    std::vector<int64_t> tag_bytes;
    for (const auto& [id, segment] : segments_) {
      const Segment* s = segment.get();
      FRUGAL_ASSERT(s->id == id && s->head && !s->head->prev, "segment ", id, ": bad header");
      const char* cursor = s->base;
      for (const Block* b = s->head; b; b = b->next) {
        FRUGAL_ASSERT(b->segment == s, "segment ", id, ": a block points to another segment");
        FRUGAL_ASSERT(b->stream == s->stream, "segment ", id, ": a block on another stream than its segment");
        FRUGAL_ASSERT(b->ptr == cursor, "segment ", id, ": a block at offset ", b->ptr - s->base,
                      " instead of ", cursor - s->base, " (overlap or gap)");
        FRUGAL_ASSERT(b->size >= kMinBlock && b->size % kMinBlock == 0, "segment ", id, ": a block of ",
                      b->size, " bytes");
        FRUGAL_ASSERT(!b->next || b->next->prev == b, "segment ", id, ": broken prev link");
        cursor += b->size;
        if (b->allocated) {
          FRUGAL_ASSERT(b->requested <= b->size, "segment ", id, ": a block smaller than its request");
          FRUGAL_ASSERT(b->pending_events == 0, "segment ", id, ": a live block waiting for events");
          requested += b->requested;
          allocated += b->size;
          ++active;
          if (b->tag >= tag_bytes.size()) tag_bytes.resize(b->tag + 1);
          tag_bytes[b->tag] += b->size;
        } else if (b->pending_events > 0) {
          int64_t events = 0;
          for (const PendingFree& p : pending_) events += p.block == b;
          FRUGAL_ASSERT(events == b->pending_events, "segment ", id, ": a block waits for ",
                        b->pending_events, " events, ", events, " are pending");
          FRUGAL_ASSERT(pool_of(s).count(const_cast<Block*>(b)) == 0, "segment ", id,
                        ": a block waiting for events is in a pool");
        } else {
          FRUGAL_ASSERT(!is_free(b->next), "segment ", id, ": two adjacent free blocks not merged");
          FRUGAL_ASSERT(pool_of(s).count(const_cast<Block*>(b)) == 1, "segment ", id,
                        ": a free block missing from its pool");
          ++free_blocks;
        }
      }
      FRUGAL_ASSERT(cursor == s->base + s->size, "segment ", id, ": blocks cover ", cursor - s->base, " of ",
                    s->size, " bytes");
      reserved += s->size;
    }
    FRUGAL_ASSERT(int64_t(small_free_.size() + large_free_.size()) == free_blocks, "the free pools hold ",
                  small_free_.size() + large_free_.size(), " blocks, the segments ", free_blocks);
    check_totals_locked(requested, allocated, reserved, active, int64_t(segments_.size()),
                        std::move(tag_bytes));
  }

  const char* kind() const override { return "arena"; }

 private:
  // Free pools are ordered by stream, then size, then address: a lookup finds the best fit on one stream.
  struct ByStreamSizeAddress {
    bool operator()(const Block* a, const Block* b) const {
      if (a->stream != b->stream) return a->stream < b->stream;
      return a->size != b->size ? a->size < b->size : std::less<const char*>()(a->ptr, b->ptr);
    }
  };
  using FreeSet = std::set<Block*, ByStreamSizeAddress>;
  struct PendingFree {
    Event event;
    Block* block;
  };

  static bool is_free(const Block* b) { return b && !b->allocated && b->pending_events == 0; }
  static void add_use(Block* b, Stream s) {
    if (std::find(b->uses.begin(), b->uses.end(), s) == b->uses.end()) b->uses.push_back(s);
  }

  // Best fit on `stream`: the smallest free block that is big enough, the lowest address among equals; null
  // when there is none. The block's set node is moved into `node`.
  Block* take_free_locked(FreeSet& pool, int64_t size, Stream stream, FreeSet::node_type& node) {
    Block key;
    key.size = size;
    key.stream = stream;
    auto it = pool.lower_bound(&key);
    if (it == pool.end() || (*it)->stream != stream) return nullptr;
    node = pool.extract(it);
    return node.value();
  }

  // Puts a block that has just become free into its pool, merged with its free neighbours.
  void insert_free_locked(Block* block) {
    FreeSet& pool = pool_of(block->segment);
    FreeSet::node_type node;  // a neighbour's set node, reused for the merged block
    if (Block* prev = block->prev; is_free(prev)) {
      node = pool.extract(prev);  // before its size changes: the set is ordered by size
      prev->size += block->size;
      unlink(block);
      block = prev;
    }
    if (Block* next = block->next; is_free(next)) {
      auto next_node = pool.extract(next);
      if (!node) node = std::move(next_node);
      block->size += next->size;
      unlink(next);
    }
    if (node) {
      node.value() = block;
      pool.insert(std::move(node));
    } else {
      pool.insert(block);
    }
  }

  // Returns the blocks whose events have all completed to the free pools; with `wait`, waits for every event
  // first.
  void process_events_locked(bool wait) {
    size_t kept = 0;
    for (const PendingFree& p : pending_) {
      if (wait) backing_->wait_event(p.event);
      if (!wait && !backing_->event_done(p.event)) {
        pending_[kept++] = p;
        continue;
      }
      backing_->release_event(p.event);
      if (--p.block->pending_events == 0) insert_free_locked(p.block);
    }
    pending_.resize(kept);
  }

  FreeSet& pool_of(const Segment* s) { return s->small ? small_free_ : large_free_; }
  const FreeSet& pool_of(const Segment* s) const { return s->small ? small_free_ : large_free_; }

  Block* take_spare_block() {
    Block* b = spare_blocks_.back();
    spare_blocks_.pop_back();
    return b;
  }
  // Removes b (free, not in a pool, already absorbed by its predecessor) from its segment's list.
  void unlink(Block* b) {
    b->prev->next = b->next;
    if (b->next) b->next->prev = b->prev;
    spare_blocks_.push_back(b);
  }

  // A fresh segment on `stream` for a request of size bytes, as one free block that is in no pool yet, or
  // null (refused set when the backing said no). Under a limit, or when the backing refuses, it falls back to
  // the smallest segment that holds the request. The caller frees the cache and tries again before giving up.
  Block* new_segment_locked(int64_t size, bool small, Stream stream, bool& refused) {
    const int64_t preferred = small                        ? kSmallSegment
                              : size < kLargeSegmentCutoff ? kLargeSegment
                                                           : round_up(size, kLargeRound);
    const int64_t minimal = small ? kSmallSegment : round_up(size, kLargeRound);
    for (int64_t bytes : {preferred, minimal}) {
      if (!fits_locked(bytes)) continue;
      if (void* ptr = backing_->alloc(bytes))
        return add_segment_locked(static_cast<char*>(ptr), bytes, small, stream);
      refused = true;
      if (minimal == preferred) break;  // the same request again would be refused again
    }
    return nullptr;
  }

  Block* add_segment_locked(char* base, int64_t bytes, bool small, Stream stream) {
    auto segment = std::make_unique<Segment>(Segment{.id = next_segment_id_++,
                                                     .base = base,
                                                     .size = bytes,
                                                     .small = small,
                                                     .head = take_spare_block(),
                                                     .stream = stream});
    *segment->head = Block{.ptr = base, .size = bytes, .segment = segment.get(), .stream = stream};
    Block* head = segment->head;
    segments_.emplace(segment->id, std::move(segment));
    count_segment_locked(bytes, +1);
    return head;
  }

  // Returns every segment that is one free block to the backing. Counts as a cache flush.
  void release_free_segments_locked() {
    ++stats_.num_cache_flushes;
    for (auto it = segments_.begin(); it != segments_.end();) {
      Segment* s = it->second.get();
      if (!is_free(s->head) || s->head->next) {
        ++it;
        continue;
      }
      pool_of(s).erase(s->head);
      spare_blocks_.push_back(s->head);
      backing_->free(s->base, s->size);
      count_segment_locked(s->size, -1);
      it = segments_.erase(it);
    }
  }

  int64_t largest_free_locked() const override {
    int64_t largest = 0;
    for (const FreeSet* pool : {&small_free_, &large_free_})
      if (!pool->empty()) largest = std::max(largest, (*pool->rbegin())->size);
    return largest;
  }

  FreeSet small_free_, large_free_;
  std::map<int64_t, std::unique_ptr<Segment>> segments_;  // by id: oldest first in snapshots
  std::vector<Block*> spare_blocks_;                      // recycled Block records
  std::vector<PendingFree> pending_;                      // events freed blocks wait for, oldest first
};

// ---------------------------------------------------------------------------------------------------------------
// The system allocator: one backing call per allocation, nothing cached. The baseline the arena is measured
// against, and a way (FRUGAL_ALLOCATOR=system) to let tools such as AddressSanitizer see every block.

class SystemAllocator final : public AllocatorBase {
 public:
  using AllocatorBase::AllocatorBase;
  ~SystemAllocator() override {
    for (auto& [id, segment] : live_) {
      backing_->free(segment->base, segment->size);
      delete segment->head;
    }
  }

  Allocation allocate(int64_t nbytes) override {
    FRUGAL_CHECK(nbytes >= 0, "memory: cannot allocate a negative number of bytes (", nbytes, ") on ",
                 device_);
    const uint32_t tag = current_tag();
    std::lock_guard lock(mu_);
    count_allocation_locked(nbytes);
    if (nbytes > kMaxRequest) throw_oom_locked(nbytes, 0, false);
    const int64_t size = std::max(kHostAlign, round_up(nbytes, kHostAlign));
    if (!fits_locked(size)) throw_oom_locked(nbytes, size, false);
    auto* base = static_cast<char*>(backing_->alloc(size));
    if (!base) throw_oom_locked(nbytes, size, true);
    auto segment = std::make_unique<Segment>(Segment{.id = next_segment_id_++, .base = base, .size = size});
    segment->head = new Block{.ptr = base,
                              .size = size,
                              .requested = nbytes,
                              .segment = segment.get(),
                              .tag = tag,
                              .allocated = true};
    Block* block = segment->head;
    live_.emplace(segment->id, std::move(segment));
    count_segment_locked(size, +1);
    count_block_locked(block, +1);
    return {base, size, block};
  }

  void deallocate(Block* block) override {
    if (!block) return;
    std::lock_guard lock(mu_);
    auto it = live_.find(block->segment->id);
    FRUGAL_ASSERT(it != live_.end() && it->second->head == block, "deallocate of a block that is not live");
    count_block_locked(block, -1);
    count_segment_locked(block->size, -1);
    backing_->free(block->ptr, block->size);
    delete block;
    live_.erase(it);
  }

  // The backing's free returns the memory at once: cudaFree waits for the device, so no stream needs fencing.
  void record_stream(Block*, Stream) override {}

  void empty_cache() override {}  // nothing is cached

  std::vector<BlockInfo> snapshot() const override {
    std::lock_guard lock(mu_);
    std::vector<BlockInfo> out;
    for (const auto& [id, segment] : live_) out.push_back(info(segment->head));
    return out;
  }

  void check_invariants() const override {
    std::lock_guard lock(mu_);
    int64_t requested = 0, allocated = 0;
    std::vector<int64_t> tag_bytes;
    for (const auto& [id, segment] : live_) {
      const Block* b = segment->head;
      FRUGAL_ASSERT(b && b->allocated && b->segment == segment.get() && b->ptr == segment->base &&
                        b->size == segment->size && !b->prev && !b->next && b->requested <= b->size,
                    "system allocation ", id, ": block and segment disagree");
      requested += b->requested;
      allocated += b->size;
      if (b->tag >= tag_bytes.size()) tag_bytes.resize(b->tag + 1);
      tag_bytes[b->tag] += b->size;
    }
    const auto n = int64_t(live_.size());
    check_totals_locked(requested, allocated, allocated, n, n, std::move(tag_bytes));
  }

  const char* kind() const override { return "system"; }

 private:
  int64_t largest_free_locked() const override { return 0; }

  std::map<int64_t, std::unique_ptr<Segment>> live_;  // one segment per live block, by id
};

}  // namespace

std::unique_ptr<Allocator> make_arena(Device device, std::unique_ptr<Backing> backing) {
  return std::make_unique<Arena>(device, std::move(backing));
}

std::unique_ptr<Allocator> make_system_allocator(Device device, std::unique_ptr<Backing> backing) {
  return std::make_unique<SystemAllocator>(device, std::move(backing));
}

std::unique_ptr<Backing> make_host_backing() { return std::make_unique<HostBacking>(); }

}  // namespace frugal::memory
