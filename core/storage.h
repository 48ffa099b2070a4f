// Storage: one allocation from a device's allocator, shared by a tensor and all its views. It also carries
// the version counter that in-place ops bump (so autograd can tell a saved tensor was overwritten).
#pragma once

#include <cstdint>
#include <memory>

#include "device.h"
#include "memory.h"

namespace frugal {

class Storage {
 public:
  // Allocates nbytes on device from memory::allocator(device); throws OutOfMemoryError.
  Storage(int64_t nbytes, Device device);
  // Bytes no allocator gave: a read-only file mapping that `owner` keeps valid (io::map_safetensors) and
  // the storage keeps alive. They count as the device's mapped bytes under the current memory tag while the
  // storage lives (Note [mapped bytes], core/memory.h); ops refuse to write into them (check_writable).
  Storage(std::shared_ptr<const void> owner, void* data, int64_t nbytes, Device device);
  // base's bytes, shared: counted once, as base's; the storage keeps base and `also` alive (serve::ModelPool
  // hands out its outputs so, `also` releasing their bytes from its budget when the last view goes).
  Storage(std::shared_ptr<Storage> base, std::shared_ptr<const void> also);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return alloc_.ptr; }
  int64_t nbytes() const { return nbytes_; }
  // The bytes its block takes in the allocator (nbytes rounded up, as Stats::allocated counts them); 0 for
  // mapped bytes and for a view of another storage's.
  int64_t block_bytes() const { return alloc_.block ? alloc_.size : 0; }
  Device device() const { return device_; }
  uint64_t version() const { return version_; }
  void bump_version() { ++version_; }
  // A mapped file's bytes (the first external constructor), or base's when base's are.
  bool read_only() const { return base_ ? base_->read_only() : owner_ != nullptr; }
  // Counts these bytes under another memory tag from now on (memory::intern_tag gives the id).
  void retag(uint32_t tag);
  // Work on `stream` uses these bytes too: their reuse after the free waits for it
  // (Allocator::record_stream).
  void record_stream(memory::Stream stream);

 private:
  memory::Allocation alloc_;
  memory::Allocator* allocator_;
  int64_t nbytes_;
  Device device_;
  uint64_t version_ = 0;
  std::shared_ptr<const void> owner_;  // a mapping's owner (no block then)
  uint32_t mapped_tag_ = 0;            // the tag its mapped bytes count under
  // Destroyed in reverse order: base_ (its block freed) before also_ (which may say the bytes are gone).
  std::shared_ptr<const void> also_;
  std::shared_ptr<Storage> base_;  // the storage whose bytes these are (no block then)
};

}  // namespace frugal
