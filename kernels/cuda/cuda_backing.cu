// The CUDA backing of the memory arena: cudaMalloc/cudaFree for cuda:N, the calling thread's current stream
// and events on it, registered when the library loads. Caching, statistics, limits and the stream rule are
// the device-agnostic arena's (core/arena.cpp, Note [streams and the arena]), not this file's. No managed
// memory.
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "kernels/cuda/runtime.h"

namespace frugal {
namespace {

class CudaBacking final : public memory::Backing {
 public:
  explicit CudaBacking(int index) : index_(index) {}
  ~CudaBacking() override {
    for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  }

  void* alloc(int64_t nbytes) override {
    gpu::DeviceGuard guard(index_);
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
    gpu::DeviceGuard guard(index_);
    FRUGAL_CUDA_CHECK(cudaFree(ptr));
  }

  memory::Stream current_stream() override {
    return reinterpret_cast<memory::Stream>(gpu::current_stream(index_));
  }

  // Events come from a pool: creating one per free would cost a driver call each time.
  memory::Event record_event(memory::Stream stream) override {
    gpu::DeviceGuard guard(index_);
    cudaEvent_t e = nullptr;
    {
      std::lock_guard lock(mu_);
      if (!spare_events_.empty()) {
        e = spare_events_.back();
        spare_events_.pop_back();
      }
    }
    if (!e) FRUGAL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    FRUGAL_CUDA_CHECK(cudaEventRecord(e, reinterpret_cast<cudaStream_t>(stream)));
    return e;
  }

  bool event_done(memory::Event event) override {
    const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (status == cudaErrorNotReady) {
      cudaGetLastError();  // "not yet" is an answer, not an error to report later
      return false;
    }
    FRUGAL_CUDA_CHECK(status);
    return true;
  }

  void wait_event(memory::Event event) override {
    FRUGAL_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  }

  void release_event(memory::Event event) override {
    std::lock_guard lock(mu_);
    spare_events_.push_back(static_cast<cudaEvent_t>(event));
  }

 private:
  int index_;
  std::mutex mu_;
  std::vector<cudaEvent_t> spare_events_;
};

// Called by the allocator registry on the first allocation on cuda:index.
std::unique_ptr<memory::Backing> make_cuda_backing(int index) {
  const int count = gpu::device_count();
  FRUGAL_CHECK_T(DeviceError, index < count, "cuda:", index, " is not available: this machine has ", count,
                 " CUDA device(s) (cuda:0 .. cuda:", count - 1, ")");
  return std::make_unique<CudaBacking>(index);
}

// Registers the backing when libfrugal loads, but only where there is a GPU: elsewhere (no device, no driver)
// a cuda allocation keeps the registry's "no CUDA backend ... or no GPU is present" DeviceError.
[[maybe_unused]] const bool registered = [] {
  if (gpu::device_count() < 1) return false;
  memory::register_backing(DeviceType::CUDA, &make_cuda_backing);
  return true;
}();

}  // namespace
}  // namespace frugal
