// CUDA kernels of QuantizedLinear (core/quant_kernels.h; Note [an int8 layer on a GPU] in nn/quant.cpp), each
// with the CPU kernel's arithmetic so that the outputs are the CPU's bit for bit:
// - op_value_range: one block's grid-stride min and max, a NaN passed over (the CPU's `x < lo ? x : lo`);
// - op_quantize_u8: one f32 product, the clamps, rounding half to even (kernels/cpu/quantize.h's
// quantize_one);
// - op_int8_linear: the s32 sums of the codes read as s8 (they are at most 127) by the s8 weights, through
//   cuBLASLt (gpu::gemm_s8) or, where it has no algorithm for the shape, a plain kernel; the zero point's
//   term per column (zero_point x the weight row's sum, exact in s32); then float(sum) x scale (+ bias, one
//   fused multiply-add, Note [an int8 output value] in kernels/cpu/quant.cpp) and the ReLU, in place.
#include <cuda_runtime.h>

#include "core/quant_kernels.h"
#include "core/storage.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"

namespace frugal {
namespace {

constexpr int kThreads = 256;

struct Range {
  float lo, hi;
};

__global__ void value_range_kernel(const float* x, int64_t n, float* lo_hi) {
  __shared__ Range scratch[32];
  Range r{0.0f, 0.0f};
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = x[i];
    r.lo = v < r.lo ? v : r.lo;
    r.hi = v > r.hi ? v : r.hi;
  }
  r = gpu::block_merge(
      r,
      [](Range a, Range b) {
        return Range{b.lo < a.lo ? b.lo : a.lo, b.hi > a.hi ? b.hi : a.hi};
      },
      scratch);
  if (threadIdx.x == 0) lo_hi[0] = r.lo, lo_hi[1] = r.hi;
}

// One block: the range is read back by the host right after (a dynamic layer's input, a batch of
// activations), so a second pass over per-block results would not pay.
void value_range_cuda(const ValueRangeArgs& a) {
  gpu::LaunchOn on(a.lo_hi);
  value_range_kernel<<<1, 1024, 0, on.stream>>>(a.x, a.n, a.lo_hi);
  FRUGAL_CUDA_CHECK_LAUNCH("value_range_kernel");
}

__global__ void quantize_u8_kernel(QuantizeU8Args a) {
  const float lo = float(-a.zero_point), hi = float(a.qmax - a.zero_point);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < a.n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v = __fmul_rn(a.x[i], a.inv_scale);
    v = v > lo ? v : lo;  // a NaN takes the lower bound, as on the CPU
    v = v < hi ? v : hi;
    a.out[i] = uint8_t(__float2int_rn(v) + a.zero_point);  // half to even, exact: |v| <= 255
  }
}

void quantize_u8_cuda(const QuantizeU8Args& a) {
  if (a.n == 0) return;
  gpu::LaunchOn on(a.out);
  quantize_u8_kernel<<<gpu::grid_for(a.n, kThreads, on.device), kThreads, 0, on.stream>>>(a);
  FRUGAL_CUDA_CHECK_LAUNCH("quantize_u8_kernel");
}

// acc[i, j] = sum_p x[i, p] w[j, p], the codes read as s8: where cuBLASLt has no algorithm (and the tests'
// check of it).
__global__ void int8_gemm_plain_kernel(const int8_t* x, const int8_t* w, int32_t* acc, int64_t m, int64_t k,
                                       int64_t n) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < m * n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / n, j = e % n;
    int32_t s = 0;
    for (int64_t p = 0; p < k; ++p) s += int32_t(x[i * k + p]) * int32_t(w[j * k + p]);
    acc[e] = s;
  }
}

// zp_sums[j] = zero_point x sum_p w[j, p]: one warp a row.
__global__ void zero_point_sums_kernel(const int8_t* w, int64_t k, int64_t n, int32_t zero_point,
                                       int32_t* zp_sums) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t j = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; j < n; j += warps) {
    int32_t s = 0;
    for (int64_t p = lane; p < k; p += 32) s += int32_t(w[j * k + p]);
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) zp_sums[j] = s * zero_point;
  }
}

// out[i, j] = fma(float(acc[i, j] - zp_sums[j]), scale[j], bias[j]) (or the product alone), then the ReLU:
// the CPU's operations; acc lies in out's bytes.
__global__ void int8_output_kernel(Int8LinearArgs a, const int32_t* zp_sums) {
  const int64_t total = a.m * a.n;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % a.n;
    const int32_t s = reinterpret_cast<const int32_t*>(a.out)[e] - zp_sums[j];
    const float v = a.bias ? __fmaf_rn(float(s), a.scale[j], a.bias[j]) : __fmul_rn(float(s), a.scale[j]);
    a.out[e] = a.relu && v < 0.0f ? 0.0f : v;
  }
}

void int8_linear_cuda(const Int8LinearArgs& a) {
  if (a.m == 0 || a.n == 0) return;
  gpu::LaunchOn on(a.out);
  static_assert(sizeof(int32_t) == sizeof(float));
  auto* acc = reinterpret_cast<int32_t*>(a.out);
  const auto* x = reinterpret_cast<const int8_t*>(a.x);  // codes of at most 127: the same numbers as s8
  if (a.k == 0) {
    FRUGAL_CUDA_CHECK(cudaMemsetAsync(acc, 0, size_t(a.m * a.n) * sizeof(int32_t), on.stream));
  } else if (!gpu::gemm_s8(x, a.w, acc, a.m, a.k, a.n)) {
    int8_gemm_plain_kernel<<<gpu::grid_for(a.m * a.n, kThreads, on.device), kThreads, 0, on.stream>>>(
        x, a.w, acc, a.m, a.k, a.n);
    FRUGAL_CUDA_CHECK_LAUNCH("int8_gemm_plain_kernel");
  }
  Storage zp_sums(a.n * int64_t(sizeof(int32_t)), cuda(on.device));  // from the arena, on this stream
  zero_point_sums_kernel<<<gpu::grid_for(a.n * 32, kThreads, on.device), kThreads, 0, on.stream>>>(
      a.w, a.k, a.n, a.x_zero_point, static_cast<int32_t*>(zp_sums.data()));
  FRUGAL_CUDA_CHECK_LAUNCH("zero_point_sums_kernel");
  int8_output_kernel<<<gpu::grid_for(a.m * a.n, kThreads, on.device), kThreads, 0, on.stream>>>(
      a, static_cast<const int32_t*>(zp_sums.data()));
  FRUGAL_CUDA_CHECK_LAUNCH("int8_output_kernel");
}

const bool kRegistered = [] {
  op_value_range.set(DeviceType::CUDA, DType::F32, value_range_cuda);
  op_quantize_u8.set(DeviceType::CUDA, DType::F32, quantize_u8_cuda);
  op_int8_linear.set(DeviceType::CUDA, DType::U8, int8_linear_cuda);
  return true;
}();

}  // namespace
}  // namespace frugal
