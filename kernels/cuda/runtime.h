// CUDA plumbing the .cu files share: checks that turn a failed CUDA call or launch into a DeviceError naming
// the call and file:line, the device guard, the calling thread's current stream, and launch sizes. Internal
// to kernels/cuda (it includes CUDA's headers, which core/ never does).
//
//   FRUGAL_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, gpu::current_stream(dev)));
//   my_kernel<<<blocks, threads, 0, stream>>>(...);
//   FRUGAL_CUDA_CHECK_LAUNCH("my_kernel");
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"

namespace frugal::gpu {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);

inline void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) [[unlikely]]
    throw_cuda_error(status, call, file, line);
}

// The number of CUDA devices, 0 when there is no driver or no device (any error counts as none).
int device_count();

// The device a pointer from cudaMalloc lives on (0 on a single-GPU machine, without asking the driver).
int device_of(const void* ptr);

// Makes `index` the current device for its scope and restores the previous one, so that work on cuda:1 does
// not change which device the caller's own CUDA code runs on.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  int index_ = 0;
};

// The stream the calling thread issues frugal's work on for a device: the legacy default stream (null) unless
// a StreamGuard says otherwise. The arena's CUDA backing reports it (Note [streams and the arena]).
cudaStream_t current_stream(int device);
class StreamGuard {
 public:
  StreamGuard(int device, cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  cudaStream_t previous_;
};

// Streaming multiprocessors of a device (asked once per device).
int multiprocessor_count(int device);

// Blocks of `threads` threads that cover n items, at least 1 and at most the grid's x limit.
inline unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > 0x7fffffff ? 0x7fffffff : b));
}

}  // namespace frugal::gpu

#define FRUGAL_CUDA_CHECK(call) ::frugal::gpu::check((call), #call, __FILE__, __LINE__)
// After every launch: a bad configuration shows here; a fault inside the kernel shows at the next call that
// synchronises.
#define FRUGAL_CUDA_CHECK_LAUNCH(kernel) \
  ::frugal::gpu::check(cudaGetLastError(), "launch of " kernel, __FILE__, __LINE__)
