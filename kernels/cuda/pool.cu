// CUDA pooling kernels (op_max_pool2d, op_avg_pool2d and their backward ops; PoolArgs in core/op_table.h),
// f32/f16/bf16 computing in f32, one thread per output (forward) or input (backward) element, with the
// window math of kernels/cuda/conv_math.h that tests/cuda/test_conv_math.cpp checks against the CPU kernels.
// Written by hand in every build, cuDNN or not: cuDNN's max pooling returns no indices (the op's backward
// reads only dy and the indices), and these kernels are bound by memory traffic, where cuDNN has nothing to
// add.
//
// The average backward is a gather over the windows covering each input (deterministic, in the CPU's order).
// The max backward gets no window geometry (only the indices), so it scatters dy with atomic adds, into dx
// for f32 and into an f32 buffer rounded once for f16/bf16: where windows overlap, the order of the adds
// (and so the last bit of a sum) may vary from run to run.
#include <type_traits>

#include "core/op_table_conv.h"
#include "core/storage.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/conv_math.h"
#include "kernels/cuda/types.cuh"

namespace frugal {
namespace {

using gpu::for_types;

constexpr int kThreads = 256;

#define FRUGAL_GRID_STRIDE(k, total)                                            \
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < (total); \
       k += int64_t(gridDim.x) * blockDim.x)

template <typename T>
__global__ void max_pool_kernel(PoolArgs a, const T* x, T* y, int64_t* indices) {
  const int64_t ohw = a.oh * a.ow;
  FRUGAL_GRID_STRIDE(k, a.planes * ohw) {
    const int64_t p = k / ohw, r = k - p * ohw, oh = r / a.ow, ow = r - oh * a.ow;
    const T* plane = x + p * a.h * a.w;
    acc_t<T> best;
    int64_t at;
    math::max_window<acc_t<T>>(
        a, oh, ow, [&](int64_t i) { return gpu::load(plane[i]); }, best, at);
    y[k] = gpu::store<T>(best);
    if (indices) indices[k] = at;
  }
}

// dx (or its f32 buffer, zeroed) += dy at each index of its plane; an index outside [0, h w) adds nothing
// (-1: a window with no tap; others: the op's caller gave them, and the GPU does not report them).
template <typename T>
__global__ void max_pool_backward_kernel(PoolArgs a, const T* dy, const int64_t* indices, float* dx) {
  const int64_t ohw = a.oh * a.ow, hw = a.h * a.w;
  FRUGAL_GRID_STRIDE(k, a.planes * ohw) {
    const int64_t p = k / ohw, j = indices[k];
    if (j >= 0 && j < hw) atomicAdd(dx + p * hw + j, float(gpu::load(dy[k])));
  }
}

template <typename T>
__global__ void round_kernel(const float* in, T* out, int64_t n) {
  FRUGAL_GRID_STRIDE(k, n) { out[k] = gpu::store<T>(in[k]); }
}

template <typename T>
__global__ void avg_pool_kernel(PoolArgs a, const T* x, T* y) {
  using A = acc_t<T>;
  const int64_t ohw = a.oh * a.ow;
  FRUGAL_GRID_STRIDE(k, a.planes * ohw) {
    const int64_t p = k / ohw, r = k - p * ohw, oh = r / a.ow, ow = r - oh * a.ow;
    const T* plane = x + p * a.h * a.w;
    const math::AvgWindow win(a, oh, ow);
    A s = 0;
    for (int64_t ih = win.h0; ih < win.h1; ++ih)
      for (int64_t iw = win.w0; iw < win.w1; ++iw) s += gpu::load(plane[ih * a.w + iw]);
    y[k] = gpu::store<T>(win.divisor > 0 ? s / A(win.divisor) : A(0));
  }
}

template <typename T>
__global__ void avg_pool_backward_kernel(PoolArgs a, const T* dy, T* dx) {
  using A = acc_t<T>;
  const int64_t hw = a.h * a.w;
  FRUGAL_GRID_STRIDE(k, a.planes * hw) {
    const int64_t p = k / hw, r = k - p * hw, ih = r / a.w, iw = r - ih * a.w;
    const T* plane = dy + p * a.oh * a.ow;
    dx[k] = gpu::store<T>(
        math::avg_pool_input_grad<A>(a, ih, iw, [&](int64_t i) { return A(gpu::load(plane[i])); }));
  }
}

#undef FRUGAL_GRID_STRIDE

template <typename T>
void max_pool2d_cuda(const PoolArgs& a) {
  gpu::LaunchOn on(a.y);
  const int64_t n = a.planes * a.oh * a.ow;
  max_pool_kernel<T><<<gpu::grid_for(n, kThreads, on.device), kThreads, 0, on.stream>>>(
      a, static_cast<const T*>(a.x), static_cast<T*>(a.y), a.indices);
  FRUGAL_CUDA_CHECK_LAUNCH("max_pool_kernel");
}

template <typename T>
void max_pool2d_backward_cuda(const PoolArgs& a) {
  gpu::LaunchOn on(a.dx);
  const int64_t n_out = a.planes * a.oh * a.ow, n_in = a.planes * a.h * a.w;
  const unsigned grid = gpu::grid_for(n_out, kThreads, on.device);
  if constexpr (std::is_same_v<T, float>) {
    FRUGAL_CUDA_CHECK(cudaMemsetAsync(a.dx, 0, size_t(n_in) * sizeof(float), on.stream));
    max_pool_backward_kernel<T><<<grid, kThreads, 0, on.stream>>>(a, static_cast<const T*>(a.dy),
                                                                  a.indices_in, static_cast<float*>(a.dx));
    FRUGAL_CUDA_CHECK_LAUNCH("max_pool_backward_kernel");
  } else {
    Storage buf(n_in * int64_t(sizeof(float)), cuda(on.device));
    float* acc = static_cast<float*>(buf.data());
    FRUGAL_CUDA_CHECK(cudaMemsetAsync(acc, 0, size_t(n_in) * sizeof(float), on.stream));
    max_pool_backward_kernel<T>
        <<<grid, kThreads, 0, on.stream>>>(a, static_cast<const T*>(a.dy), a.indices_in, acc);
    FRUGAL_CUDA_CHECK_LAUNCH("max_pool_backward_kernel");
    round_kernel<T><<<gpu::grid_for(n_in, kThreads, on.device), kThreads, 0, on.stream>>>(
        acc, static_cast<T*>(a.dx), n_in);
    FRUGAL_CUDA_CHECK_LAUNCH("round_kernel");
  }
}

template <typename T>
void avg_pool2d_cuda(const PoolArgs& a) {
  gpu::LaunchOn on(a.y);
  const int64_t n = a.planes * a.oh * a.ow;
  avg_pool_kernel<T><<<gpu::grid_for(n, kThreads, on.device), kThreads, 0, on.stream>>>(
      a, static_cast<const T*>(a.x), static_cast<T*>(a.y));
  FRUGAL_CUDA_CHECK_LAUNCH("avg_pool_kernel");
}

template <typename T>
void avg_pool2d_backward_cuda(const PoolArgs& a) {
  gpu::LaunchOn on(a.dx);
  const int64_t n = a.planes * a.h * a.w;
  avg_pool_backward_kernel<T><<<gpu::grid_for(n, kThreads, on.device), kThreads, 0, on.stream>>>(
      a, static_cast<const T*>(a.dy), static_cast<T*>(a.dx));
  FRUGAL_CUDA_CHECK_LAUNCH("avg_pool_backward_kernel");
}

[[maybe_unused]] const bool kRegistered = [] {
  for_types(gpu::Floating{}, [](auto t) {
    using T = decltype(t);
    op_max_pool2d.set(DeviceType::CUDA, dtype_v<T>, max_pool2d_cuda<T>);
    op_max_pool2d_backward.set(DeviceType::CUDA, dtype_v<T>, max_pool2d_backward_cuda<T>);
    op_avg_pool2d.set(DeviceType::CUDA, dtype_v<T>, avg_pool2d_cuda<T>);
    op_avg_pool2d_backward.set(DeviceType::CUDA, dtype_v<T>, avg_pool2d_backward_cuda<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
