// CUDA softmax / log-softmax over contiguous rows and their backward, and the fused softmax + cross-entropy
// forward and backward (CrossEntropyArgs in core/op_table.h). One block per row: the threads fold the row
// into a running maximum and sum of exponentials (kernels/cuda/math.h), or a sum, merge them across the
// block, and a second pass over the row writes the outputs. f16/bf16 compute in f32.
#include <algorithm>

#include "core/op_table_softmax.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/types.cuh"

namespace frugal {
namespace {

using MaxSum = math::MaxSum<float>;

struct MergeMaxSum {
  __device__ MaxSum operator()(MaxSum a, MaxSum b) const { return math::max_sum_merge(a, b); }
};

// Threads per row: a warp for short rows, up to 512 for long ones.
int threads_for(int64_t cols) {
  int t = 32;
  while (t < 512 && int64_t(t) * 4 < cols) t *= 2;
  return t;
}

unsigned grid_for_rows(int64_t rows) { return unsigned(std::min<int64_t>(rows, 65535 * 32)); }

// in, out [rows, cols]
template <typename T>
__global__ void softmax_kernel(const T* in, T* out, int64_t rows, int64_t cols, bool log) {
  __shared__ MaxSum scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = in + r * cols;
    T* y = out + r * cols;
    MaxSum s{-INFINITY, 0.0f};
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s = math::max_sum_take(s, gpu::load(x[j]));
    s = gpu::block_merge(s, MergeMaxSum{}, scratch);
    const float m = s.max, log_sum = logf(s.sum), inv = 1.0f / s.sum;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float v = gpu::load(x[j]);
      y[j] = gpu::store<T>(log ? v - m - log_sum : expf(v - m) * inv);
    }
  }
}

template <typename T>
void softmax_cuda(const SoftmaxArgs& a) {
  gpu::LaunchOn on(a.in);
  const int threads = threads_for(a.cols);
  softmax_kernel<T><<<grid_for_rows(a.rows), threads, 0, on.stream>>>(
      static_cast<const T*>(a.in), static_cast<T*>(a.out), a.rows, a.cols, a.log);
  FRUGAL_CUDA_CHECK_LAUNCH("softmax_kernel");
}

struct Plus {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// y, grad, dx [rows, cols]: op_softmax_backward, one block per row (a sum, then the outputs).
template <typename T>
__global__ void softmax_backward_kernel(const T* ys, const T* gs, T* dxs, int64_t rows, int64_t cols,
                                        bool log) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* y = ys + r * cols;
    const T* g = gs + r * cols;
    T* dx = dxs + r * cols;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      sum += log ? gpu::load(g[j]) : gpu::load(g[j]) * gpu::load(y[j]);
    sum = gpu::block_merge(sum, Plus{}, scratch);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float yj = gpu::load(y[j]), gj = gpu::load(g[j]);
      dx[j] = gpu::store<T>(log ? gj - expf(yj) * sum : yj * (gj - sum));
    }
  }
}

template <typename T>
void softmax_backward_cuda(const SoftmaxBackwardArgs& a) {
  gpu::LaunchOn on(a.y);
  softmax_backward_kernel<T><<<grid_for_rows(a.rows), threads_for(a.cols), 0, on.stream>>>(
      static_cast<const T*>(a.y), static_cast<const T*>(a.grad), static_cast<T*>(a.dx), a.rows, a.cols,
      a.log);
  FRUGAL_CUDA_CHECK_LAUNCH("softmax_backward_kernel");
}

// The row state of the cross-entropy forward: max/sum of exponentials and the plain sum (label smoothing).
struct RowState {
  MaxSum ms;
  float sum_x;
};
struct MergeRowState {
  __device__ RowState operator()(RowState a, RowState b) const {
    return {math::max_sum_merge(a.ms, b.ms), a.sum_x + b.sum_x};
  }
};

// logits [rows, classes], target [rows] -> loss [rows], lse [rows] (f32)
template <typename T>
__global__ void cross_entropy_forward_kernel(CrossEntropyArgs a) {
  __shared__ RowState scratch[32];
  const T* logits = static_cast<const T*>(a.logits);
  float* loss = static_cast<float*>(a.loss);
  float* lse = static_cast<float*>(a.lse);
  const float eps = float(a.label_smoothing);
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const int64_t t = a.target[r];
    if (t == a.ignore_index) {  // the whole block agrees: no thread reaches the merge below
      if (threadIdx.x == 0) loss[r] = lse[r] = 0.0f;
      continue;
    }
    const T* x = logits + r * a.classes;
    RowState s{{-INFINITY, 0.0f}, 0.0f};
    for (int64_t j = threadIdx.x; j < a.classes; j += blockDim.x) {
      const float v = gpu::load(x[j]);
      s.ms = math::max_sum_take(s.ms, v);
      s.sum_x += v;
    }
    s = gpu::block_merge(s, MergeRowState{}, scratch);
    if (threadIdx.x == 0) {
      const float l = s.ms.max + logf(s.ms.sum);
      lse[r] = l;
      loss[r] = math::cross_entropy_loss(l, gpu::load(x[t]), s.sum_x, eps, a.classes);
    }
  }
}

// logits [rows, classes], target, lse, grad [rows] -> d_logits [rows, classes]
template <typename T>
__global__ void cross_entropy_backward_kernel(CrossEntropyArgs a) {
  const T* logits = static_cast<const T*>(a.logits);
  const float* lse = static_cast<const float*>(a.lse);
  const float* grad = static_cast<const float*>(a.grad);
  T* d = static_cast<T*>(a.d_logits);
  const float eps = float(a.label_smoothing);
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const int64_t t = a.target[r];
    const bool ignored = t == a.ignore_index;
    const float g = grad[r], l = lse[r];
    for (int64_t j = threadIdx.x; j < a.classes; j += blockDim.x) {
      const int64_t k = r * a.classes + j;
      d[k] = gpu::store<T>(
          ignored ? 0.0f : math::cross_entropy_grad(gpu::load(logits[k]), l, g, j == t, eps, a.classes));
    }
  }
}

template <typename T>
void cross_entropy_forward_cuda(const CrossEntropyArgs& a) {
  gpu::LaunchOn on(a.logits);
  cross_entropy_forward_kernel<T><<<grid_for_rows(a.rows), threads_for(a.classes), 0, on.stream>>>(a);
  FRUGAL_CUDA_CHECK_LAUNCH("cross_entropy_forward_kernel");
}

template <typename T>
void cross_entropy_backward_cuda(const CrossEntropyArgs& a) {
  gpu::LaunchOn on(a.logits);
  cross_entropy_backward_kernel<T><<<grid_for_rows(a.rows), threads_for(a.classes), 0, on.stream>>>(a);
  FRUGAL_CUDA_CHECK_LAUNCH("cross_entropy_backward_kernel");
}

const bool kRegistered = [] {
  gpu::for_types(gpu::Floating{}, [](auto t) {
    using T = decltype(t);
    op_softmax.set(DeviceType::CUDA, dtype_v<T>, softmax_cuda<T>);
    op_softmax_backward.set(DeviceType::CUDA, dtype_v<T>, softmax_backward_cuda<T>);
    op_cross_entropy.set(DeviceType::CUDA, dtype_v<T>, cross_entropy_forward_cuda<T>);
    op_cross_entropy_backward.set(DeviceType::CUDA, dtype_v<T>, cross_entropy_backward_cuda<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
