// CUDA kernels of the fused layer normalisation (op_layer_norm, formulas in core/op_table.h). One block per
// row: the forward reads the row three times (the mean, the centred sum of squares, the output: two passes
// keep the variance exact, as the CPU kernel), the backward twice (the two row sums, then dx). dweight and
// dbias are column sums: each block sums a strip of 32 columns over one chunk of rows (the op layer's
// `chunks`, chosen from the shape) into the workspace, and a second kernel adds the chunks in order, so the
// results do not depend on the launch configuration. f16/bf16 rows accumulate in f32.
// The x-hat forms (op_layer_norm_xhat, op_layer_norm_backward_xhat; Note [layer norm saves x-hat] in
// autograd/grad_norm.cpp) are the same kernels writing x-hat in its saved dtype, or reading it instead of x
// and the mean. The x-hat forward's y is op_layer_norm's expression, with the roundings written out
// (__fmul_rn and friends, which the compiler never contracts), so it is op_layer_norm's bit for bit. The
// rounded forms (op_layer_norm_rounded, op_layer_norm_affine) make y from the rounded x-hat instead, both
// through affine_of_rounded, as the CPU kernels do through affine_value.
#include <algorithm>
#include <type_traits>

#include "core/op_table_norm.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/types.cuh"

namespace frugal {
namespace {

// Threads per row: a warp for short rows, up to 512 for long ones.
int threads_for(int64_t cols) {
  int t = 32;
  while (t < 512 && int64_t(t) * 4 < cols) t *= 2;
  return t;
}

unsigned grid_for_rows(int64_t rows) { return unsigned(std::min<int64_t>(rows, 65535 * 32)); }

struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Sums {
  float g, gx;
};
struct AddSums {
  __device__ Sums operator()(Sums a, Sums b) const { return {a.g + b.g, a.gx + b.gx}; }
};

// x-hat in its saved dtype S from the compute type, and back (S may be f64: the rounding to f32 on the way
// back is the CPU kernel's).
template <typename S>
__device__ __forceinline__ S store_xhat(float v) {
  return gpu::store<S>(v);
}
template <typename S>
__device__ __forceinline__ float load_xhat(S v) {
  return float(gpu::load(v));
}

// y = xh w + bias with xh = (x - mu) rs, each factor only when given.
__device__ __forceinline__ float normalized(float d, float rs, const float* w, const float* bias, int64_t j) {
  if (w) {
    const float xh = __fmul_rn(d, rs);
    return bias ? __fmaf_rn(xh, w[j], bias[j]) : __fmul_rn(xh, w[j]);
  }
  return bias ? __fmaf_rn(d, rs, bias[j]) : __fmul_rn(d, rs);
}

// The rounded forms' affine map of an x-hat already rounded to S (op_layer_norm_rounded,
// op_layer_norm_affine; the CPU kernels' affine_value): S(xh w + bias), each factor only when given.
template <typename S>
__device__ __forceinline__ S affine_of_rounded(S xo, const float* w, const float* bias, int64_t j) {
  const float xh = load_xhat(xo);
  if (w) return store_xhat<S>(bias ? __fmaf_rn(xh, w[j], bias[j]) : __fmul_rn(xh, w[j]));
  return store_xhat<S>(bias ? __fadd_rn(xh, bias[j]) : xh);
}

// S: the saved x-hat's dtype, or void (op_layer_norm). kRounded: y of S from the rounded x-hat.
template <typename T, typename S, bool kRounded = false>
__global__ void layer_norm_forward_kernel(LayerNormArgs a) {
  using Y = std::conditional_t<kRounded, S, T>;
  __shared__ float scratch[32];
  const T* xs = static_cast<const T*>(a.x);
  Y* ys = static_cast<Y*>(a.y);
  const float* w = static_cast<const float*>(a.weight);
  const float* bias = static_cast<const float*>(a.bias);
  const int64_t n = a.cols;
  const float inv_n = 1.0f / float(n), eps = float(a.eps);
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const T* x = xs + r * n;
    Y* y = ys + r * n;
    float sum = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += gpu::load(x[j]);
    const float mu = gpu::block_merge(sum, Add{}, scratch) * inv_n;
    float ss = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float d = gpu::load(x[j]) - mu;
      ss += d * d;
    }
    const float rs = 1.0f / sqrtf(gpu::block_merge(ss, Add{}, scratch) * inv_n + eps);
    if (threadIdx.x == 0) {
      static_cast<float*>(a.mean)[r] = mu;
      static_cast<float*>(a.rstd)[r] = rs;
    }
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float d = gpu::load(x[j]) - mu;
      if constexpr (kRounded) {
        const S xo = store_xhat<S>(__fmul_rn(d, rs));
        static_cast<S*>(a.xhat)[r * n + j] = xo;
        y[j] = affine_of_rounded(xo, w, bias, j);
      } else {
        if constexpr (!std::is_void_v<S>)
          static_cast<S*>(a.xhat)[r * n + j] = store_xhat<S>(__fmul_rn(d, rs));
        y[j] = gpu::store<T>(normalized(d, rs, w, bias, j));
      }
    }
  }
}

// Where the backward kernels read row r's x-hat from: x with the row's mean and rstd (S void), or the saved
// x-hat of S.
template <typename T, typename S>
struct XhatRow {
  const void* p;
  float mu, rs;
  __device__ XhatRow(const LayerNormArgs& a, int64_t r, float rs_) : rs(rs_) {
    if constexpr (std::is_void_v<S>) {
      p = static_cast<const T*>(a.x) + r * a.cols;
      mu = static_cast<const float*>(a.mean)[r];
    } else {
      p = static_cast<const S*>(a.xhat) + r * a.cols;
      mu = 0;
    }
  }
  __device__ float operator[](int64_t j) const {
    if constexpr (std::is_void_v<S>)
      return (gpu::load(static_cast<const T*>(p)[j]) - mu) * rs;
    else
      return load_xhat(static_cast<const S*>(p)[j]);
  }
};

template <typename T, typename S>
__global__ void layer_norm_dx_kernel(LayerNormArgs a) {
  __shared__ Sums scratch[32];
  const T* dys = static_cast<const T*>(a.dy);
  T* dxs = static_cast<T*>(a.dx);
  const float* w = static_cast<const float*>(a.weight);
  const int64_t n = a.cols;
  const float inv_n = 1.0f / float(n);
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const T* dy = dys + r * n;
    const float rs = static_cast<const float*>(a.rstd)[r];
    const XhatRow<T, S> x(a, r, rs);
    Sums s{0, 0};
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float xh = x[j], d = gpu::load(dy[j]), g = w ? d * w[j] : d;
      s.g += g;
      s.gx += g * xh;
    }
    s = gpu::block_merge(s, AddSums{}, scratch);
    const float mean_g = s.g * inv_n, mean_gx = s.gx * inv_n;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float xh = x[j], d = gpu::load(dy[j]), g = w ? d * w[j] : d;
      dxs[r * n + j] = gpu::store<T>(math::layer_norm_dx(g, xh, rs, mean_g, mean_gx));
    }
  }
}

// Block (32, 8), grid (column strips, chunks): thread (x, y) sums rows y, y + 8, ... of its chunk in column
// strip * 32 + x; the 8 partial sums merge in shared memory into workspace [chunk, 0 / 1, column].
constexpr int kColumns = 32, kRowThreads = 8;
template <typename T, typename S>
__global__ void layer_norm_param_partial_kernel(LayerNormArgs a, int64_t per_chunk) {
  __shared__ float sw[kRowThreads][kColumns], sb[kRowThreads][kColumns];
  const T* dys = static_cast<const T*>(a.dy);
  const float* rstds = static_cast<const float*>(a.rstd);
  const int64_t n = a.cols, j = int64_t(blockIdx.x) * kColumns + threadIdx.x, c = blockIdx.y;
  const int64_t r_end = min(a.rows, (c + 1) * per_chunk);
  float dw = 0, db = 0;
  if (j < n) {
    for (int64_t r = c * per_chunk + threadIdx.y; r < r_end; r += kRowThreads) {
      const float d = gpu::load(dys[r * n + j]);
      dw += d * XhatRow<T, S>(a, r, rstds[r])[j];
      db += d;
    }
  }
  sw[threadIdx.y][threadIdx.x] = dw;
  sb[threadIdx.y][threadIdx.x] = db;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    for (int k = 1; k < kRowThreads; ++k) {
      dw += sw[k][threadIdx.x];
      db += sb[k][threadIdx.x];
    }
    float* part = static_cast<float*>(a.workspace) + c * 2 * n;
    part[j] = dw;
    part[n + j] = db;
  }
}

// The chunks' partial sums added in chunk order.
__global__ void layer_norm_param_finish_kernel(LayerNormArgs a) {
  const int64_t n = a.cols, step = int64_t(gridDim.x) * blockDim.x;
  const float* ws = static_cast<const float*>(a.workspace);
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += step) {
    float dw = 0, db = 0;
    for (int64_t c = 0; c < a.chunks; ++c) {
      dw += ws[c * 2 * n + j];
      db += ws[c * 2 * n + n + j];
    }
    if (a.dweight) static_cast<float*>(a.dweight)[j] = dw;
    if (a.dbias) static_cast<float*>(a.dbias)[j] = db;
  }
}

// op_layer_norm_affine: y = the affine map of xhat, both [rows, cols] of S.
template <typename S>
__global__ void layer_norm_affine_kernel(LayerNormArgs a) {
  const S* xo = static_cast<const S*>(a.xhat);
  S* y = static_cast<S*>(a.y);
  const float* w = static_cast<const float*>(a.weight);
  const float* bias = static_cast<const float*>(a.bias);
  const int64_t total = a.rows * a.cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = affine_of_rounded(xo[i], w, bias, i % a.cols);
}

template <typename T, typename S = void, bool kRounded = false>
void layer_norm_forward_cuda(const LayerNormArgs& a) {
  if (a.rows == 0) return;
  gpu::LaunchOn on(a.x);
  layer_norm_forward_kernel<T, S, kRounded><<<grid_for_rows(a.rows), threads_for(a.cols), 0, on.stream>>>(a);
  FRUGAL_CUDA_CHECK_LAUNCH("layer_norm_forward_kernel");
}

template <typename S>
void layer_norm_affine_cuda(const LayerNormArgs& a) {
  if (a.rows == 0 || a.cols == 0) return;
  gpu::LaunchOn on(a.xhat);
  layer_norm_affine_kernel<S><<<gpu::grid_for(a.rows * a.cols, 256, on.device), 256, 0, on.stream>>>(a);
  FRUGAL_CUDA_CHECK_LAUNCH("layer_norm_affine_kernel");
}

// From x and the mean (S void), or from the saved x-hat of S (then x and mean are null).
template <typename T, typename S = void>
void layer_norm_backward_cuda(const LayerNormArgs& a) {
  gpu::LaunchOn on(a.dy);
  if (a.dx && a.rows > 0) {
    layer_norm_dx_kernel<T, S><<<grid_for_rows(a.rows), threads_for(a.cols), 0, on.stream>>>(a);
    FRUGAL_CUDA_CHECK_LAUNCH("layer_norm_dx_kernel");
  }
  if (!a.dweight && !a.dbias) return;
  FRUGAL_CHECK_T(DeviceError, a.workspace, "layer_norm_backward: no workspace for dweight and dbias");
  const int64_t chunks = std::max<int64_t>(1, a.chunks);
  FRUGAL_CHECK_T(DeviceError, chunks <= 65535, "layer_norm_backward: ", chunks,
                 " chunks exceed the CUDA grid");
  LayerNormArgs b = a;
  b.chunks = chunks;
  const int64_t per_chunk = (a.rows + chunks - 1) / chunks;
  const dim3 grid(unsigned((a.cols + kColumns - 1) / kColumns), unsigned(chunks));
  layer_norm_param_partial_kernel<T, S><<<grid, dim3(kColumns, kRowThreads), 0, on.stream>>>(b, per_chunk);
  FRUGAL_CUDA_CHECK_LAUNCH("layer_norm_param_partial_kernel");
  layer_norm_param_finish_kernel<<<gpu::grid_for(a.cols, 256, on.device), 256, 0, on.stream>>>(b);
  FRUGAL_CUDA_CHECK_LAUNCH("layer_norm_param_finish_kernel");
}

// The x-hat and rounded forms for x of T: the kernel for the saved x-hat's dtype.
enum class XhatForm { kForward, kBackward, kRounded, kAffine };
template <typename T, XhatForm kForm>
void layer_norm_xhat_cuda(const LayerNormArgs& a) {
  visit_floating_dtype(a.xhat_dtype, "layer_norm x-hat", [&](auto s) {
    using S = decltype(s);
    if constexpr (kForm == XhatForm::kForward)
      layer_norm_forward_cuda<T, S>(a);
    else if constexpr (kForm == XhatForm::kBackward)
      layer_norm_backward_cuda<T, S>(a);
    else if constexpr (kForm == XhatForm::kRounded)
      layer_norm_forward_cuda<T, S, true>(a);
    else
      layer_norm_affine_cuda<S>(a);
  });
}

const bool kRegistered = [] {
  gpu::for_types(gpu::Floating{}, [](auto t) {
    using T = decltype(t);
    op_layer_norm.set(DeviceType::CUDA, dtype_v<T>, layer_norm_forward_cuda<T>);
    op_layer_norm_backward.set(DeviceType::CUDA, dtype_v<T>, layer_norm_backward_cuda<T>);
    op_layer_norm_xhat.set(DeviceType::CUDA, dtype_v<T>, layer_norm_xhat_cuda<T, XhatForm::kForward>);
    op_layer_norm_backward_xhat.set(DeviceType::CUDA, dtype_v<T>,
                                    layer_norm_xhat_cuda<T, XhatForm::kBackward>);
    op_layer_norm_rounded.set(DeviceType::CUDA, dtype_v<T>, layer_norm_xhat_cuda<T, XhatForm::kRounded>);
    op_layer_norm_affine.set(DeviceType::CUDA, dtype_v<T>, layer_norm_xhat_cuda<T, XhatForm::kAffine>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
