// The caching arena: blocks split from and merged back into cached segments, like PyTorch's CUDA caching
// allocator but device-agnostic. What it shares with the system allocator is in core/allocator_base.h.

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
#include <array>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "core/allocator_base.h"

// Note [the arena under AddressSanitizer]
// ASan sees a segment as one allocation, so a kernel that reads or writes past its tensor's last byte stays
// inside the segment and unseen: the block's round-up to kMinBlock, its neighbours and the cached free blocks
// are all addressable. In a build with ASan, a host arena therefore poisons what no live tensor may touch
// (ASAN_POISON_MEMORY_REGION): a new segment whole, a block's tail past the bytes it was asked for, and a
// block when it is freed; an allocation unpoisons its requested bytes, and a segment is unpoisoned before it
// goes back to the backing. Only for the CPU's memory: a GPU's addresses and the meta device's (a dry run,
// core/estimate.cpp) have no shadow to write. Elsewhere the calls compile to nothing.
#if defined(__SANITIZE_ADDRESS__)
#define FRUGAL_ARENA_POISONS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FRUGAL_ARENA_POISONS 1
#endif
#endif
#ifdef FRUGAL_ARENA_POISONS
#include <sanitizer/asan_interface.h>
#endif

namespace frugal::memory {
namespace {

using namespace detail;

constexpr int64_t kMinBlock = 512;  // every arena block is a multiple of this
// kSmallRequest (core/allocator_base.h): requests up to it come from the small pool...
constexpr int64_t kSmallSegment = 2 * kMiB;         // ...carved out of segments of this size
constexpr int64_t kLargeSegment = 20 * kMiB;        // shared by large requests under kLargeSegmentCutoff
constexpr int64_t kLargeSegmentCutoff = 10 * kMiB;  // larger requests get a segment of their own...
constexpr int64_t kLargeRound = 2 * kMiB;           // ...rounded up to this
// kLargeSplitRemainder (core/allocator_base.h): a large block is split only if more than it would be left.

class Arena final : public AllocatorBase {
 public:
  using AllocatorBase::AllocatorBase;
  ~Arena() override {
    // Live blocks die with the arena: only tests destroy one (the device registry never does).
    for (const PendingFree& p : pending_) backing_->release_event(p.event);
    for (auto& [id, segment] : segments_) {
      for (Block* b = segment->head; b;) delete std::exchange(b, b->next);
      unpoison(segment->base, segment->size);
      backing_->free(segment->base, segment->size);
    }
    for (Block* b : spare_blocks_) delete b;
  }

  Allocation allocate(int64_t nbytes) override {
    FRUGAL_CHECK(nbytes >= 0, "memory: cannot allocate a negative number of bytes (", nbytes, ") on ",
                 device_);
    const uint32_t tag = t_current_tag;
    const char* op = current_op();
    const Phase phase = thread_phase();
    const Stream stream = current_stream();
    std::lock_guard lock(mu_);
    if (!simulated_) count_allocation_locked(nbytes);  // Note [failing an allocation]: real ones only
    if (nbytes > kMaxRequest) throw_oom_locked(nbytes, 0, false);
    const int64_t size = std::max(kMinBlock, round_up(nbytes, kMinBlock));
    Block* block = size <= kSmallRequest && pending_.empty() ? take_binned_locked(size, stream) : nullptr;
    if (!block) [[unlikely]]
      block = take_unbinned_locked(nbytes, size, stream);
    block->allocated = true;
    block->requested = nbytes;
    block->tag = tag;
    block->phase = phase;
    block->op = op;
    count_block_locked<+1>(block);
    note_block_locked(EventKind::Alloc, block);
    unpoison(block->ptr, nbytes);  // Note [the arena under AddressSanitizer]
    poison(static_cast<char*>(block->ptr) + nbytes, block->size - nbytes);
    return {block->ptr, block->size, block};
  }

  void deallocate(Block* block) override {
    if (!block) return;
    const Stream current = current_stream();
    std::lock_guard lock(mu_);
    FRUGAL_ASSERT(block->allocated, "deallocate of a block that is not live (freed twice?)");
    count_block_locked<-1>(block);
    note_block_locked(EventKind::Free, block);
    block->allocated = false;
    block->requested = 0;
    block->tag = 0;
    poison(block->ptr, block->size);
    // Freed while another stream is current: that stream may have queued work on the block too.
    if (current != block->stream) add_use(block, current);
    for (Stream s : block->uses) {
      if (Event e = backing_->record_event(s)) {
        pending_.push_back({e, block});
        ++block->pending_events;
      }
    }
    block->uses.clear();
    if (block->pending_events > 0) return;
    if (block->segment->small)
      bin_locked(block);
    else
      insert_free_locked(block);
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

  void check_invariants() const override {
    std::lock_guard lock(mu_);
    int64_t requested = 0, allocated = 0, reserved = 0, active = 0, free_blocks = 0, binned_blocks = 0;
    std::set<const Block*> binned_seen;  // the bins may point only at these
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
        FRUGAL_ASSERT(b->binned || b->bin_next == nullptr, "segment ", id,
                      ": a block not binned has a bin link");
        if (b->binned) binned_seen.insert(b);
        if (b->allocated) {
          FRUGAL_ASSERT(!b->binned, "segment ", id, ": a live block marked binned");
          FRUGAL_ASSERT(b->requested <= b->size, "segment ", id, ": a block smaller than its request");
          FRUGAL_ASSERT(b->pending_events == 0, "segment ", id, ": a live block waiting for events");
          requested += b->requested;
          allocated += b->size;
          ++active;
          if (b->tag >= tag_bytes.size()) tag_bytes.resize(b->tag + 1);
          tag_bytes[b->tag] += b->size;
        } else if (b->binned) {
          FRUGAL_ASSERT(s->small && b->pending_events == 0, "segment ", id,
                        ": a binned block in a large segment or waiting for events");
          FRUGAL_ASSERT(pool_of(s).count(const_cast<Block*>(b)) == 0, "segment ", id,
                        ": a binned block is in a pool");
          ++binned_blocks;
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
    int64_t in_bins = 0;
    for (int i = 0; i < int(bin_bits_.size()) * 64; ++i) {
      const bool marked = (bin_bits_[i / 64] >> (i % 64)) & 1;
      FRUGAL_ASSERT(marked == (i < kBins && bins_[i] != nullptr), "bin ", i, ": marked ",
                    marked ? "full" : "empty", " but is not");
      if (i >= kBins) continue;
      // Each entry must be a binned block of a live segment (checked before it is read), and a walk longer
      // than the count is a cycle.
      for (const Block* b = bins_[i]; b; b = b->bin_next, ++in_bins) {
        FRUGAL_ASSERT(binned_seen.count(b) == 1 && in_bins < binned_, "bin ", i,
                      ": links to a block that no segment holds as binned, or loops");
        FRUGAL_ASSERT(b->size == i * kMinBlock, "bin ", i, ": holds a block of ", b->size, " bytes");
      }
    }
    FRUGAL_ASSERT(in_bins == binned_blocks && in_bins == binned_, "the bins hold ", in_bins,
                  " blocks, the segments ", binned_blocks, ", the count says ", binned_);
    check_totals_locked(requested, allocated, reserved, active, int64_t(segments_.size()),
                        std::move(tag_bytes));
  }

  const char* kind() const override { return "arena"; }

  // Note [a simulated arena]: this arena becomes the copy of `source`'s segments, blocks, free pools,
  // statistics and tags (over its own backing's addresses), its live blocks held by nobody: they stay live
  // until this arena dies. The peaks start at the current values; returns the bytes of those live blocks.
  int64_t copy_layout_from(const Arena& source) {
    std::scoped_lock lock(mu_, source.mu_);
    FRUGAL_ASSERT(segments_.empty() && simulated_,
                  "copy_layout_from: the arena is not an empty simulated one");
    std::map<const Block*, Block*> copy_of;  // for the bins
    std::vector<Block*> waited;              // blocks that wait for events there
    for (const auto& [id, from] : source.segments_) {
      char* base = static_cast<char*>(backing_->alloc(from->size));
      FRUGAL_ASSERT(base != nullptr, "copy_layout_from: the simulated backing refused ", from->size,
                    " bytes");
      auto segment = std::make_unique<Segment>(*from);
      segment->base = base;
      Block* prev = nullptr;
      for (const Block* b = from->head; b; b = b->next) {
        Block* copy = new Block(*b);
        copy->ptr = base + (b->ptr - from->base);
        copy->segment = segment.get();
        copy->prev = prev;
        copy->next = nullptr;
        copy->uses.clear();
        copy->bin_next = nullptr;
        (prev ? prev->next : segment->head) = copy;
        prev = copy;
        if (b->binned) copy_of[b] = copy;
        if (b->pending_events > 0) waited.push_back(copy);
        if (is_free(b)) pool_of(segment.get()).insert(copy);
      }
      segments_.emplace(id, std::move(segment));
    }
    // The bins in their order (Note [exact-fit bins]); a block that waits for another stream counts as free
    // here, merged with its free neighbours as it will be once its events complete.
    for (int i = 0; i < kBins; ++i) {
      Block** tail = &bins_[i];
      for (const Block* b = source.bins_[i]; b; b = b->bin_next, tail = &(*tail)->bin_next)
        *tail = copy_of.at(b);
    }
    bin_bits_ = source.bin_bits_;
    binned_ = source.binned_;
    for (Block* b : waited) {
      b->pending_events = 0;
      insert_free_locked(b);
    }
    next_segment_id_ = source.next_segment_id_;
    limit_ = source.limit_;
    stats_ = source.stats_;
    for (Stat* st : {&stats_.requested, &stats_.allocated, &stats_.reserved, &stats_.active_blocks,
                     &stats_.segments, &stats_.mapped, &stats_.footprint})
      st->peak = st->current;
    tags_ = source.tags_;
    categories_ = source.categories_;
    for (TagStat& t : tags_) {
      t.allocated.peak = t.allocated.current;
      t.mapped.peak = t.mapped.current;
    }
    return stats_.allocated.current;
  }
  void mark_simulated() { simulated_ = true; }

 private:
  // Note [the arena under AddressSanitizer]: n bytes at p become unaddressable (poison) or addressable.
  void poison([[maybe_unused]] const void* p, [[maybe_unused]] int64_t n) const {
#ifdef FRUGAL_ARENA_POISONS
    if (n > 0 && device_.is_cpu() && !simulated_) ASAN_POISON_MEMORY_REGION(p, size_t(n));
#endif
  }
  void unpoison([[maybe_unused]] const void* p, [[maybe_unused]] int64_t n) const {
#ifdef FRUGAL_ARENA_POISONS
    if (n > 0 && device_.is_cpu() && !simulated_) ASAN_UNPOISON_MEMORY_REGION(p, size_t(n));
#endif
  }

  // Free pools are ordered by stream, then size, then segment (oldest first) and address within it: a lookup
  // finds the best fit on one stream. Note [the arena's choices do not depend on addresses]: among equals
  // the order is that of the segments' ids, not of the addresses the backing returned, so the arena makes
  // the same choices for the same requests whatever the system hands out, and a simulation over virtual
  // addresses (the meta device's, core/estimate.cpp) reproduces it exactly.
  // A lookup's key is the sort key alone (a Block on the stack would construct and destroy its vector).
  struct FreeKey {
    Stream stream;
    int64_t size;
    int64_t segment;  // id; -1 sorts before every segment
    const char* ptr;
  };
  static FreeKey key_of(const Block* b) { return {b->stream, b->size, b->segment->id, b->ptr}; }
  struct ByStreamSizeSegment {
    using is_transparent = void;
    static bool less(const FreeKey& a, const FreeKey& b) {
      if (a.stream != b.stream) return a.stream < b.stream;
      if (a.size != b.size) return a.size < b.size;
      if (a.segment != b.segment) return a.segment < b.segment;
      return std::less<const char*>()(a.ptr, b.ptr);
    }
    bool operator()(const Block* a, const Block* b) const { return less(key_of(a), key_of(b)); }
    bool operator()(const Block* a, const FreeKey& b) const { return less(key_of(a), b); }
    bool operator()(const FreeKey& a, const Block* b) const { return less(a, key_of(b)); }
  };
  using FreeSet = std::set<Block*, ByStreamSizeSegment>;
  struct PendingFree {
    Event event;
    Block* block;
  };

  Stream current_stream() const { return streams_ ? backing_->current_stream() : 0; }
  // Free and in a pool (not binned, not waiting for events): what a freed block merges with.
  static bool is_free(const Block* b) { return b && !b->allocated && b->pending_events == 0 && !b->binned; }
  static void add_use(Block* b, Stream s) {
    if (std::find(b->uses.begin(), b->uses.end(), s) == b->uses.end()) b->uses.push_back(s);
  }

  // Note [blocks change in place]: a training step allocates and frees the same sizes over and over, and
  // each pair splits a free block and merges the piece back. Done with the free pools' set operations (take
  // the block out, put the rest in; take the rest out, put the merged block in), that was four rebalancing
  // tree updates a pair, most of its time. Instead the free block's record stays in its pool and changes in
  // place: a split gives the front to a fresh record and leaves the record with the tail (smaller, at a
  // higher address), a merge grows the free neighbour's record. The set is ordered by (stream, size,
  // segment, address); a record that got smaller still sorts after everything its successor sorts after, so
  // it stays where it is if it still sorts after its predecessor (and symmetrically for one that grew); only
  // otherwise does it move (reposition_locked). The blocks, their sizes and addresses, and so every choice
  // the arena makes, are the same as before: only which record stands for a free block differs.

  // Note [exact-fit bins]: a training step repeats its allocations, the same sizes in the same order step
  // after step, and most of them small. So a freed small block goes to the bin of its size, a LIFO list (one
  // per multiple of kMinBlock up to kSmallRequest), as it is, not merged with its neighbours; an allocation
  // of that size on the block's stream takes the newest one back: no tree walk, no split, no merge. A 4 KiB
  // allocate/free pair went from 26-29 ns to 15-17 (glibc's malloc: 14.5-16 ns in the same runs; AMD EPYC
  // Zen 4), and to 14.0 once the statistics stored a peak only when passed (add, core/allocator_base.h). A
  // small request that its bin cannot serve first merges every binned block back into the pool (as glibc
  // consolidates its fast bins), and then takes the best fit as always, from a pool in which no two free
  // blocks are adjacent: no segment is made while merged blocks would have served. The layout still differs
  // from merging at once (a hit takes the binned block, where best fit might have chosen another); the dry
  // run reproduces it all the same, as it runs this very code. Merging back only on a miss mattered: merging
  // back only before a new segment let best fits split blocks that were about to merge, and raised the
  // reserved peak of some recompute plans by enough that the planner's test no longer found one under 0.6 x
  // the peak. The bins are merged back too when the arena returns segments (a limit, empty_cache). A binned
  // block is free: it counts as no allocated byte, and a snapshot, largest_free_block and the fragmentation
  // figure take a run of adjacent free blocks, binned or not, as the one block it will merge into. Large
  // blocks are not binned: their requests are fewer, and their time goes to the work on them. The bins depend
  // on the requests alone (sizes, LIFO order), so a dry run reproduces them (Note [the arena's choices do not
  // depend on addresses]).
  static constexpr int kBins = int(kSmallRequest / kMinBlock) + 1;  // by size / kMinBlock; 0 stays empty

  // The newest block of the bin of `size` if it is on `stream` (else null: the caller takes the pool's way).
  Block* take_binned_locked(int64_t size, Stream stream) {
    const uint64_t i = uint64_t(size) / kMinBlock;
    Block* b = bins_[i];
    if (!b || b->stream != stream) return nullptr;
    bins_[i] = std::exchange(b->bin_next, nullptr);
    if (!bins_[i]) bin_bits_[i / 64] &= ~(uint64_t(1) << (i % 64));
    b->binned = false;
    --binned_;
    return b;
  }
  void bin_locked(Block* b) {
    const uint64_t i = uint64_t(b->size) / kMinBlock;
    b->binned = true;
    b->bin_next = std::exchange(bins_[i], b);
    bin_bits_[i / 64] |= uint64_t(1) << (i % 64);
    ++binned_;
  }
  // Puts every binned block into its pool, merged with its free neighbours. The merged blocks, and so every
  // later choice, do not depend on the order. One block at a time, each out of its bin before it goes into
  // the pool: should the pool's insert fail, the bins still hold exactly the blocks not yet moved.
  void flush_bins_locked() {
    for (size_t w = 0; w < bin_bits_.size() && binned_ > 0; ++w)
      while (bin_bits_[w]) {
        const size_t i = w * 64 + size_t(__builtin_ctzll(bin_bits_[w]));
        while (bins_[i]) insert_free_locked(take_binned_locked(int64_t(i) * kMinBlock, bins_[i]->stream));
      }
  }

  // Best fit on `stream`: the smallest free block that is big enough, the oldest segment's among equals,
  // split when more than the pool's threshold would be left (Note [blocks change in place]); null when there
  // is none. `small`: the request is from the small pool (even when it borrows from the large one).
  Block* take_free_locked(FreeSet& pool, int64_t size, bool small, Stream stream) {
    auto it = pool.lower_bound(FreeKey{stream, size, -1, nullptr});  // the first of its size on the stream
    if (it == pool.end() || (*it)->stream != stream) return nullptr;
    Block* free = *it;
    const int64_t remainder = free->size - size;
    if (!(small ? remainder >= kMinBlock : remainder > kLargeSplitRemainder)) {
      pool.erase(it);
      return free;
    }
    // A spare record is as a freed block leaves it: not allocated, no request, tag, events or uses.
    Block* front = take_spare_block();
    front->ptr = free->ptr;
    front->size = size;
    front->segment = free->segment;
    front->prev = free->prev;
    front->next = free;
    front->stream = stream;
    front->category = -1;
    (free->prev ? free->prev->next : free->segment->head) = front;
    free->prev = front;
    free->ptr += size;
    free->size = remainder;
    if (it != pool.begin() && !pool.key_comp()(*std::prev(it), free)) reposition_locked(pool, it);
    return front;
  }

  // allocate()'s way when the bin of its size cannot serve it (Note [exact-fit bins]): blocks waiting for
  // events first, then the bin again; on a miss the bins merged back, then best fit in the pool, or
  // take_short_locked. Out of line, with what it needs ready before it touches anything.
  [[gnu::noinline]] Block* take_unbinned_locked(int64_t nbytes, int64_t size, Stream stream) {
    // A new segment and a split need a Block record each: get them now, so that nothing below can fail once
    // the free set or the backing has been touched.
    while (spare_blocks_.size() < 2) spare_blocks_.push_back(new Block);
    const bool small = size <= kSmallRequest;
    FreeSet& pool = small ? small_free_ : large_free_;
    if (!pending_.empty()) process_events_locked(false);
    Block* block = small ? take_binned_locked(size, stream) : nullptr;
    if (!block && small) flush_bins_locked();  // a miss: the pool as it would be with every free merged
    if (!block) block = take_free_locked(pool, size, small, stream);
    if (!block) [[unlikely]]
      block = take_short_locked(nbytes, size, small, stream);
    return block;
  }

  // allocate()'s way when no cached block fits: a new segment; under a limit, what other streams hold back
  // and then the cache go back first; then a small request borrows from the large pool; else out of memory.
  // Out of line, so that the path a training step takes almost always stays small.
  [[gnu::noinline]] Block* take_short_locked(int64_t nbytes, int64_t size, bool small, Stream stream) {
    FreeSet& pool = small ? small_free_ : large_free_;
    bool refused = false;
    // A new segment goes into the pool as one free block, and the request is carved out of it as out of any.
    auto from_new_segment = [&]() -> Block* {
      Block* head = new_segment_locked(size, small, stream, refused);
      if (!head) return nullptr;
      pool.insert(head);
      return take_free_locked(pool, size, small, stream);
    };
    Block* block = from_new_segment();
    // Short of memory. Unless the request would not fit under the limit even alone (then the cache stays):
    // wait for the blocks other streams' work holds back, then return the cached segments, retrying each
    // time.
    const int64_t minimal = small ? kSmallSegment : round_up(size, kLargeRound);
    const bool could_fit = limit_ <= 0 || minimal <= limit_;
    if (!block && could_fit && !pending_.empty()) {
      process_events_locked(true);
      block = take_free_locked(pool, size, small, stream);
      if (!block) block = from_new_segment();
    }
    if (!block && could_fit) {
      release_free_segments_locked();
      block = from_new_segment();
    }
    // Note [a small request borrows from the large pool]: the pools are kept apart so that small blocks do
    // not scatter through the large segments, but under a limit that is no reason to fail while a large
    // segment has a free piece big enough: the last resort before giving up is to carve the request out of
    // it (split at the block size, as a small segment would be, and merged back when freed). W3 in 32
    // micro-batches under 0.3x its plain peak needed this: 10.5 MiB live, 15 MiB free in a large segment,
    // and the small pool's segments full.
    if (!block && small) block = take_free_locked(large_free_, size, small, stream);
    if (!block) throw_oom_locked(nbytes, minimal, refused);
    return block;
  }

  // Moves the record at `it`, whose key changed, to its place.
  static void reposition_locked(FreeSet& pool, FreeSet::iterator it) {
    FreeSet::node_type node = pool.extract(it);
    pool.insert(std::move(node));
  }

  // Puts a block that has just become free into its pool, merged with its free neighbours (Note [blocks
  // change in place]).
  void insert_free_locked(Block* block) {
    FreeSet& pool = pool_of(block->segment);
    Block* prev = is_free(block->prev) ? block->prev : nullptr;
    Block* next = is_free(block->next) ? block->next : nullptr;
    if (!prev && !next) {
      pool.insert(block);
      return;
    }
    // The record that takes the block in, found while its key is still the one it is filed under.
    Block* grown = prev ? prev : next;
    const auto it = pool.find(grown);
    FRUGAL_ASSERT(it != pool.end(), "arena: a free block missing from its pool");
    if (prev) {
      if (next) {
        pool.erase(next);
        prev->size += next->size;
        unlink(next);
      }
      prev->size += block->size;
      unlink(block);
    } else {
      next->ptr = block->ptr;
      next->size += block->size;
      next->prev = block->prev;
      (block->prev ? block->prev->next : block->segment->head) = next;
      spare_blocks_.push_back(block);
    }
    if (auto after = std::next(it); after != pool.end() && !pool.key_comp()(grown, *after))
      reposition_locked(pool, it);
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
      if (void* ptr = backing_->alloc(bytes)) {
        poison(ptr, bytes);
        return add_segment_locked(static_cast<char*>(ptr), bytes, small, stream);
      }
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
    const Segment& made = *segment;
    segments_.emplace(segment->id, std::move(segment));
    count_segment_locked(bytes, +1);
    note_segment_locked(EventKind::SegmentAlloc, made);
    return head;
  }

  // Returns every segment that is one free block to the backing. Counts as a cache flush.
  void release_free_segments_locked() {
    flush_bins_locked();
    ++stats_.num_cache_flushes;
    note_cache_flush_locked();
    for (auto it = segments_.begin(); it != segments_.end();) {
      Segment* s = it->second.get();
      if (!is_free(s->head) || s->head->next) {
        ++it;
        continue;
      }
      pool_of(s).erase(s->head);
      spare_blocks_.push_back(s->head);
      unpoison(s->base, s->size);
      backing_->free(s->base, s->size);
      count_segment_locked(s->size, -1);
      note_segment_locked(EventKind::SegmentFree, *s);
      it = segments_.erase(it);
    }
  }

  // A run of adjacent free blocks shows as the one block it is merged into: with binned blocks in it
  // (Note [exact-fit bins]), that merge is only deferred.
  std::vector<BlockInfo> snapshot_locked() const override {
    std::vector<BlockInfo> out;
    for (const auto& [id, segment] : segments_)
      for (const Block* b = segment->head; b; b = b->next) {
        const bool merges = !b->allocated && b->pending_events == 0;
        if (merges && b->prev && !b->prev->allocated && b->prev->pending_events == 0)
          out.back().size += b->size;
        else
          out.push_back(info(b));
      }
    return out;
  }
  std::vector<Block*> live_blocks_locked() const override {
    std::vector<Block*> out;
    for (const auto& [id, segment] : segments_)
      for (Block* b = segment->head; b; b = b->next)
        if (b->allocated) out.push_back(b);
    return out;
  }

  // A run of adjacent free blocks, binned or not, counts as the one block it merges into (Note [exact-fit
  // bins]). Without bins and streams the pools' last blocks say it at once; otherwise the segments are walked
  // (the pools are ordered by stream first, so their last block is only the last stream's largest).
  int64_t largest_free_locked() const override {
    int64_t largest = 0;
    if (binned_ == 0 && !streams_) {
      for (const FreeSet* pool : {&small_free_, &large_free_})
        if (!pool->empty()) largest = std::max(largest, (*pool->rbegin())->size);
      return largest;
    }
    for (const auto& [id, segment] : segments_) {
      int64_t run = 0;
      for (const Block* b = segment->head; b; b = b->next) {
        run = !b->allocated && b->pending_events == 0 ? run + b->size : 0;
        largest = std::max(largest, run);
      }
    }
    return largest;
  }

  const bool streams_ = backing_->uses_streams();
  FreeSet small_free_, large_free_;
  std::array<Block*, kBins> bins_{};                      // Note [exact-fit bins]: newest first
  std::array<uint64_t, (kBins + 63) / 64> bin_bits_{};    // which bins hold a block
  int64_t binned_ = 0;                                    // blocks in the bins
  std::map<int64_t, std::unique_ptr<Segment>> segments_;  // by id: oldest first in snapshots
  std::vector<Block*> spare_blocks_;                      // recycled Block records
  std::vector<PendingFree> pending_;                      // events freed blocks wait for, oldest first
};

}  // namespace

std::unique_ptr<Allocator> make_arena(Device device, std::unique_ptr<Backing> backing) {
  return std::make_unique<Arena>(device, std::move(backing));
}

std::unique_ptr<Allocator> detail::make_simulated_arena(Device device, std::unique_ptr<Backing> backing,
                                                        const Allocator* source, int64_t* resident) {
  auto arena = std::make_unique<Arena>(device, std::move(backing));
  arena->mark_simulated();
  int64_t held = 0;
  if (source) {
    const auto* from = dynamic_cast<const Arena*>(source);
    FRUGAL_CHECK(from != nullptr,
                 "memory::estimate: the dry run starts from a caching arena's state, and the "
                 "source device's allocator is the ",
                 source->kind(), " allocator (FRUGAL_ALLOCATOR=system)");
    held = arena->copy_layout_from(*from);
  }
  if (resident) *resident = held;
  return arena;
}

}  // namespace frugal::memory
