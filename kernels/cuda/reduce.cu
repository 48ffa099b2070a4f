// CUDA reductions (FRUGAL_REDUCE_OPS in core/op_table.h) over the kept and reduced dims ReduceArgs
// describes. One kernel for every op: a block of bx x by threads takes bx outputs and splits each output's
// reduced elements over by threads (and over gridDim.y blocks when there are few outputs but many elements,
// merged by a second kernel); the states and their merges are kernels/cuda/math.h's. When the reduced
// elements of an output are contiguous, by runs along them (bx = 1, coalesced); when the outputs are
// contiguous (a column sum such as a bias gradient), bx runs along the outputs.
#include <algorithm>

#include "core/op_table_reduce.h"
#include "core/storage.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/types.cuh"

namespace frugal {
namespace {

using gpu::for_types;

struct Layout {
  int kept_ndim = 0, red_ndim = 0;
  int64_t kept_sizes[kMaxDims] = {}, kept_strides[kMaxDims] = {};
  int64_t red_sizes[kMaxDims] = {}, red_strides[kMaxDims] = {};
  int64_t n_out = 1, n_reduce = 1;
};

// Element offset of index i in a row-major walk of (sizes, strides).
__device__ __forceinline__ int64_t offset_of(int64_t i, int ndim, const int64_t* sizes,
                                             const int64_t* strides) {
  if (ndim == 1) return i * strides[0];
  int64_t off = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    const int64_t q = i / sizes[d];
    off += (i - q * sizes[d]) * strides[d];
    i = q;
  }
  return off;
}

// What each op reduces to: the state (R), the output element (Out) and the final value of a state.
template <typename T>
using SumAcc = std::conditional_t<std::is_floating_point_v<acc_t<T>>, float, int64_t>;
template <typename T>
struct SumOp {
  using R = math::SumReduce<SumAcc<T>>;
  using Out = std::conditional_t<std::is_floating_point_v<acc_t<T>>, T, int64_t>;
  __device__ static Out finish(SumAcc<T> s, double) { return gpu::store<Out>(s); }
};
template <typename T, bool kMax>
struct ExtremeOp {
  using R = math::ExtremeReduce<acc_t<T>, kMax>;
  using Out = T;
  __device__ static Out finish(acc_t<T> s, double) { return gpu::store<T>(s); }
};
template <typename T, bool kMax>
struct ArgOp {
  using R = math::ArgReduce<acc_t<T>, kMax>;
  using Out = int64_t;
  __device__ static Out finish(math::ArgState<acc_t<T>> s, double) { return s.index; }
};
template <typename T>
struct VarOp {
  using R = math::VarReduce;
  using Out = T;
  __device__ static Out finish(math::VarState s, double correction) {
    return gpu::store<T>(acc_t<T>(math::variance(s, correction)));
  }
};

// Block (bx, by), grid (ceil(n_out / bx), chunks): thread (x, y) of block (bx_i, c) folds the elements
// c * chunk_len + y, + by, ... of output bx_i * bx + x; the by states of each output then merge in shared
// memory. With one chunk the result is written; otherwise the merged state goes to partial[out * chunks + c].
template <typename T, typename Op>
__global__ void reduce_kernel(const T* in, Layout L, int64_t chunk_len, typename Op::R::Acc* partial,
                              typename Op::Out* out, double correction) {
  using Acc = typename Op::R::Acc;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Acc* smem = reinterpret_cast<Acc*>(smem_raw);
  const typename Op::R r;
  const int bx = blockDim.x, by = blockDim.y, x = threadIdx.x, y = threadIdx.y;
  const int64_t o = int64_t(blockIdx.x) * bx + x;
  Acc acc = r.identity();
  if (o < L.n_out) {
    const T* base = in + offset_of(o, L.kept_ndim, L.kept_sizes, L.kept_strides);
    const int64_t begin = int64_t(blockIdx.y) * chunk_len;
    const int64_t end = begin + chunk_len < L.n_reduce ? begin + chunk_len : L.n_reduce;
    for (int64_t i = begin + y; i < end; i += by)
      acc = r.merge(acc, r.take(gpu::load(base[offset_of(i, L.red_ndim, L.red_sizes, L.red_strides)]), i));
  }
  smem[y * bx + x] = acc;
  __syncthreads();
  for (int s = by / 2; s > 0; s >>= 1) {  // by is a power of two
    if (y < s) smem[y * bx + x] = r.merge(smem[y * bx + x], smem[(y + s) * bx + x]);
    __syncthreads();
  }
  if (y == 0 && o < L.n_out) {
    if (gridDim.y == 1)
      out[o] = Op::finish(smem[x], correction);
    else
      partial[o * gridDim.y + blockIdx.y] = smem[x];
  }
}

// One thread per output merges its chunks' states in order.
template <typename Op>
__global__ void reduce_finish_kernel(const typename Op::R::Acc* partial, int64_t n_out, int chunks,
                                     typename Op::Out* out, double correction) {
  const typename Op::R r;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < n_out; o += step) {
    auto acc = r.identity();
    for (int c = 0; c < chunks; ++c) acc = r.merge(acc, partial[o * chunks + c]);
    out[o] = Op::finish(acc, correction);
  }
}

template <typename T, typename Op>
void reduce_cuda(const ReduceArgs& a) {
  using Acc = typename Op::R::Acc;
  Layout L;
  L.kept_ndim = a.kept_ndim;
  L.red_ndim = a.red_ndim;
  for (int d = 0; d < kMaxDims; ++d) {
    L.kept_sizes[d] = a.kept_sizes[d];
    L.kept_strides[d] = a.kept_strides[d];
    L.red_sizes[d] = a.red_sizes[d];
    L.red_strides[d] = a.red_strides[d];
  }
  L.n_out = a.n_out;
  L.n_reduce = a.n_reduce;
  gpu::LaunchOn on(a.in);

  // Outputs along x when they are contiguous and the reduced elements are not, or when there are many short
  // reductions; otherwise the reduced elements along y, 256 threads deep.
  const bool outputs_contiguous = a.kept_ndim > 0 && a.kept_strides[a.kept_ndim - 1] == 1;
  const bool reduced_contiguous = a.red_ndim > 0 && a.red_strides[a.red_ndim - 1] == 1;
  const bool columns = (outputs_contiguous && !reduced_contiguous) || a.n_reduce < 64;
  const dim3 block = columns ? dim3(32, 8) : dim3(1, 256);
  const int64_t grid_x = (a.n_out + block.x - 1) / block.x;
  // Split each output's elements into chunks until the GPU has a few blocks per multiprocessor, each chunk
  // still a good number of elements per thread.
  const int64_t want_blocks = int64_t(gpu::multiprocessor_count(on.device)) * 4;
  int64_t chunks = 1;
  if (grid_x < want_blocks) {
    const int64_t by_work = a.n_reduce / (int64_t(block.y) * 16);
    chunks = std::max<int64_t>(1, std::min({(want_blocks + grid_x - 1) / grid_x, by_work, int64_t(65535)}));
  }
  const int64_t chunk_len = std::max<int64_t>(1, (a.n_reduce + chunks - 1) / chunks);
  chunks = std::max<int64_t>(1, (a.n_reduce + chunk_len - 1) / chunk_len);  // an empty reduction: one chunk
  FRUGAL_CHECK_T(DeviceError, grid_x <= 0x7fffffff, "reduce: ", a.n_out, " outputs exceed the CUDA grid");

  using Out = typename Op::Out;
  Out* out = reinterpret_cast<Out*>(a.out);
  const T* in = reinterpret_cast<const T*>(a.in);
  const size_t smem = sizeof(Acc) * block.x * block.y;
  if (chunks == 1) {
    reduce_kernel<T, Op>
        <<<dim3(unsigned(grid_x), 1), block, smem, on.stream>>>(in, L, chunk_len, nullptr, out, a.correction);
    FRUGAL_CUDA_CHECK_LAUNCH("reduce_kernel");
    return;
  }
  // The partial states live in the arena, on this stream, freed (and reusable by later work on the stream)
  // when this function returns.
  Storage partial(a.n_out * chunks * int64_t(sizeof(Acc)), cuda(on.device));
  Acc* states = static_cast<Acc*>(partial.data());
  reduce_kernel<T, Op><<<dim3(unsigned(grid_x), unsigned(chunks)), block, smem, on.stream>>>(
      in, L, chunk_len, states, out, a.correction);
  FRUGAL_CUDA_CHECK_LAUNCH("reduce_kernel");
  reduce_finish_kernel<Op><<<gpu::grid_for(a.n_out, 256, on.device), 256, 0, on.stream>>>(
      states, a.n_out, int(chunks), out, a.correction);
  FRUGAL_CUDA_CHECK_LAUNCH("reduce_finish_kernel");
}

const bool kRegistered = [] {
  for_types(gpu::Types<float, Half, BFloat16, int64_t, int32_t, uint8_t, bool>{}, [](auto t) {
    using T = decltype(t);
    constexpr DType dt = dtype_v<T>;
    op_sum.set(DeviceType::CUDA, dt, reduce_cuda<T, SumOp<T>>);
    op_max.set(DeviceType::CUDA, dt, reduce_cuda<T, ExtremeOp<T, true>>);
    op_min.set(DeviceType::CUDA, dt, reduce_cuda<T, ExtremeOp<T, false>>);
    op_argmax.set(DeviceType::CUDA, dt, reduce_cuda<T, ArgOp<T, true>>);
    op_argmin.set(DeviceType::CUDA, dt, reduce_cuda<T, ArgOp<T, false>>);
  });
  for_types(gpu::Floating{}, [](auto t) {
    op_var.set(DeviceType::CUDA, dtype_v<decltype(t)>, reduce_cuda<decltype(t), VarOp<decltype(t)>>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
