// Storage: one block from its device's allocator, returned when the last tensor using it goes away.
#include "core/storage.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/history_log.h"
#include "core/profiler.h"

namespace frugal {

namespace {
// The innermost memory::AllocationProbe of this thread; in the static TLS block (Note [thread-locals on the
// allocation path], core/history_log.h).
FRUGAL_STATIC_TLS thread_local memory::AllocationProbe* t_probe = nullptr;
}  // namespace

memory::AllocationProbe::AllocationProbe() : outer_(t_probe) { t_probe = this; }
memory::AllocationProbe::~AllocationProbe() { t_probe = outer_; }
void memory::AllocationProbe::count(int64_t bytes) {
  for (AllocationProbe* p = this; p != nullptr; p = p->outer_) {
    p->current_ += bytes;
    p->peak_ = std::max(p->peak_, p->current_);
  }
}

Storage::Storage(int64_t nbytes, Device device)
    : allocator_(&memory::allocator(device)), nbytes_(nbytes), device_(device) {
  alloc_ = allocator_->allocate(nbytes);
  if (t_probe) [[unlikely]]
    t_probe->count(alloc_.size);
  // The profiler's bytes per op (Note [what the profiler times]).
  if (profiler::detail::g_recording.load(std::memory_order_relaxed)) [[unlikely]]
    profiler::detail::count_allocation(alloc_.size);
}

Storage::Storage(std::shared_ptr<const void> owner, void* data, int64_t nbytes, Device device)
    : allocator_(&memory::allocator(device)), nbytes_(nbytes), device_(device), owner_(std::move(owner)) {
  FRUGAL_CHECK(owner_ != nullptr && (data != nullptr || nbytes == 0) && nbytes >= 0,
               "Storage: mapped bytes need an owner and a valid range (", nbytes, " bytes at ", data, ")");
  alloc_.ptr = data;
  alloc_.size = nbytes;
  mapped_tag_ = memory::current_tag();
  allocator_->count_mapped(mapped_tag_, nbytes);
}

Storage::Storage(std::shared_ptr<Storage> base, std::shared_ptr<const void> also)
    : allocator_(nullptr),
      nbytes_(base->nbytes()),
      device_(base->device()),
      also_(std::move(also)),
      base_(std::move(base)) {
  alloc_.ptr = base_->data();
  alloc_.size = nbytes_;
}

Storage::~Storage() {
  if (alloc_.block) {
    if (t_probe) [[unlikely]]
      t_probe->count(-alloc_.size);
    allocator_->deallocate(alloc_.block);
  } else if (owner_)
    allocator_->count_mapped(mapped_tag_, -nbytes_);
}

void Storage::retag(uint32_t tag) {
  if (alloc_.block)
    allocator_->retag(alloc_.block, tag);
  else if (owner_)
    allocator_->retag_mapped(std::exchange(mapped_tag_, tag), tag, nbytes_);
  else
    base_->retag(tag);
}

void Storage::record_stream(memory::Stream stream) {
  if (alloc_.block)
    allocator_->record_stream(alloc_.block, stream);
  else if (base_)
    base_->record_stream(stream);
  // A mapping is host memory, read in order on the host: no stream reuses it.
}

}  // namespace frugal
