// Storage: one allocation from a device's allocator, shared by a tensor and all its views. It also carries
// the version counter that in-place ops bump (so autograd can tell a saved tensor was overwritten).
#pragma once

#include <cstdint>

#include "device.h"
#include "memory.h"

namespace frugal {

class Storage {
 public:
  // Allocates nbytes on device from memory::allocator(device); throws OutOfMemoryError.
  Storage(int64_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return alloc_.ptr; }
  int64_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  uint64_t version() const { return version_; }
  void bump_version() { ++version_; }
  // Counts these bytes under another memory tag from now on (memory::intern_tag gives the id).
  void retag(uint32_t tag) { allocator_->retag(alloc_.block, tag); }
  // Work on `stream` uses these bytes too: their reuse after the free waits for it
  // (Allocator::record_stream).
  void record_stream(memory::Stream stream) { allocator_->record_stream(alloc_.block, stream); }

 private:
  memory::Allocation alloc_;
  memory::Allocator* allocator_;
  int64_t nbytes_;
  Device device_;
  uint64_t version_ = 0;
};

}  // namespace frugal
