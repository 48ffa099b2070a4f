// Storage: one block from its device's allocator, returned when the last tensor using it goes away.
#include "core/storage.h"

#include "core/profiler.h"

namespace frugal {

Storage::Storage(int64_t nbytes, Device device)
    : allocator_(&memory::allocator(device)), nbytes_(nbytes), device_(device) {
  alloc_ = allocator_->allocate(nbytes);
  // The profiler's bytes per op (Note [what the profiler times]).
  if (profiler::detail::g_recording.load(std::memory_order_relaxed)) [[unlikely]]
    profiler::detail::count_allocation(alloc_.size);
}

Storage::~Storage() { allocator_->deallocate(alloc_.block); }

}  // namespace frugal
