// Copies between the host and a GPU (op_copy_between_devices, core/op_table.h) through pinned staging
// buffers: two per device, allocated on first use and reused, so that a copy of any size is a pipeline of
// chunks (the host fills or drains one buffer while the GPU transfers the other) and ordinary pageable host
// memory never costs the driver a hidden pinned bounce of its own. A copy returns once the bytes are in
// place. The staging memory (2 x 8 MiB per device) is pinned host memory outside the arena.
#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>

#include "core/op_table_copy.h"
#include "kernels/cuda/runtime.h"

namespace frugal {
namespace {

constexpr int64_t kChunk = 8 << 20;
constexpr int kMaxDevices = 64;

struct Staging {
  std::mutex mu;  // one copy at a time per device: the buffers are shared
  std::array<char*, 2> buffer{};
  std::array<cudaEvent_t, 2> done{};  // the last transfer that used each buffer

  // Allocates the buffers and events on first use (device already current).
  void ensure() {
    if (buffer[0]) return;
    for (int b = 0; b < 2; ++b) {
      FRUGAL_CUDA_CHECK(
          cudaHostAlloc(reinterpret_cast<void**>(&buffer[size_t(b)]), size_t(kChunk), cudaHostAllocDefault));
      FRUGAL_CUDA_CHECK(cudaEventCreateWithFlags(&done[size_t(b)], cudaEventDisableTiming));
    }
  }
};

Staging& staging(int device) {
  // Never destroyed: a tensor freed by a static destructor may still copy, and the driver may be gone by
  // then.
  static auto* all = new std::array<Staging, kMaxDevices>();
  FRUGAL_CHECK_T(DeviceError, device >= 0 && device < kMaxDevices, "cuda:", device,
                 " is beyond the devices frugal supports");
  return (*all)[size_t(device)];
}

// host -> device: chunk k is copied into buffer k % 2 once that buffer's previous transfer has finished.
void host_to_device(char* dst, const char* src, int64_t n, int device) {
  gpu::DeviceGuard guard(device);
  const cudaStream_t stream = gpu::current_stream(device);
  Staging& s = staging(device);
  std::lock_guard lock(s.mu);
  s.ensure();
  int64_t chunk = 0;
  for (int64_t off = 0; off < n; off += kChunk, ++chunk) {
    const size_t b = size_t(chunk % 2), len = size_t(std::min(kChunk, n - off));
    if (chunk >= 2) FRUGAL_CUDA_CHECK(cudaEventSynchronize(s.done[b]));
    std::memcpy(s.buffer[b], src + off, len);
    FRUGAL_CUDA_CHECK(cudaMemcpyAsync(dst + off, s.buffer[b], len, cudaMemcpyHostToDevice, stream));
    FRUGAL_CUDA_CHECK(cudaEventRecord(s.done[b], stream));
  }
  // The last one or two transfers are still in flight; the copy is done when the last one is.
  FRUGAL_CUDA_CHECK(cudaEventSynchronize(s.done[size_t((chunk - 1) % 2)]));
}

// device -> host: the transfer of chunk k + 1 runs while chunk k is copied out of its buffer.
void device_to_host(char* dst, const char* src, int64_t n, int device) {
  gpu::DeviceGuard guard(device);
  const cudaStream_t stream = gpu::current_stream(device);
  Staging& s = staging(device);
  std::lock_guard lock(s.mu);
  s.ensure();
  auto issue = [&](int64_t chunk) {
    const int64_t off = chunk * kChunk;
    if (off >= n) return;
    const size_t b = size_t(chunk % 2), len = size_t(std::min(kChunk, n - off));
    FRUGAL_CUDA_CHECK(cudaMemcpyAsync(s.buffer[b], src + off, len, cudaMemcpyDeviceToHost, stream));
    FRUGAL_CUDA_CHECK(cudaEventRecord(s.done[b], stream));
  };
  issue(0);
  for (int64_t chunk = 0, off = 0; off < n; off += kChunk, ++chunk) {
    issue(chunk + 1);  // into the other buffer, drained in the previous iteration
    const size_t b = size_t(chunk % 2), len = size_t(std::min(kChunk, n - off));
    FRUGAL_CUDA_CHECK(cudaEventSynchronize(s.done[b]));
    std::memcpy(dst + off, s.buffer[b], len);
  }
}

void copy_between_devices_cuda(const DeviceCopyArgs& a) {
  FRUGAL_ASSERT(a.src_device.is_cpu() != a.dst_device.is_cpu(), "copy between devices: ", a.src_device,
                " -> ", a.dst_device, " is not between the host and a GPU");
  if (a.nbytes <= 0) return;
  if (a.src_device.is_cpu())
    host_to_device(static_cast<char*>(a.dst), static_cast<const char*>(a.src), a.nbytes, a.dst_device.index);
  else
    device_to_host(static_cast<char*>(a.dst), static_cast<const char*>(a.src), a.nbytes, a.src_device.index);
}

[[maybe_unused]] const bool kRegistered = [] {
  for (int t = 0; t < kNumDTypes; ++t)
    op_copy_between_devices.set(DeviceType::CUDA, DType(t), copy_between_devices_cuda);
  return true;
}();

}  // namespace
}  // namespace frugal
