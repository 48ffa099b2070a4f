// The caching arena (blocks split from and merged back into cached segments, like PyTorch's CUDA caching
// allocator but device-agnostic), the plain system allocator it is compared with, and the aligned host
// backing.
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
};

// One backing allocation. The arena carves it into blocks; the system allocator holds one block per segment.
struct Segment {
  int64_t id = 0;
  char* base = nullptr;
  int64_t size = 0;
  bool small = false;  // which pool its free blocks go to
  Block* head = nullptr;
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

constexpr const char* kAdvice =
    "free tensors you no longer need, lower the batch size, use gradient accumulation (--accum) or recompute "
    "segments (--recompute), or raise the limit with memory::set_memory_limit";

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

  [[noreturn]] void throw_oom_locked(int64_t nbytes, int64_t segment_bytes, bool system_refused) {
    ++stats_.num_ooms;
    const int64_t reserved = stats_.reserved.current, allocated = stats_.allocated.current;
    const std::string limit =
        limit_ > 0 ? detail::str_cat(format_bytes(limit_), " (", limit_, " bytes)") : std::string("none");
    throw OutOfMemoryError(
        detail::str_cat("out of memory on ", device_, " (", kind(), " allocator): tried to allocate ", nbytes,
                        " bytes (", format_bytes(nbytes), ")",
                        segment_bytes > nbytes
                            ? detail::str_cat(", which needs a new segment of ", format_bytes(segment_bytes))
                            : std::string(),
                        system_refused ? "; the system has no memory left" : "", "; limit ", limit,
                        ", reserved ", format_bytes(reserved), ", allocated ", format_bytes(allocated),
                        ", free in cache ", format_bytes(reserved - allocated), ". To fit: ", kAdvice));
  }

  BlockInfo info(const Block* b) const {
    return {
        uint64_t(reinterpret_cast<uintptr_t>(b->ptr)),  b->size, b->requested, b->segment->id, b->allocated,
        b->allocated ? tag_name(b->tag) : std::string()};
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
    std::lock_guard lock(mu_);
    if (nbytes > kMaxRequest) throw_oom_locked(nbytes, 0, false);
    // A new segment and a split need a Block record each: get them now, so that nothing below can fail once
    // the free set or the backing has been touched.
    while (spare_blocks_.size() < 2) spare_blocks_.push_back(new Block);
    const int64_t size = std::max(kMinBlock, round_up(nbytes, kMinBlock));
    const bool small = size <= kSmallRequest;
    FreeSet& pool = small ? small_free_ : large_free_;

    // Best fit: the smallest free block that is big enough, the lowest address among equals.
    Block key;
    key.size = size;
    FreeSet::node_type node;  // reused for the split-off tail, so a split does not allocate a set node
    Block* block;
    if (auto it = pool.lower_bound(&key); it != pool.end()) {
      node = pool.extract(it);
      block = node.value();
    } else {
      block = new_segment_locked(size, nbytes, small);
    }

    const int64_t remainder = block->size - size;
    if (small ? remainder >= kMinBlock : remainder > kLargeSplitRemainder) {
      Block* rest = take_spare_block();
      *rest = Block{block->ptr + size, remainder, 0, block->segment, block, block->next, 0, false};
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
    std::lock_guard lock(mu_);
    FRUGAL_ASSERT(block->allocated, "deallocate of a block that is not live (freed twice?)");
    count_block_locked(block, -1);
    block->allocated = false;
    block->requested = 0;
    block->tag = 0;
    FreeSet& pool = pool_of(block->segment);
    FreeSet::node_type node;  // a neighbour's set node, reused for the merged block
    if (Block* prev = block->prev; prev && !prev->allocated) {
      node = pool.extract(prev);  // before its size changes: the set is ordered by size
      prev->size += block->size;
      unlink(block);
      block = prev;
    }
    if (Block* next = block->next; next && !next->allocated) {
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

  void empty_cache() override {
    std::lock_guard lock(mu_);
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
        FRUGAL_ASSERT(b->ptr == cursor, "segment ", id, ": a block at offset ", b->ptr - s->base,
                      " instead of ", cursor - s->base, " (overlap or gap)");
        FRUGAL_ASSERT(b->size >= kMinBlock && b->size % kMinBlock == 0, "segment ", id, ": a block of ",
                      b->size, " bytes");
        FRUGAL_ASSERT(!b->next || b->next->prev == b, "segment ", id, ": broken prev link");
        cursor += b->size;
        if (b->allocated) {
          FRUGAL_ASSERT(b->requested <= b->size, "segment ", id, ": a block smaller than its request");
          requested += b->requested;
          allocated += b->size;
          ++active;
          if (b->tag >= tag_bytes.size()) tag_bytes.resize(b->tag + 1);
          tag_bytes[b->tag] += b->size;
        } else {
          FRUGAL_ASSERT(!b->next || b->next->allocated, "segment ", id,
                        ": two adjacent free blocks not merged");
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
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : std::less<const char*>()(a->ptr, b->ptr);
    }
  };
  using FreeSet = std::set<Block*, BySizeThenAddress>;

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

  // A fresh segment for a request of size bytes, as one free block that is in no pool yet. Under a limit, or
  // when the backing refuses, it falls back to the smallest segment that holds the request, then empties the
  // cache and tries both again; only then is the request out of memory.
  Block* new_segment_locked(int64_t size, int64_t nbytes, bool small) {
    const int64_t preferred = small                        ? kSmallSegment
                              : size < kLargeSegmentCutoff ? kLargeSegment
                                                           : round_up(size, kLargeRound);
    const int64_t minimal = small ? kSmallSegment : round_up(size, kLargeRound);
    bool refused = false;
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (attempt == 1) {
        if (limit_ > 0 && minimal > limit_) break;  // would not fit even alone: keep the cache
        release_free_segments_locked();
      }
      for (int64_t bytes : {preferred, minimal}) {
        if (!fits_locked(bytes)) continue;
        if (void* ptr = backing_->alloc(bytes))
          return add_segment_locked(static_cast<char*>(ptr), bytes, small);
        refused = true;
        if (minimal == preferred) break;  // the same request again would be refused again
      }
    }
    throw_oom_locked(nbytes, minimal, refused);
  }

  Block* add_segment_locked(char* base, int64_t bytes, bool small) {
    auto segment =
        std::make_unique<Segment>(Segment{next_segment_id_++, base, bytes, small, take_spare_block()});
    *segment->head = Block{base, bytes, 0, segment.get(), nullptr, nullptr, 0, false};
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
      if (s->head->allocated || s->head->next) {
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
    if (nbytes > kMaxRequest) throw_oom_locked(nbytes, 0, false);
    const int64_t size = std::max(kHostAlign, round_up(nbytes, kHostAlign));
    if (!fits_locked(size)) throw_oom_locked(nbytes, size, false);
    auto* base = static_cast<char*>(backing_->alloc(size));
    if (!base) throw_oom_locked(nbytes, size, true);
    auto segment = std::make_unique<Segment>(Segment{next_segment_id_++, base, size, false, nullptr});
    segment->head = new Block{base, size, nbytes, segment.get(), nullptr, nullptr, tag, true};
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
