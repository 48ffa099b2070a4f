// CUDA 2-D transposing copy (op_transpose2d, TransposeArgs in core/op_table.h): 32 x 32 tiles through shared
// memory (padded against bank conflicts), so that both the reads of `in` and the writes of `out` run along
// rows. The elements move as unsigned words of their size (one kernel per size, and no constructor in shared
// memory for f16/bf16).
#include <cstdint>
#include <type_traits>

#include "core/op_table_copy.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/types.cuh"

namespace frugal {
namespace {

constexpr int kTile = 32, kRowsPerPass = 8;

// Block (32, 8), grid (column tiles, row tiles): the block reads in[rows of its tile][columns of its tile]
// and writes them as out[columns][rows].
template <typename T>
__global__ void transpose2d_kernel(const T* in, T* out, int64_t rows, int64_t cols, int64_t in_stride) {
  __shared__ T tile[kTile][kTile + 1];
  const int64_t c0 = int64_t(blockIdx.x) * kTile, r0 = int64_t(blockIdx.y) * kTile;
  for (int y = threadIdx.y; y < kTile; y += kRowsPerPass) {
    const int64_t r = r0 + y, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[y][threadIdx.x] = in[r * in_stride + c];
  }
  __syncthreads();
  for (int y = threadIdx.y; y < kTile; y += kRowsPerPass) {
    const int64_t c = c0 + y, r = r0 + threadIdx.x;  // out row c, column r
    if (r < rows && c < cols) out[c * rows + r] = tile[threadIdx.x][y];
  }
}

template <size_t kBytes>
using Word = std::conditional_t<
    kBytes == 1, uint8_t,
    std::conditional_t<kBytes == 2, uint16_t, std::conditional_t<kBytes == 4, uint32_t, uint64_t>>>;

template <typename T>
void transpose2d_cuda(const TransposeArgs& a) {
  using W = Word<sizeof(T)>;
  static_assert(sizeof(W) == sizeof(T));
  if (a.rows == 0 || a.cols == 0) return;
  const int64_t gx = (a.cols + kTile - 1) / kTile, gy = (a.rows + kTile - 1) / kTile;
  FRUGAL_CHECK_T(DeviceError, gx <= 0x7fffffff && gy <= 65535, "transpose2d: a ", a.rows, " x ", a.cols,
                 " matrix exceeds the CUDA grid");
  gpu::LaunchOn on(a.in);
  transpose2d_kernel<W><<<dim3(unsigned(gx), unsigned(gy)), dim3(kTile, kRowsPerPass), 0, on.stream>>>(
      static_cast<const W*>(a.in), static_cast<W*>(a.out), a.rows, a.cols, a.in_stride);
  FRUGAL_CUDA_CHECK_LAUNCH("transpose2d_kernel");
}

const bool kRegistered = [] {
  gpu::for_types(gpu::AllTypes{}, [](auto t) {
    using T = decltype(t);
    op_transpose2d.set(DeviceType::CUDA, dtype_v<T>, transpose2d_cuda<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
