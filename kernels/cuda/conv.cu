// CUDA convolution kernels (op_conv2d and its backward ops, ConvArgs in core/op_table.h), f32/f16/bf16 with
// f32 accumulation: through cuDNN when frugal is built with it (kernels/cuda/conv_cudnn.cu), otherwise (and
// for what cuDNN declines) im2col + the registered GEMM (cuBLASLt, kernels/cuda/gemm.cu):
//   forward:         y_g[image] = W_g [og, K] col_g[image] [K, oh*ow], y pre-filled with the bias (beta 1)
//   backward_data:   col_g[image] = W_g^T dy_g[image], then col2im (a gather, kernels/cuda/conv_math.h)
//   backward_weight: dW_g = dy_g [og, images*oh*ow] col_g^T, dy regrouped channel-major first; the bias
//                    gradient is a per-channel sum of dy in f32
// with K = c / groups * kh * kw, over chunks of images whose columns fit chunk_bytes. The columns come from
// the arena (a Storage on the device), so they show in the memory statistics and go back to its cache.
#include <algorithm>
#include <atomic>

#include "core/op_table_conv.h"
#include "core/op_table_linalg.h"
#include "core/storage.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/conv.h"
#include "kernels/cuda/conv_math.h"
#include "kernels/cuda/types.cuh"

namespace frugal {

namespace {

#ifdef FRUGAL_HAVE_CUDNN
std::atomic<bool> use_cudnn{true};
#endif

constexpr int kThreads = 256;
std::atomic<int64_t> chunk_bytes{int64_t(256) << 20};  // column buffer per chunk of images

template <typename T>
__global__ void im2col_kernel(ConvArgs a, const T* x, T* col, int64_t rows, int64_t cols) {
  const int64_t total = rows * cols;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = k / cols, q = k - row * cols;
    const int64_t src = math::im2col_source(a, row, q);
    col[k] = src >= 0 ? x[src] : gpu::store<T>(acc_t<T>(0));
  }
}

// dx for `images` images (all of x's c channels) from their columns, each element summed in f32 and
// rounded once.
template <typename T>
__global__ void col2im_kernel(ConvArgs a, const T* col, T* dx, int64_t images) {
  const int64_t total = images * a.c * a.h * a.w;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total;
       k += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = k;
    const int64_t iw = r % a.w;
    r /= a.w;
    const int64_t ih = r % a.h;
    r /= a.h;
    const int64_t c = r % a.c, image = r / a.c;
    acc_t<T> s = 0;
    math::for_each_reader(a, ih, iw, [&](int64_t i, int64_t j, int64_t oh, int64_t ow) {
      s += gpu::load(col[math::col_offset(a, images, image, c, i, j, oh, ow)]);
    });
    dx[k] = gpu::store<T>(s);
  }
}

// y [images, o, ohw] = bias[o].
template <typename T>
__global__ void fill_bias_kernel(const T* bias, T* y, int64_t images, int64_t o, int64_t ohw) {
  const int64_t total = images * o * ohw;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total;
       k += int64_t(gridDim.x) * blockDim.x)
    y[k] = bias[(k / ohw) % o];
}

// out [o, images * ohw] = dy [images, o, ohw] regrouped channel-major.
template <typename T>
__global__ void regroup_kernel(const T* dy, T* out, int64_t images, int64_t o, int64_t ohw) {
  const int64_t total = images * o * ohw;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t oc = k / (images * ohw), rest = k - oc * images * ohw;
    const int64_t image = rest / ohw, p = rest - image * ohw;
    out[k] = dy[(image * o + oc) * ohw + p];
  }
}

// db[oc] = sum over images and positions of dy, one block per channel, in f32.
template <typename T>
__global__ void bias_grad_kernel(const T* dy, T* db, int64_t n, int64_t o, int64_t ohw) {
  __shared__ float scratch[32];
  const int64_t oc = blockIdx.x;
  float s = 0;
  for (int64_t k = threadIdx.x; k < n * ohw; k += blockDim.x) {
    const int64_t image = k / ohw, p = k - image * ohw;
    s += float(gpu::load(dy[(image * o + oc) * ohw + p]));
  }
  s = gpu::block_merge(
      s, [](float x, float y) { return x + y; }, scratch);
  if (threadIdx.x == 0) db[oc] = gpu::store<T>(acc_t<T>(s));
}

// Images per chunk: as many as fit chunk_bytes at `per_image` bytes each, at least one.
int64_t chunk_images(const ConvArgs& a, int64_t per_image) {
  return std::clamp<int64_t>(chunk_bytes.load(std::memory_order_relaxed) / std::max<int64_t>(per_image, 1), 1,
                             a.n);
}

template <typename T>
void launch_im2col(const gpu::LaunchOn& on, const ConvArgs& a, const T* x, T* col, int64_t images) {
  const int64_t rows = a.c * a.kh * a.kw, cols = images * a.oh * a.ow;
  im2col_kernel<T>
      <<<gpu::grid_for(rows * cols, kThreads, on.device), kThreads, 0, on.stream>>>(a, x, col, rows, cols);
  FRUGAL_CUDA_CHECK_LAUNCH("im2col_kernel");
}

template <typename T>
void conv2d_forward_im2col(const ConvArgs& a) {
  gpu::LaunchOn on(a.y);
  const int64_t ohw = a.oh * a.ow, cg = a.c / a.groups, og = a.o / a.groups, kk = cg * a.kh * a.kw;
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.weight);
  T* y = static_cast<T*>(a.y);
  if (a.bias) {
    fill_bias_kernel<T><<<gpu::grid_for(a.n * a.o * ohw, kThreads, on.device), kThreads, 0, on.stream>>>(
        static_cast<const T*>(a.bias), y, a.n, a.o, ohw);
    FRUGAL_CUDA_CHECK_LAUNCH("fill_bias_kernel");
  }
  const int64_t chunk = chunk_images(a, a.c * a.kh * a.kw * ohw * int64_t(sizeof(T)));
  Storage buf(a.c * a.kh * a.kw * chunk * ohw * int64_t(sizeof(T)), cuda(on.device));
  T* col = static_cast<T*>(buf.data());
  GemmKernel* gemm = op_gemm.get(cuda(on.device), dtype_v<T>);
  for (int64_t n0 = 0; n0 < a.n; n0 += chunk) {
    const int64_t images = std::min(chunk, a.n - n0), cols = images * ohw;
    launch_im2col(on, a, x + n0 * a.c * a.h * a.w, col, images);
    for (int64_t g = 0; g < a.groups; ++g) {
      GemmArgs m;
      m.batch = images;
      m.m = og;
      m.n = ohw;
      m.k = kk;
      m.a = w + g * og * kk;
      m.a_row = kk;
      m.b = col + g * kk * cols;
      m.b_row = cols;
      m.b_batch = ohw;
      m.c = y + (n0 * a.o + g * og) * ohw;
      m.c_row = ohw;
      m.c_batch = a.o * ohw;
      m.beta = a.bias ? 1.0f : 0.0f;
      gemm(m);
    }
  }
}

template <typename T>
void conv2d_backward_data_im2col(const ConvArgs& a) {
  gpu::LaunchOn on(a.dx);
  const int64_t ohw = a.oh * a.ow, cg = a.c / a.groups, og = a.o / a.groups, kk = cg * a.kh * a.kw;
  const T* dy = static_cast<const T*>(a.dy);
  const T* w = static_cast<const T*>(a.weight);
  T* dx = static_cast<T*>(a.dx);
  const int64_t chunk = chunk_images(a, a.c * a.kh * a.kw * ohw * int64_t(sizeof(T)));
  Storage buf(a.c * a.kh * a.kw * chunk * ohw * int64_t(sizeof(T)), cuda(on.device));
  T* col = static_cast<T*>(buf.data());
  GemmKernel* gemm = op_gemm.get(cuda(on.device), dtype_v<T>);
  for (int64_t n0 = 0; n0 < a.n; n0 += chunk) {
    const int64_t images = std::min(chunk, a.n - n0), cols = images * ohw;
    for (int64_t g = 0; g < a.groups; ++g) {
      GemmArgs m;
      m.batch = images;
      m.m = kk;
      m.n = ohw;
      m.k = og;
      m.a = w + g * og * kk;  // W_g^T: [kk, og]
      m.a_row = 1;
      m.a_col = kk;
      m.b = dy + (n0 * a.o + g * og) * ohw;
      m.b_row = ohw;
      m.b_batch = a.o * ohw;
      m.c = col + g * kk * cols;
      m.c_row = cols;
      m.c_batch = ohw;
      gemm(m);
    }
    const int64_t elems = images * a.c * a.h * a.w;
    col2im_kernel<T><<<gpu::grid_for(elems, kThreads, on.device), kThreads, 0, on.stream>>>(
        a, col, dx + n0 * a.c * a.h * a.w, images);
    FRUGAL_CUDA_CHECK_LAUNCH("col2im_kernel");
  }
}

template <typename T>
void conv2d_backward_weight_im2col(const ConvArgs& a) {
  gpu::LaunchOn on(a.dweight);
  const int64_t ohw = a.oh * a.ow, cg = a.c / a.groups, og = a.o / a.groups, kk = cg * a.kh * a.kw;
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.dy);
  T* dw = static_cast<T*>(a.dweight);
  // Per image: its columns and its dy regrouped channel-major.
  const int64_t col_elems = a.c * a.kh * a.kw * ohw, dy_elems = a.o * ohw;
  const int64_t chunk = chunk_images(a, (col_elems + dy_elems) * int64_t(sizeof(T)));
  Storage buf((col_elems + dy_elems) * chunk * int64_t(sizeof(T)), cuda(on.device));
  T* col = static_cast<T*>(buf.data());
  T* dyc = col + col_elems * chunk;
  GemmKernel* gemm = op_gemm.get(cuda(on.device), dtype_v<T>);
  for (int64_t n0 = 0; n0 < a.n; n0 += chunk) {
    const int64_t images = std::min(chunk, a.n - n0), cols = images * ohw;
    launch_im2col(on, a, x + n0 * a.c * a.h * a.w, col, images);
    regroup_kernel<T><<<gpu::grid_for(images * dy_elems, kThreads, on.device), kThreads, 0, on.stream>>>(
        dy + n0 * dy_elems, dyc, images, a.o, ohw);
    FRUGAL_CUDA_CHECK_LAUNCH("regroup_kernel");
    for (int64_t g = 0; g < a.groups; ++g) {
      GemmArgs m;
      m.m = og;
      m.n = kk;
      m.k = cols;
      m.a = dyc + g * og * cols;
      m.a_row = cols;
      m.b = col + g * kk * cols;  // col_g^T: [cols, kk]
      m.b_row = 1;
      m.b_col = cols;
      m.c = dw + g * og * kk;
      m.c_row = kk;
      m.beta = n0 == 0 ? 0.0f : 1.0f;  // chunks after the first add on (f16/bf16: one rounding per chunk)
      gemm(m);
    }
  }
  if (a.dbias) {
    bias_grad_kernel<T>
        <<<unsigned(a.o), kThreads, 0, on.stream>>>(dy, static_cast<T*>(a.dbias), a.n, a.o, ohw);
    FRUGAL_CUDA_CHECK_LAUNCH("bias_grad_kernel");
  }
}

template <typename T, gpu::ConvDirection Dir>
void conv2d_cuda(const ConvArgs& a) {
#ifdef FRUGAL_HAVE_CUDNN
  if (use_cudnn.load(std::memory_order_relaxed) && gpu::cudnn_conv2d(Dir, dtype_v<T>, a)) return;
#endif
  if constexpr (Dir == gpu::ConvDirection::Forward)
    conv2d_forward_im2col<T>(a);
  else if constexpr (Dir == gpu::ConvDirection::BackwardData)
    conv2d_backward_data_im2col<T>(a);
  else
    conv2d_backward_weight_im2col<T>(a);
}

[[maybe_unused]] const bool kRegistered = [] {
  gpu::for_types(gpu::Floating{}, [](auto t) {
    using T = decltype(t);
    op_conv2d.set(DeviceType::CUDA, dtype_v<T>, conv2d_cuda<T, gpu::ConvDirection::Forward>);
    op_conv2d_backward_data.set(DeviceType::CUDA, dtype_v<T>,
                                conv2d_cuda<T, gpu::ConvDirection::BackwardData>);
    op_conv2d_backward_weight.set(DeviceType::CUDA, dtype_v<T>,
                                  conv2d_cuda<T, gpu::ConvDirection::BackwardWeight>);
  });
  return true;
}();

}  // namespace

void set_cuda_conv_im2col_chunk_bytes(int64_t bytes) { chunk_bytes.store(bytes); }

#ifdef FRUGAL_HAVE_CUDNN
bool cuda_conv_has_cudnn() { return true; }
void set_cuda_conv_cudnn(bool use) { use_cudnn.store(use); }
#else
bool cuda_conv_has_cudnn() { return false; }
void set_cuda_conv_cudnn(bool) {}
#endif

}  // namespace frugal
