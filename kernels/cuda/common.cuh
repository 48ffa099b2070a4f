// What the CUDA kernel files share: loading a stored element into its compute type and storing it back (the
// 16-bit floats through CUDA's round-to-nearest-even conversions, the same rounding as core/half.h), the
// device and stream to launch on, and a block-wide merge of per-thread states.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/dtype.h"
#include "kernels/cuda/math.h"
#include "kernels/cuda/runtime.h"

namespace frugal::gpu {

// Stored element -> compute type (acc_t<T>).
template <typename T>
__device__ __forceinline__ acc_t<T> load(T v) {
  return v;
}
template <>
__device__ __forceinline__ float load(Half v) {
  return __half2float(__ushort_as_half(v.bits));
}
template <>
__device__ __forceinline__ float load(BFloat16 v) {
  return __bfloat162float(__ushort_as_bfloat16(v.bits));
}

// Compute type -> stored element.
template <typename T>
__device__ __forceinline__ T store(acc_t<T> v) {
  return v;
}
template <>
__device__ __forceinline__ Half store<Half>(float v) {
  Half h;
  h.bits = __half_as_ushort(__float2half_rn(v));
  return h;
}
template <>
__device__ __forceinline__ BFloat16 store<BFloat16>(float v) {
  BFloat16 h;
  h.bits = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  return h;
}

// Where to launch work on memory at ptr: its device (made current for the scope) and that device's current
// stream.
struct LaunchOn {
  int device;
  DeviceGuard guard;
  cudaStream_t stream;
  explicit LaunchOn(const void* ptr)
      : device(device_of(ptr)), guard(device), stream(current_stream(device)) {}
};

// Grid size for a grid-stride loop over `work` items, `threads` per block: enough blocks to fill the GPU a
// few times over, no more.
inline unsigned grid_for(int64_t work, int threads, int device) {
  const int64_t cap = int64_t(multiprocessor_count(device)) * 16;
  const int64_t want = (work + threads - 1) / threads;
  return unsigned(want < 1 ? 1 : (want > cap ? cap : want));
}

// __shfl_down_sync of any trivially copyable state, word by word.
template <typename S>
__device__ __forceinline__ S shfl_down(S v, int offset) {
  constexpr int kWords = int((sizeof(S) + 3) / 4);
  unsigned w[kWords] = {};
  memcpy(w, &v, sizeof(S));
  for (int i = 0; i < kWords; ++i) w[i] = __shfl_down_sync(0xffffffffu, w[i], offset);
  S out;
  memcpy(&out, w, sizeof(S));
  return out;
}

// Merges the per-thread states of a 1-D block (blockDim.x a multiple of 32, at most 1024) with merge(a, b);
// every thread gets the result. `scratch` holds 32 states in shared memory.
template <typename S, typename F>
__device__ S block_merge(S v, F merge, S* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int off = 16; off > 0; off >>= 1) v = merge(v, shfl_down(v, off));
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? scratch[lane] : scratch[0];
    // Lanes past the warp count repeat warp 0's state, which the merge must tolerate: only the first `warps`
    // lanes' values are merged in below.
    for (int off = 16; off > 0; off >>= 1) {
      S other = shfl_down(v, off);
      if (lane + off < warps) v = merge(v, other);
    }
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  return scratch[0];
}

}  // namespace frugal::gpu
