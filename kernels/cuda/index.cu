// CUDA indexing over [outer, dim_size, inner] layouts (IndexArgs in core/op_table.h), and the segment sums of
// sparse rows (SegmentSumArgs). One thread per output element; scatter_add and index_add (the dense
// embedding backward) accumulate with atomics, so equal indices add in an unspecified order (sums of floats
// may differ from the CPU's in the last bits).
#include "core/op_table_index.h"
#include "core/op_table_sparse.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/types.cuh"

namespace frugal {
namespace {

using gpu::for_types;

template <typename T>
__global__ void index_select_kernel(IndexArgs a, int64_t total) {
  const T* x = static_cast<const T*>(a.x);
  T* out = static_cast<T*>(a.out);
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < total; p += step) {
    const int64_t j = p % a.inner, row = p / a.inner, i = row % a.n_index, o = row / a.n_index;
    out[p] = x[(o * a.dim_size + a.index[i]) * a.inner + j];
  }
}

template <typename T>
__global__ void gather_kernel(IndexArgs a, int64_t total) {
  const T* x = static_cast<const T*>(a.x);
  T* out = static_cast<T*>(a.out);
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < total; p += step) {
    const int64_t j = p % a.inner, o = p / (a.n_index * a.inner);
    out[p] = x[(o * a.dim_size + a.index[p]) * a.inner + j];
  }
}

// dst += v, atomically, for each stored type (16-bit floats through CUDA's own types; 64-bit integers as
// unsigned, which wraps the same way).
__device__ __forceinline__ void atomic_add(float* dst, float v) { atomicAdd(dst, v); }
__device__ __forceinline__ void atomic_add(Half* dst, Half v) {
  atomicAdd(reinterpret_cast<__half*>(dst), __ushort_as_half(v.bits));
}
__device__ __forceinline__ void atomic_add(BFloat16* dst, BFloat16 v) {
  atomicAdd(reinterpret_cast<__nv_bfloat16*>(dst), __ushort_as_bfloat16(v.bits));
}
__device__ __forceinline__ void atomic_add(int32_t* dst, int32_t v) { atomicAdd(dst, v); }
__device__ __forceinline__ void atomic_add(int64_t* dst, int64_t v) {
  atomicAdd(reinterpret_cast<unsigned long long*>(dst), static_cast<unsigned long long>(v));
}

template <typename T>
__global__ void scatter_add_kernel(IndexArgs a, int64_t total) {
  const T* src = static_cast<const T*>(a.src);
  T* out = static_cast<T*>(a.out);
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < total; p += step) {
    const int64_t j = p % a.inner, o = p / (a.n_index * a.inner);
    atomic_add(out + (o * a.dim_size + a.index[p]) * a.inner + j, src[p]);
  }
}

// out[o, index[i], j] += src[o, i, j] over src [outer, n_index, inner] (index 1-d).
template <typename T>
__global__ void index_add_kernel(IndexArgs a, int64_t total) {
  const T* src = static_cast<const T*>(a.src);
  T* out = static_cast<T*>(a.out);
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < total; p += step) {
    const int64_t j = p % a.inner, row = p / a.inner, i = row % a.n_index, o = row / a.n_index;
    atomic_add(out + (o * a.dim_size + a.index[i]) * a.inner + j, src[p]);
  }
}

template <typename T, void (*kKernel)(IndexArgs, int64_t)>
void index_cuda(const IndexArgs& a) {
  const int64_t total = a.outer * a.n_index * a.inner;
  if (total == 0) return;
  gpu::LaunchOn on(a.out);
  kKernel<<<gpu::grid_for(total, 256, on.device), 256, 0, on.stream>>>(a, total);
  FRUGAL_CUDA_CHECK_LAUNCH("an index kernel");
}

// values [n, dim], order [n], starts [segments + 1] -> out [segments, dim]: one thread per output element,
// summing its segment's rows in order, in the compute type.
template <typename T>
__global__ void segment_sum_rows_kernel(SegmentSumArgs a) {
  const T* values = static_cast<const T*>(a.values);
  T* out = static_cast<T*>(a.out);
  const int64_t total = a.segments * a.dim, step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < total; p += step) {
    const int64_t s = p / a.dim, j = p % a.dim;
    acc_t<T> acc = 0;
    for (int64_t k = a.starts[s]; k < a.starts[s + 1]; ++k) acc += gpu::load(values[a.order[k] * a.dim + j]);
    out[p] = gpu::store<T>(acc);
  }
}

template <typename T>
void segment_sum_rows_cuda(const SegmentSumArgs& a) {
  const int64_t total = a.segments * a.dim;
  if (total == 0) return;
  gpu::LaunchOn on(a.out);
  segment_sum_rows_kernel<T><<<gpu::grid_for(total, 256, on.device), 256, 0, on.stream>>>(a);
  FRUGAL_CUDA_CHECK_LAUNCH("segment_sum_rows_kernel");
}

const bool kRegistered = [] {
  for_types(gpu::AllTypes{}, [](auto t) {
    using T = decltype(t);
    op_index_select.set(DeviceType::CUDA, dtype_v<T>, index_cuda<T, index_select_kernel<T>>);
    op_gather.set(DeviceType::CUDA, dtype_v<T>, index_cuda<T, gather_kernel<T>>);
  });
  for_types(gpu::Types<float, Half, BFloat16, int64_t, int32_t>{}, [](auto t) {
    using T = decltype(t);
    op_scatter_add.set(DeviceType::CUDA, dtype_v<T>, index_cuda<T, scatter_add_kernel<T>>);
    op_index_add.set(DeviceType::CUDA, dtype_v<T>, index_cuda<T, index_add_kernel<T>>);
  });
  for_types(gpu::Floating{}, [](auto t) {
    using T = decltype(t);
    op_segment_sum_rows.set(DeviceType::CUDA, dtype_v<T>, segment_sum_rows_cuda<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
