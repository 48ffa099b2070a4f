// The launch machinery of the elementwise kernels (elementwise_*.cu): one output and up to three inputs laid
// out by a Loop (core/loop.h). When every operand is contiguous along the innermost dim (or constant along
// it: a scalar, a row broadcast down a matrix) and aligned, each thread loads and stores 16 bytes at a time;
// otherwise each thread walks the loop's strides one element at a time.
//
//   launch_elementwise<float, float, float>(loop, BinaryFn<float, math::Add>{}, "add");
#pragma once

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "core/loop.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/types.cuh"
#include "kernels/cuda/vector_plan.h"

namespace frugal::gpu {

// The loop as a kernel argument (plain arrays: std::array is not for device code).
struct Operands {
  int ndim = 0;
  bool small = false;  // every size and index fits 32 bits: cheaper index arithmetic
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxOperands][kMaxDims] = {};  // bytes
  char* data[kMaxOperands] = {};
};

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// The byte offsets of element i in each of the n operands.
template <typename I>
__device__ __forceinline__ void offsets_of(const Operands& L, int nops, I i, int64_t* off) {
  for (int k = 0; k < nops; ++k) off[k] = 0;
  for (int d = L.ndim - 1; d >= 0; --d) {
    const I size = I(L.sizes[d]);
    const I q = i / size, r = i - q * size;
    i = q;
    for (int k = 0; k < nops; ++k) off[k] += int64_t(r) * L.strides[k][d];
  }
}

template <typename T>
__device__ __forceinline__ T at(const char* base, int64_t off) {
  return *reinterpret_cast<const T*>(base + off);
}

template <int N, typename Out, typename I0, typename I1, typename I2, typename F>
__global__ void elementwise_strided_kernel(Operands L, int64_t n, F f) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t off[kMaxOperands];
    if (L.small)
      offsets_of<uint32_t>(L, N + 1, uint32_t(i), off);
    else
      offsets_of<int64_t>(L, N + 1, i, off);
    Out* out = reinterpret_cast<Out*>(L.data[0] + off[0]);
    if constexpr (N == 0) *out = f();
    if constexpr (N == 1) *out = f(at<I0>(L.data[1], off[1]));
    if constexpr (N == 2) *out = f(at<I0>(L.data[1], off[1]), at<I1>(L.data[2], off[2]));
    if constexpr (N == 3)
      *out = f(at<I0>(L.data[1], off[1]), at<I1>(L.data[2], off[2]), at<I2>(L.data[3], off[3]));
  }
}

// The VEC elements of an input from byte `off`, or its one element there VEC times when the input does not
// move along the innermost dim (a scalar, or a row broadcast down the columns).
template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> load_vec(const char* data, int64_t off, bool repeat) {
  if (repeat) {
    Vec<T, VEC> r;
    const T v = *reinterpret_cast<const T*>(data + off);
    for (int j = 0; j < VEC; ++j) r.v[j] = v;
    return r;
  }
  return *reinterpret_cast<const Vec<T, VEC>*>(data + off);
}

// Each thread takes VEC consecutive elements of the innermost dim at a time: one index decomposition and one
// 16-byte access per operand for VEC elements. The host has checked that every vector is aligned and that
// the innermost size is a multiple of VEC, except for a 1-D loop, whose last n % VEC elements go one by one.
template <int VEC, int N, typename Out, typename I0, typename I1, typename I2, typename F>
__global__ void elementwise_vector_kernel(Operands L, int64_t n, unsigned repeats, F f) {
  const int64_t vectors = n / VEC, step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += step) {
    int64_t off[kMaxOperands];
    if (L.ndim == 1) {
      for (int k = 0; k <= N; ++k) off[k] = v * VEC * L.strides[k][0];
    } else if (L.small) {
      offsets_of<uint32_t>(L, N + 1, uint32_t(v * VEC), off);
    } else {
      offsets_of<int64_t>(L, N + 1, v * VEC, off);
    }
    Vec<I0, VEC> a;
    Vec<I1, VEC> b;
    Vec<I2, VEC> c;
    if constexpr (N >= 1) a = load_vec<I0, VEC>(L.data[1], off[1], repeats & 1u);
    if constexpr (N >= 2) b = load_vec<I1, VEC>(L.data[2], off[2], repeats & 2u);
    if constexpr (N >= 3) c = load_vec<I2, VEC>(L.data[3], off[3], repeats & 4u);
    Vec<Out, VEC> r;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      if constexpr (N == 0) r.v[j] = f();
      if constexpr (N == 1) r.v[j] = f(a.v[j]);
      if constexpr (N == 2) r.v[j] = f(a.v[j], b.v[j]);
      if constexpr (N == 3) r.v[j] = f(a.v[j], b.v[j], c.v[j]);
    }
    *reinterpret_cast<Vec<Out, VEC>*>(L.data[0] + off[0]) = r;
  }
  // The ragged tail of a 1-D loop, one element per thread of the first block.
  const int64_t i = vectors * VEC + threadIdx.x;
  if (blockIdx.x == 0 && i < n) {
    auto in = [&](int k, auto tag) { return at<decltype(tag)>(L.data[k + 1], i * L.strides[k + 1][0]); };
    Out* out = reinterpret_cast<Out*>(L.data[0] + i * L.strides[0][0]);
    if constexpr (N == 0) *out = f();
    if constexpr (N == 1) *out = f(in(0, I0{}));
    if constexpr (N == 2) *out = f(in(0, I0{}), in(1, I1{}));
    if constexpr (N == 3) *out = f(in(0, I0{}), in(1, I1{}), in(2, I2{}));
  }
}

// Runs f over the loop: out (operand 0) of type Out, inputs of types In... (at most three). f maps stored
// input elements to a stored output element.
template <typename Out, typename... In, typename F>
void launch_elementwise(const Loop& loop, F f, const char* name) {
  constexpr int N = int(sizeof...(In));
  static_assert(N <= 3, "at most three inputs");
  using I0 = std::tuple_element_t<0, std::tuple<In..., char, char, char>>;
  using I1 = std::tuple_element_t<1, std::tuple<In..., char, char, char>>;
  using I2 = std::tuple_element_t<2, std::tuple<In..., char, char, char>>;
  const int64_t n = loop.numel;
  if (n == 0) return;
  LaunchOn on(loop.data[0]);
  Operands L;
  L.ndim = loop.ndim;
  L.small = n <= INT32_MAX;
  for (int d = 0; d < loop.ndim; ++d) {
    L.sizes[d] = loop.sizes[size_t(d)];
    for (int k = 0; k <= N; ++k) L.strides[k][d] = loop.strides[size_t(k)][size_t(d)];
  }
  for (int k = 0; k <= N; ++k) L.data[k] = loop.data[size_t(k)];

  // 16-byte accesses for the widest operand; narrower ones move fewer bytes per thread.
  constexpr size_t kWidest = std::max({sizeof(Out), sizeof(In)...});
  constexpr int VEC = int(16 / kWidest) > 0 ? int(16 / kWidest) : 1;
  constexpr size_t kSizes[4] = {sizeof(Out), sizeof(I0), sizeof(I1), sizeof(I2)};
  const VectorPlan plan = plan_vectors(loop, VEC, kSizes, N + 1);
  constexpr int kThreads = 256;
  if (plan.vectorizable) {
    elementwise_vector_kernel<VEC, N, Out, I0, I1, I2>
        <<<grid_for(std::max<int64_t>(n / VEC, 1), kThreads, on.device), kThreads, 0, on.stream>>>(
            L, n, plan.repeats, f);
  } else {
    elementwise_strided_kernel<N, Out, I0, I1, I2>
        <<<grid_for(n, kThreads, on.device), kThreads, 0, on.stream>>>(L, n, f);
  }
  check(cudaGetLastError(), name, __FILE__, __LINE__);
}

// The dtype classes of core/op_list.h on the GPU: no f64 arithmetic, and no u8 arithmetic.
using floating_types = Floating;
using signed_numeric_types = Types<float, Half, BFloat16, int64_t, int32_t>;
using numeric_types = signed_numeric_types;
using all_types = Types<float, Half, BFloat16, int64_t, int32_t, uint8_t, bool>;

// Adapters from the compute-type math (kernels/math.h) to stored elements.
template <typename T, typename Op>
struct UnaryFn {
  Op op;
  __device__ T operator()(T x) const { return store<T>(op(load(x))); }
};
template <typename T, typename Op>
struct BinaryFn {
  Op op;
  __device__ T operator()(T x, T y) const { return store<T>(op(load(x), load(y))); }
};

}  // namespace frugal::gpu
