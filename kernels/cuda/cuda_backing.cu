// The CUDA backing of the memory arena: cudaMalloc/cudaFree for cuda:N, registered when the library loads.
// Caching, statistics and limits are the device-agnostic arena's (core/arena.cpp), not this file's.
#include <cuda_runtime.h>

#include <memory>

#include "core/error.h"
#include "core/memory.h"

namespace frugal {
namespace {

// Throws DeviceError naming the call, where it was made and CUDA's own description of the error.
void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) [[likely]]
    return;
  throw DeviceError(detail::str_cat("CUDA error: ", call, " failed at ", file, ":", line, ": ",
                                    cudaGetErrorName(status), " (", cudaGetErrorString(status), ")"));
}
#define FRUGAL_CUDA_CHECK(call) ::frugal::check_cuda((call), #call, __FILE__, __LINE__)

// Makes `index` the current device for its scope and restores the previous one, so that allocating on cuda:1
// does not change which device the caller's own CUDA code runs on.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    FRUGAL_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != index) FRUGAL_CUDA_CHECK(cudaSetDevice(index));
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }  // cannot fail after cudaGetDevice gave this index
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

class CudaBacking final : public memory::Backing {
 public:
  explicit CudaBacking(int index) : index_(index) {}

  void* alloc(int64_t nbytes) override {
    DeviceGuard guard(index_);
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, size_t(nbytes));
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it: running out is not sticky, and the arena will free its cache and retry
      return nullptr;
    }
    FRUGAL_CUDA_CHECK(status);
    return ptr;
  }

  void free(void* ptr, int64_t) override {
    DeviceGuard guard(index_);
    FRUGAL_CUDA_CHECK(cudaFree(ptr));
  }

 private:
  int index_;
};

// Called by the allocator registry on the first allocation on cuda:index.
std::unique_ptr<memory::Backing> make_cuda_backing(int index) {
  int count = 0;
  FRUGAL_CUDA_CHECK(cudaGetDeviceCount(&count));
  FRUGAL_CHECK_T(DeviceError, index < count, "cuda:", index, " is not available: this machine has ", count,
                 " CUDA device(s) (cuda:0 .. cuda:", count - 1, ")");
  return std::make_unique<CudaBacking>(index);
}

// Registers the backing when libfrugal loads, but only where there is a GPU: elsewhere (no device, no driver)
// a cuda allocation keeps the registry's "no CUDA backend ... or no GPU is present" DeviceError.
[[maybe_unused]] const bool registered = [] {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error for a program that stays on the CPU
    return false;
  }
  if (count < 1) return false;
  memory::register_backing(DeviceType::CUDA, &make_cuda_backing);
  return true;
}();

}  // namespace
}  // namespace frugal
