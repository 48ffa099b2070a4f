// cuDNN plumbing for the CUDA kernels built with it (FRUGAL_HAVE_CUDNN): the check that turns a failed cuDNN
// call into a DeviceError naming the call and file:line, the per-device handle, and RAII descriptors.
// Internal to kernels/cuda.
//
//   FRUGAL_CUDNN_CHECK(cudnnConvolutionForward(gpu::cudnn_handle(dev, stream), ...));
#pragma once

#include <cudnn.h>

#include <mutex>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/runtime.h"

namespace frugal::gpu {

[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file, int line);

inline void check_cudnn(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status != CUDNN_STATUS_SUCCESS) [[unlikely]]
    throw_cudnn_error(status, call, file, line);
}

// cuDNN's name for a stored dtype (f32, f16, bf16; others are not used with cuDNN).
cudnnDataType_t cudnn_data_type(DType dtype);

// A device's cuDNN handle (one per device, created on first use, shared by every caller) with its stream set
// to `stream`; usable while this object (and its lock on the handle) lives.
struct CudnnHandle {
  std::unique_lock<std::mutex> lock;
  cudnnHandle_t handle;
};
CudnnHandle cudnn_handle(int device, cudaStream_t stream);

}  // namespace frugal::gpu

#define FRUGAL_CUDNN_CHECK(call) ::frugal::gpu::check_cudnn((call), #call, __FILE__, __LINE__)

namespace frugal::gpu {

// One descriptor of each kind, destroyed with its scope (a destroy cannot usefully fail: its status is
// ignored).
struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc() { FRUGAL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d)); }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  // A contiguous NCHW tensor.
  void set(DType dtype, int n, int c, int h, int w) {
    FRUGAL_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, cudnn_data_type(dtype), n, c, h, w));
  }
};

struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc() { FRUGAL_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d)); }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};

struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc() { FRUGAL_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d)); }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

}  // namespace frugal::gpu
