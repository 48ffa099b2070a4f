// CUDA plumbing (kernels/cuda/runtime.h): error messages, the device count, guards, the current stream.
#include <array>
#include <atomic>

#include "core/device.h"
#include "kernels/cuda/runtime.h"

namespace frugal::gpu {

namespace {
constexpr int kMaxDevices = 64;
thread_local std::array<cudaStream_t, kMaxDevices> t_streams{};  // null: the legacy default stream

int checked_index(int device) {
  FRUGAL_CHECK_T(DeviceError, device >= 0 && device < kMaxDevices, "cuda:", device,
                 " is beyond the devices frugal supports (cuda:0 .. cuda:", kMaxDevices - 1, ")");
  return device;
}
}  // namespace

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  throw DeviceError(detail::str_cat("CUDA error: ", call, " failed at ", file, ":", line, ": ",
                                    cudaGetErrorName(status), " (", cudaGetErrorString(status), ")"));
}

int device_count() {
  // Asked once: the answer does not change while the process runs, and asking again is not free.
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // no driver or no device: not an error for a program that stays on the CPU
      return 0;
    }
    return n;
  }();
  return count;
}

int device_of(const void* ptr) {
  if (device_count() <= 1) return 0;
  cudaPointerAttributes attr{};
  FRUGAL_CUDA_CHECK(cudaPointerGetAttributes(&attr, ptr));
  return attr.device;
}

DeviceGuard::DeviceGuard(int index) : index_(index) {
  FRUGAL_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != index) FRUGAL_CUDA_CHECK(cudaSetDevice(index));
}

DeviceGuard::~DeviceGuard() {
  if (previous_ != index_) cudaSetDevice(previous_);  // cannot fail: cudaGetDevice gave this index
}

cudaStream_t current_stream(int device) { return t_streams[size_t(checked_index(device))]; }

StreamGuard::StreamGuard(int device, cudaStream_t stream)
    : device_(checked_index(device)), previous_(t_streams[size_t(device)]) {
  t_streams[size_t(device)] = stream;
}

StreamGuard::~StreamGuard() { t_streams[size_t(device_)] = previous_; }

int multiprocessor_count(int device) {
  static std::array<std::atomic<int>, kMaxDevices> counts{};
  std::atomic<int>& slot = counts[size_t(checked_index(device))];
  int n = slot.load(std::memory_order_relaxed);
  if (n == 0) {
    FRUGAL_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    slot.store(n, std::memory_order_relaxed);
  }
  return n;
}

namespace {
[[maybe_unused]] const bool kRegistered = [] {
  register_device_count(DeviceType::CUDA, &device_count);
  return true;
}();
}  // namespace

}  // namespace frugal::gpu
