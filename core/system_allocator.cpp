// The system allocator: one backing call per allocation, nothing cached. The baseline the arena is measured
// against, and a way (FRUGAL_ALLOCATOR=system) to let tools such as AddressSanitizer see every block. Also
// the host backing, the aligned memory both allocators draw from on the CPU.

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/allocator_base.h"

namespace frugal::memory {
namespace {

using namespace detail;

class HostBacking final : public Backing {
 public:
  void* alloc(int64_t nbytes) override {
    // aligned_alloc wants a size that is a multiple of the alignment (and 0 bytes would give no usable
    // pointer).
    return std::aligned_alloc(kHostAlign, std::max(kHostAlign, round_up(nbytes, kHostAlign)));
  }
  void free(void* ptr, int64_t) override { std::free(ptr); }
  bool uses_streams() const override { return false; }
};

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
    const char* op = current_op();
    const Phase phase = current_phase();
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
                              .allocated = true,
                              .phase = phase,
                              .op = op};
    Block* block = segment->head;
    const Segment& made = *segment;
    live_.emplace(segment->id, std::move(segment));
    count_segment_locked(size, +1);
    note_segment_locked(EventKind::SegmentAlloc, made);
    count_block_locked<+1>(block);
    note_block_locked(EventKind::Alloc, block);
    return {base, size, block};
  }

  void deallocate(Block* block) override {
    if (!block) return;
    std::lock_guard lock(mu_);
    auto it = live_.find(block->segment->id);
    FRUGAL_ASSERT(it != live_.end() && it->second->head == block, "deallocate of a block that is not live");
    count_block_locked<-1>(block);
    note_block_locked(EventKind::Free, block);
    count_segment_locked(block->size, -1);
    note_segment_locked(EventKind::SegmentFree, *block->segment);
    backing_->free(block->ptr, block->size);
    delete block;
    live_.erase(it);
  }

  // The backing's free returns the memory at once: cudaFree waits for the device, so no stream needs fencing.
  void record_stream(Block*, Stream) override {}

  void empty_cache() override {}  // nothing is cached

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
  std::vector<BlockInfo> snapshot_locked() const override {
    std::vector<BlockInfo> out;
    for (const auto& [id, segment] : live_) out.push_back(info(segment->head));
    return out;
  }
  std::vector<Block*> live_blocks_locked() const override {
    std::vector<Block*> out;
    for (const auto& [id, segment] : live_) out.push_back(segment->head);
    return out;
  }

  std::map<int64_t, std::unique_ptr<Segment>> live_;  // one segment per live block, by id
};

}  // namespace

std::unique_ptr<Allocator> make_system_allocator(Device device, std::unique_ptr<Backing> backing) {
  return std::make_unique<SystemAllocator>(device, std::move(backing));
}

std::unique_ptr<Backing> make_host_backing() { return std::make_unique<HostBacking>(); }

}  // namespace frugal::memory
