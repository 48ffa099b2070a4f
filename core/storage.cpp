// Storage: one block from its device's allocator, returned when the last tensor using it goes away.
#include "core/storage.h"

namespace frugal {

Storage::Storage(int64_t nbytes, Device device)
    : allocator_(&memory::allocator(device)), nbytes_(nbytes), device_(device) {
  alloc_ = allocator_->allocate(nbytes);
}

Storage::~Storage() { allocator_->deallocate(alloc_.block); }

}  // namespace frugal
