// CUDA kernels of the fused batch norm (op_batch_norm, formulas in core/batch_norm.h), f32/f16/bf16 computing
// in f32. The training forward and backward run through cuDNN's batch normalisation (spatial mode) when
// frugal is built with it and cuDNN takes the configuration; otherwise, and always in eval mode, through the
// kernels below: one block per channel, reading the channel's n planes twice (the mean, then the centred
// squares; or the two gradient sums) and writing y or dx in a third pass, the sums merged in f32 in a fixed
// order (deterministic). One block per channel leaves most of a large GPU idle when there are few channels;
// splitting a channel's sums over blocks is left for when W2 is timed on a GPU.
#include "core/batch_norm.h"
#include "core/storage.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/conv.h"
#include "kernels/cuda/types.cuh"

#ifdef FRUGAL_HAVE_CUDNN
#include <atomic>
#include <climits>

#include "kernels/cuda/cudnn_util.h"
#endif

namespace frugal {
namespace {

constexpr int kThreads = 512;

// Offset of the e-th of a channel's n * hw elements.
__device__ __forceinline__ int64_t channel_offset(const BatchNormArgs& a, int64_t k, int64_t e) {
  const int64_t i = e / a.hw;
  return (i * a.c + k) * a.hw + (e - i * a.hw);
}

struct Sums {
  float a, b;
};

template <typename T>
__global__ void batch_norm_forward_kernel(BatchNormArgs a) {
  __shared__ Sums scratch[32];
  const int64_t k = blockIdx.x, m = a.n * a.hw;
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  float* means = static_cast<float*>(a.mean);
  float* invstds = static_cast<float*>(a.invstd);
  const auto plus = [](Sums p, Sums q) { return Sums{p.a + q.a, p.b + q.b}; };
  const float inv_m = 1.0f / float(m);
  float mu, is;
  if (a.training) {
    Sums s{0, 0};
    for (int64_t e = threadIdx.x; e < m; e += blockDim.x) s.a += gpu::load(x[channel_offset(a, k, e)]);
    mu = gpu::block_merge(s, plus, scratch).a * inv_m;
    s = Sums{0, 0};
    for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
      const float d = gpu::load(x[channel_offset(a, k, e)]) - mu;
      s.a += d * d;
    }
    is = 1.0f / sqrtf(gpu::block_merge(s, plus, scratch).a * inv_m + float(a.eps));
    if (threadIdx.x == 0) {
      means[k] = mu;
      invstds[k] = is;
    }
  } else {
    mu = means[k];
    is = invstds[k];
  }
  const float scale = a.weight ? is * static_cast<const float*>(a.weight)[k] : is;
  const float shift = a.bias ? static_cast<const float*>(a.bias)[k] : 0.0f;
  for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
    const int64_t off = channel_offset(a, k, e);
    y[off] = gpu::store<T>((gpu::load(x[off]) - mu) * scale + shift);
  }
}

template <typename T>
__global__ void batch_norm_backward_kernel(BatchNormArgs a) {
  __shared__ Sums scratch[32];
  const int64_t k = blockIdx.x, m = a.n * a.hw;
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.dy);
  const float mu = static_cast<const float*>(a.mean)[k], is = static_cast<const float*>(a.invstd)[k];
  Sums s{0, 0};  // sum dy, sum dy xh
  for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
    const int64_t off = channel_offset(a, k, e);
    const float d = gpu::load(dy[off]);
    s.a += d;
    s.b += d * (gpu::load(x[off]) - mu) * is;
  }
  s = gpu::block_merge(
      s,
      [](Sums p, Sums q) {
        return Sums{p.a + q.a, p.b + q.b};
      },
      scratch);
  if (threadIdx.x == 0) {
    if (a.dweight) static_cast<float*>(a.dweight)[k] = s.b;
    if (a.dbias) static_cast<float*>(a.dbias)[k] = s.a;
  }
  if (!a.dx) return;
  T* dx = static_cast<T*>(a.dx);
  const float inv_m = 1.0f / float(m);
  const float scale = a.weight ? is * static_cast<const float*>(a.weight)[k] : is;
  const float mean_dy = a.training ? s.a * inv_m : 0.0f, mean_dy_xh = a.training ? s.b * inv_m : 0.0f;
  for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
    const int64_t off = channel_offset(a, k, e);
    const float xh = (gpu::load(x[off]) - mu) * is;
    dx[off] = gpu::store<T>(scale * (gpu::load(dy[off]) - mean_dy - xh * mean_dy_xh));
  }
}

void check_channels(const BatchNormArgs& a) {
  FRUGAL_CHECK_T(DeviceError, a.c <= 0x7fffffff, "batch_norm on a GPU: ", a.c,
                 " channels exceed the grid's limit of 2^31 - 1 blocks");
}

#ifdef FRUGAL_HAVE_CUDNN

std::atomic<bool> use_cudnn{true};

// ones [c] then zeros [c]: cuDNN's scale and bias where the layer has none.
__global__ void ones_zeros_kernel(float* p, int64_t c) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < 2 * c;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = i < c ? 1.0f : 0.0f;
}

// cuDNN's status for a configuration it does not support is an answer (use the kernels above), not an error.
bool supported(cudnnStatus_t status, const char* call, int line) {
  if (status == CUDNN_STATUS_NOT_SUPPORTED) return false;
  gpu::check_cudnn(status, call, __FILE__, line);
  return true;
}
#define FRUGAL_CUDNN_SUPPORTED(call) supported((call), #call, __LINE__)

// Training forward or backward through cuDNN; false (nothing written) where it does not apply.
bool cudnn_batch_norm(DType dtype, const BatchNormArgs& a, bool backward) {
  if (!use_cudnn.load(std::memory_order_relaxed) || !a.training || a.eps < CUDNN_BN_MIN_EPSILON) return false;
  if (backward && !a.dx) return false;  // cuDNN always writes dx; the kernel above can skip it
  if (a.n > INT_MAX || a.c > INT_MAX || a.hw > INT_MAX || a.n * a.c * a.hw > INT_MAX) return false;
  gpu::LaunchOn on(backward ? a.dx : a.y);
  gpu::TensorDesc xd, pd;
  xd.set(dtype, int(a.n), int(a.c), int(a.hw), 1);
  FRUGAL_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(pd.d, xd.d, CUDNN_BATCHNORM_SPATIAL));
  // Scratch from the arena: ones and zeros for a missing weight or bias, and the parameter gradients the
  // caller does not want.
  const bool need_defaults = !a.weight || (!backward && !a.bias);
  const bool need_grads = backward && (!a.dweight || !a.dbias);
  Storage scratch(int64_t(sizeof(float)) * 2 * a.c * (int64_t(need_defaults) + int64_t(need_grads)) + 1,
                  cuda(on.device));
  float* defaults = static_cast<float*>(scratch.data());
  float* grads = defaults + (need_defaults ? 2 * a.c : 0);
  if (need_defaults) {
    ones_zeros_kernel<<<gpu::grid_for(2 * a.c, 256, on.device), 256, 0, on.stream>>>(defaults, a.c);
    FRUGAL_CUDA_CHECK_LAUNCH("ones_zeros_kernel");
  }
  const void* scale = a.weight ? a.weight : defaults;
  const void* bias = a.bias ? a.bias : defaults + a.c;
  const float one = 1, zero = 0;
  const gpu::CudnnHandle h = gpu::cudnn_handle(on.device, on.stream);
  if (!backward)
    return FRUGAL_CUDNN_SUPPORTED(cudnnBatchNormalizationForwardTraining(
        h.handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd.d, a.x, xd.d, a.y, pd.d, scale, bias, 0.0, nullptr,
        nullptr, a.eps, a.mean, a.invstd));
  void* dw = a.dweight ? a.dweight : grads;
  void* db = a.dbias ? a.dbias : grads + a.c;
  return FRUGAL_CUDNN_SUPPORTED(
      cudnnBatchNormalizationBackward(h.handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, xd.d, a.x,
                                      xd.d, a.dy, xd.d, a.dx, pd.d, scale, dw, db, a.eps, a.mean, a.invstd));
}

#undef FRUGAL_CUDNN_SUPPORTED

#endif  // FRUGAL_HAVE_CUDNN

template <typename T>
void batch_norm_forward_cuda(const BatchNormArgs& a) {
  check_channels(a);
#ifdef FRUGAL_HAVE_CUDNN
  if (cudnn_batch_norm(dtype_v<T>, a, false)) return;
#endif
  gpu::LaunchOn on(a.y);
  batch_norm_forward_kernel<T><<<unsigned(a.c), kThreads, 0, on.stream>>>(a);
  FRUGAL_CUDA_CHECK_LAUNCH("batch_norm_forward_kernel");
}

template <typename T>
void batch_norm_backward_cuda(const BatchNormArgs& a) {
  check_channels(a);
#ifdef FRUGAL_HAVE_CUDNN
  if (cudnn_batch_norm(dtype_v<T>, a, true)) return;
#endif
  gpu::LaunchOn on(a.x);
  batch_norm_backward_kernel<T><<<unsigned(a.c), kThreads, 0, on.stream>>>(a);
  FRUGAL_CUDA_CHECK_LAUNCH("batch_norm_backward_kernel");
}

[[maybe_unused]] const bool kRegistered = [] {
  gpu::for_types(gpu::Floating{}, [](auto t) {
    using T = decltype(t);
    op_batch_norm.set(DeviceType::CUDA, dtype_v<T>, batch_norm_forward_cuda<T>);
    op_batch_norm_backward.set(DeviceType::CUDA, dtype_v<T>, batch_norm_backward_cuda<T>);
  });
  return true;
}();

}  // namespace

#ifdef FRUGAL_HAVE_CUDNN
void set_cuda_batch_norm_cudnn(bool use) { use_cudnn.store(use); }
#else
void set_cuda_batch_norm_cudnn(bool) {}
#endif

}  // namespace frugal
