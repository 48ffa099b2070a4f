// CUDA kernels of the fused attention ops (formulas in core/op_table.h):
// - op_attention_softmax(_backward): one block per row of scores, the allowed prefix of the row (every key,
//   or keys j <= i when causal) folded into a running max and sum (kernels/cuda/math.h), f32 throughout.
// - op_self_attention(_backward): composed of cuBLASLt batched GEMMs (one call for every head of the batch)
//   and the same row kernels. The packed q, k, v rows [B, T, 3, H, hd] are first copied head-major into
//   [3, B, H, T, hd] (and the output back from [B, H, T, hd]) so that every head is one uniform batch stride.
//   The scores go straight into the saved probabilities (f32) and the softmax runs on them in place. For
//   f16/bf16 the products with the probabilities (P V, P^T dY) and with dS take them rounded to the dtype
//   (tensor cores), where the CPU kernel keeps them in f32: results agree within the dtype's tolerance.
//   Scratch comes from the arena on the stream (the op layer's per-thread workspace is the CPU's).
// - op_self_attention(_backward)_low_probs (f16/bf16): the probabilities are saved in the dtype. The forward
//   computes them in f32 scratch, rounds them into the saved ones, and takes Y = P V from the f32 ones (V
//   converted to f32, an f32 product), as the CPU kernel does; the backward is op_self_attention_backward's
//   with the saved probabilities read as they are (the products with P take them in the dtype anyway).
#include <algorithm>

#include "core/op_table_attention.h"
#include "core/op_table_linalg.h"
#include "core/storage.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/types.cuh"

namespace frugal {
namespace {

using MaxSum = math::MaxSum<float>;
struct MergeMaxSum {
  __device__ MaxSum operator()(MaxSum a, MaxSum b) const { return math::max_sum_merge(a, b); }
};
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};

int threads_for(int64_t cols) {
  int t = 32;
  while (t < 512 && int64_t(t) * 4 < cols) t *= 2;
  return t;
}
unsigned grid_for_rows(int64_t rows) { return unsigned(std::min<int64_t>(rows, 65535 * 32)); }

// The keys query row r may see.
__device__ __forceinline__ int64_t allowed(int64_t r, int64_t t, bool causal) {
  return causal ? r % t + 1 : t;
}

// x [rows, t] -> y [rows, t] (and y2, the same values in a second dtype, unless null). y may alias x: each
// thread reads and writes only its own elements, and reads them all before the block's merge.
template <typename In, typename Out, typename Out2>
__global__ void attention_softmax_kernel(const In* xs, Out* ys, Out2* y2s, int64_t rows, int64_t t,
                                         float scale, bool causal) {
  __shared__ MaxSum scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const In* x = xs + r * t;
    const int64_t n = allowed(r, t, causal);
    MaxSum s{-INFINITY, 0.0f};
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s = math::max_sum_take(s, scale * gpu::load(x[j]));
    s = gpu::block_merge(s, MergeMaxSum{}, scratch);
    const float inv = 1.0f / s.sum;
    for (int64_t j = threadIdx.x; j < t; j += blockDim.x) {
      const float v = j < n ? expf(scale * gpu::load(x[j]) - s.max) * inv : 0.0f;
      ys[r * t + j] = gpu::store<Out>(v);
      if (y2s) y2s[r * t + j] = gpu::store<Out2>(v);
    }
  }
}

// y, dy [rows, t] -> dx [rows, t]; dx may alias dy (as above).
template <typename Y, typename DY, typename DX>
__global__ void attention_softmax_backward_kernel(const Y* ys, const DY* dys, DX* dxs, int64_t rows,
                                                  int64_t t, float scale, bool causal) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const Y* y = ys + r * t;
    const DY* dy = dys + r * t;
    const int64_t n = allowed(r, t, causal);
    float dot = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) dot += gpu::load(y[j]) * gpu::load(dy[j]);
    dot = gpu::block_merge(dot, Add{}, scratch);
    for (int64_t j = threadIdx.x; j < t; j += blockDim.x) {
      const float v =
          j < n ? math::attention_softmax_dx(gpu::load(y[j]), gpu::load(dy[j]), dot, scale) : 0.0f;
      dxs[r * t + j] = gpu::store<DX>(v);
    }
  }
}

template <typename In, typename Out, typename Out2>
void launch_softmax(const In* x, Out* y, Out2* y2, int64_t rows, int64_t t, double scale, bool causal,
                    cudaStream_t stream) {
  attention_softmax_kernel<In, Out, Out2>
      <<<grid_for_rows(rows), threads_for(t), 0, stream>>>(x, y, y2, rows, t, float(scale), causal);
  FRUGAL_CUDA_CHECK_LAUNCH("attention_softmax_kernel");
}

template <typename Y, typename DY, typename DX>
void launch_softmax_backward(const Y* y, const DY* dy, DX* dx, int64_t rows, int64_t t, double scale,
                             bool causal, cudaStream_t stream) {
  attention_softmax_backward_kernel<Y, DY, DX>
      <<<grid_for_rows(rows), threads_for(t), 0, stream>>>(y, dy, dx, rows, t, float(scale), causal);
  FRUGAL_CUDA_CHECK_LAUNCH("attention_softmax_backward_kernel");
}

template <typename T>
void attention_softmax_cuda(const AttentionSoftmaxArgs& a) {
  gpu::LaunchOn on(a.x);
  launch_softmax(static_cast<const T*>(a.x), static_cast<T*>(a.y), static_cast<T*>(nullptr), a.rows, a.t,
                 a.scale, a.causal, on.stream);
}

template <typename T>
void attention_softmax_backward_cuda(const AttentionSoftmaxArgs& a) {
  gpu::LaunchOn on(a.y);
  launch_softmax_backward(static_cast<const T*>(a.y), static_cast<const T*>(a.dy), static_cast<T*>(a.dx),
                          a.rows, a.t, a.scale, a.causal, on.stream);
}

// Between the packed rows [B, T, G, H, hd] and head-major [G, B, H, T, hd] (G = 3 for q, k, v; 1 for the
// output), one thread per element, converted from In to Out.
template <typename In, typename Out>
__global__ void heads_kernel(const In* in, Out* out, int64_t b, int64_t t, int64_t g, int64_t h, int64_t hd,
                             bool to_heads) {
  const int64_t total = b * t * g * h * hd, step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < total; p += step) {
    // p indexes the packed layout.
    int64_t q = p;
    const int64_t e = q % hd;
    q /= hd;
    const int64_t hi = q % h;
    q /= h;
    const int64_t gi = q % g;
    q /= g;
    const int64_t ti = q % t, bi = q / t;
    const int64_t head_major = (((gi * b + bi) * h + hi) * t + ti) * hd + e;
    if (to_heads)
      out[head_major] = gpu::store<Out>(gpu::load(in[p]));
    else
      out[p] = gpu::store<Out>(gpu::load(in[head_major]));
  }
}

template <typename In, typename Out>
void heads(const In* in, Out* out, const SelfAttentionArgs& a, int64_t g, bool to_heads,
           const gpu::LaunchOn& on) {
  const int64_t total = a.batch * a.t * g * a.heads * a.head_dim;
  heads_kernel<In, Out><<<gpu::grid_for(total, 256, on.device), 256, 0, on.stream>>>(
      in, out, a.batch, a.t, g, a.heads, a.head_dim, to_heads);
  FRUGAL_CUDA_CHECK_LAUNCH("heads_kernel");
}

template <typename In, typename Out>
__global__ void convert_kernel(const In* in, Out* out, int64_t n) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    out[i] = gpu::store<Out>(gpu::load(in[i]));
}

template <typename In, typename Out>
void convert(const In* in, Out* out, int64_t n, const gpu::LaunchOn& on) {
  convert_kernel<In, Out><<<gpu::grid_for(n, 256, on.device), 256, 0, on.stream>>>(in, out, n);
  FRUGAL_CUDA_CHECK_LAUNCH("convert_kernel");
}

// One product per head of the batch: C[i] = A[i] B[i], every operand's heads `batch` apart. A is m x k with
// rows a_row apart (a_col 1) or, transposed, columns; likewise B.
struct Product {
  int64_t m, n, k;
  const void* a;
  int64_t a_row, a_col, a_batch;
  const void* b;
  int64_t b_row, b_col, b_batch;
  void* c;
  int64_t c_row, c_batch;
};
void batched(const Product& p, int64_t batch, DType ab, DType c) {
  GemmArgs g;
  g.batch = batch;
  g.m = p.m;
  g.n = p.n;
  g.k = p.k;
  g.a = p.a;
  g.a_row = p.a_row;
  g.a_col = p.a_col;
  g.a_batch = p.a_batch;
  g.b = p.b;
  g.b_row = p.b_row;
  g.b_col = p.b_col;
  g.b_batch = p.b_batch;
  g.c = p.c;
  g.c_row = p.c_row;
  g.c_batch = p.c_batch;
  gpu::gemm(g, ab, c);
}

template <typename T>
constexpr bool kLow = !std::is_same_v<T, float>;

template <typename T>
void self_attention_cuda(const SelfAttentionArgs& a) {
  gpu::LaunchOn on(a.qkv);
  const int64_t bh = a.batch * a.heads, t = a.t, hd = a.head_dim, head = t * hd, n = bh * head;
  const DType dt = dtype_v<T>;
  Storage qkv_h(3 * n * int64_t(sizeof(T)), cuda(on.device));
  Storage y_h(n * int64_t(sizeof(T)), cuda(on.device));
  Storage p_low(kLow<T> ? bh * t * t * int64_t(sizeof(T)) : 0, cuda(on.device));
  T* q = static_cast<T*>(qkv_h.data());
  T* k = q + n;
  T* v = k + n;
  float* probs = static_cast<float*>(a.probs);
  heads(static_cast<const T*>(a.qkv), q, a, 3, true, on);
  // S = Q K^T into the probabilities, then their softmax in place.
  batched({t, t, hd, q, hd, 1, head, k, 1, hd, head, probs, t, t * t}, bh, dt, DType::F32);
  T* p16 = kLow<T> ? static_cast<T*>(p_low.data()) : nullptr;
  launch_softmax(probs, probs, p16, bh * t, t, a.scale, a.causal, on.stream);
  // Y = P V, head-major, then merged into [B, T, H, hd].
  const void* p = kLow<T> ? static_cast<const void*>(p16) : static_cast<const void*>(probs);
  batched({t, hd, t, p, t, 1, t * t, v, hd, 1, head, y_h.data(), hd, head}, bh, dt, dt);
  heads(static_cast<const T*>(y_h.data()), static_cast<T*>(a.y), a, 1, false, on);
}

// f16/bf16 only: the probabilities saved in the dtype (rounded from the f32 ones Y is computed from).
template <typename T>
void self_attention_low_probs_cuda(const SelfAttentionArgs& a) {
  static_assert(kLow<T>, "probs are kept in a 16-bit dtype only");
  gpu::LaunchOn on(a.qkv);
  const int64_t bh = a.batch * a.heads, t = a.t, hd = a.head_dim, head = t * hd, n = bh * head;
  const DType dt = dtype_v<T>;
  Storage qkv_h(3 * n * int64_t(sizeof(T)), cuda(on.device));
  Storage scores(bh * t * t * int64_t(sizeof(float)), cuda(on.device));
  Storage v_f32(n * int64_t(sizeof(float)), cuda(on.device));
  Storage y_f32(n * int64_t(sizeof(float)), cuda(on.device));
  T* q = static_cast<T*>(qkv_h.data());
  T* k = q + n;
  T* v = k + n;
  float* p = static_cast<float*>(scores.data());
  float* v32 = static_cast<float*>(v_f32.data());
  float* y32 = static_cast<float*>(y_f32.data());
  heads(static_cast<const T*>(a.qkv), q, a, 3, true, on);
  // S = Q K^T (f32), its softmax in place, rounded into the saved probabilities.
  batched({t, t, hd, q, hd, 1, head, k, 1, hd, head, p, t, t * t}, bh, dt, DType::F32);
  launch_softmax(p, p, static_cast<T*>(a.probs), bh * t, t, a.scale, a.causal, on.stream);
  // Y = P V in f32 from the unrounded P, then rounded into the merged rows [B, T, H, hd].
  convert(v, v32, n, on);
  batched({t, hd, t, p, t, 1, t * t, v32, hd, 1, head, y32, hd, head}, bh, DType::F32, DType::F32);
  heads(static_cast<const float*>(y32), static_cast<T*>(a.y), a, 1, false, on);
}

// kLowProbs: the saved probabilities are of T (f16/bf16), else f32.
template <typename T, bool kLowProbs = false>
void self_attention_backward_cuda(const SelfAttentionArgs& a) {
  using P = std::conditional_t<kLowProbs, T, float>;
  gpu::LaunchOn on(a.qkv);
  const int64_t bh = a.batch * a.heads, t = a.t, hd = a.head_dim, head = t * hd, n = bh * head;
  const DType dt = dtype_v<T>;
  Storage qkv_h(3 * n * int64_t(sizeof(T)), cuda(on.device));
  Storage dqkv_h(3 * n * int64_t(sizeof(T)), cuda(on.device));
  Storage dy_h(n * int64_t(sizeof(T)), cuda(on.device));
  Storage dp(bh * t * t * int64_t(sizeof(float)), cuda(on.device));
  Storage low(kLow<T> ? bh * t * t * int64_t(sizeof(T)) : 0, cuda(on.device));
  T* q = static_cast<T*>(qkv_h.data());
  T* k = q + n;
  T* v = k + n;
  T* dq = static_cast<T*>(dqkv_h.data());
  T* dk = dq + n;
  T* dv = dk + n;
  T* dy = static_cast<T*>(dy_h.data());
  const P* probs = static_cast<const P*>(a.probs);
  float* dpf = static_cast<float*>(dp.data());
  heads(static_cast<const T*>(a.qkv), q, a, 3, true, on);
  heads(static_cast<const T*>(a.dy), dy, a, 1, true, on);
  // dV = P^T dY (P in the dtype: as saved, or rounded into the low buffer before it holds dS).
  const void* p = probs;
  if constexpr (kLow<T> && !kLowProbs) {
    convert(probs, static_cast<T*>(low.data()), bh * t * t, on);
    p = low.data();
  }
  batched({t, hd, t, p, 1, t, t * t, dy, hd, 1, head, dv, hd, head}, bh, dt, dt);
  // dP = dY V^T (f32), dS = scale P (dP - rowsum(dP P)) (in place for f32, into the low buffer otherwise).
  batched({t, t, hd, dy, hd, 1, head, v, 1, hd, head, dpf, t, t * t}, bh, dt, DType::F32);
  T* ds = kLow<T> ? static_cast<T*>(low.data()) : reinterpret_cast<T*>(dpf);
  launch_softmax_backward(probs, dpf, ds, bh * t, t, a.scale, a.causal, on.stream);
  // dQ = dS K, dK = dS^T Q.
  batched({t, hd, t, ds, t, 1, t * t, k, hd, 1, head, dq, hd, head}, bh, dt, dt);
  batched({t, hd, t, ds, 1, t, t * t, q, hd, 1, head, dk, hd, head}, bh, dt, dt);
  heads(static_cast<const T*>(dq), static_cast<T*>(a.dqkv), a, 3, false, on);
}

const bool kRegistered = [] {
  gpu::for_types(gpu::Floating{}, [](auto t) {
    using T = decltype(t);
    op_attention_softmax.set(DeviceType::CUDA, dtype_v<T>, attention_softmax_cuda<T>);
    op_attention_softmax_backward.set(DeviceType::CUDA, dtype_v<T>, attention_softmax_backward_cuda<T>);
    op_self_attention.set(DeviceType::CUDA, dtype_v<T>, self_attention_cuda<T>);
    op_self_attention_backward.set(DeviceType::CUDA, dtype_v<T>, self_attention_backward_cuda<T>);
  });
  gpu::for_types(gpu::Types<Half, BFloat16>{}, [](auto t) {
    using T = decltype(t);
    op_self_attention_low_probs.set(DeviceType::CUDA, dtype_v<T>, self_attention_low_probs_cuda<T>);
    op_self_attention_backward_low_probs.set(DeviceType::CUDA, dtype_v<T>,
                                             self_attention_backward_cuda<T, true>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
