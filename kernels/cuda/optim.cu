// CUDA fused optimizer updates: SGD, Adam/AdamW (op_sgd_step, op_adam_step) and SparseAdam's update of the
// rows present (op_sparse_adam_step), and the GradScaler's non-finite check and unscale
// (op_non_finite_check_and_unscale), one thread per element, with the per-element math of
// kernels/cuda/math.h (the CPU kernels' formulas and order). f16/bf16 parameters compute in f32 with f32
// state (the master values live in the state; the parameter is rounded once per step).
#include "core/op_table_optim.h"
#include "core/op_table_sparse.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/types.cuh"

namespace frugal {
namespace {

template <typename T>
__global__ void sgd_step_kernel(T* param, const T* grad, acc_t<T>* buffer, int64_t n,
                                math::SgdHyper<acc_t<T>> h) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    param[i] = gpu::store<T>(
        math::sgd_step(gpu::load(param[i]), gpu::load(grad[i]), buffer ? buffer + i : nullptr, h));
}

template <typename T>
void sgd_step_cuda(const SgdStepArgs& a) {
  using C = acc_t<T>;
  if (a.n == 0) return;
  const math::SgdHyper<C> h{C(a.lr),
                            C(a.weight_decay),
                            C(a.momentum),
                            C(1 - a.dampening),
                            a.weight_decay != 0,
                            a.nesterov,
                            a.first_step,
                            a.momentum_buffer != nullptr};
  gpu::LaunchOn on(a.param);
  sgd_step_kernel<T><<<gpu::grid_for(a.n, 256, on.device), 256, 0, on.stream>>>(
      static_cast<T*>(a.param), static_cast<const T*>(a.grad), static_cast<C*>(a.momentum_buffer), a.n, h);
  FRUGAL_CUDA_CHECK_LAUNCH("sgd_step_kernel");
}

template <typename T>
__global__ void adam_step_kernel(T* param, const T* grad, acc_t<T>* exp_avg, acc_t<T>* exp_avg_sq,
                                 acc_t<T>* max_exp_avg_sq, int64_t n, math::AdamHyper<acc_t<T>> h) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    param[i] =
        gpu::store<T>(math::adam_step(gpu::load(param[i]), gpu::load(grad[i]), exp_avg + i, exp_avg_sq + i,
                                      max_exp_avg_sq ? max_exp_avg_sq + i : nullptr, h));
}

template <typename T>
void adam_step_cuda(const AdamStepArgs& a) {
  using C = acc_t<T>;
  if (a.n == 0) return;
  const math::AdamHyper<C> h{C(a.beta1),
                             C(a.beta2),
                             C(1 - a.beta1),
                             C(1 - a.beta2),
                             C(a.eps),
                             C(a.weight_decay),
                             C(1 - a.lr * a.weight_decay),
                             C(a.step_size),
                             C(a.bias_correction2_sqrt),
                             a.weight_decay != 0 && !a.decoupled_weight_decay,
                             a.weight_decay != 0 && a.decoupled_weight_decay,
                             a.amsgrad};
  gpu::LaunchOn on(a.param);
  adam_step_kernel<T><<<gpu::grid_for(a.n, 256, on.device), 256, 0, on.stream>>>(
      static_cast<T*>(a.param), static_cast<const T*>(a.grad), static_cast<C*>(a.exp_avg),
      static_cast<C*>(a.exp_avg_sq), static_cast<C*>(a.max_exp_avg_sq), a.n, h);
  FRUGAL_CUDA_CHECK_LAUNCH("adam_step_kernel");
}

// param, exp_avg, exp_avg_sq [rows, dim]; values [nnz, dim] at the (unique) rows indices[nnz].
template <typename T>
__global__ void sparse_adam_step_kernel(SparseAdamStepArgs a, math::SparseAdamHyper<acc_t<T>> h) {
  using C = acc_t<T>;
  T* param = static_cast<T*>(a.param);
  C* m = static_cast<C*>(a.exp_avg);
  C* v = static_cast<C*>(a.exp_avg_sq);
  const T* values = static_cast<const T*>(a.values);
  const int64_t total = a.nnz * a.dim, step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < total; p += step) {
    const int64_t k = a.indices[p / a.dim] * a.dim + p % a.dim;
    param[k] =
        gpu::store<T>(math::sparse_adam_step(gpu::load(param[k]), gpu::load(values[p]), m + k, v + k, h));
  }
}

template <typename T>
void sparse_adam_step_cuda(const SparseAdamStepArgs& a) {
  using C = acc_t<T>;
  const int64_t total = a.nnz * a.dim;
  if (total == 0) return;
  const math::SparseAdamHyper<C> h{C(1 - a.beta1), C(1 - a.beta2), C(a.eps), C(a.step_size)};
  gpu::LaunchOn on(a.param);
  sparse_adam_step_kernel<T><<<gpu::grid_for(total, 256, on.device), 256, 0, on.stream>>>(a, h);
  FRUGAL_CUDA_CHECK_LAUNCH("sparse_adam_step_kernel");
}

// The GradScaler's pass (UnscaleArgs): flags non-finite elements in the device word found_inf and scales the
// rest. Nothing waits for it: the scaler reads the word once per device (Note [one found_inf per device]).
template <typename T>
__global__ void non_finite_check_and_unscale_kernel(T* grad, int64_t n, float inv_scale, float* found) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  const bool scale = inv_scale != 1.0f;
  bool bad = false;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const float v = gpu::load(grad[i]);
    bad |= math::non_finite(v);
    if (scale) grad[i] = gpu::store<T>(v * inv_scale);
  }
  // Every writer stores the same value, so plain stores suffice (no atomics, no read of the word).
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *found = 1.0f;
}

template <typename T>
void non_finite_check_and_unscale_cuda(const UnscaleArgs& a) {
  if (a.n == 0) return;
  gpu::LaunchOn on(a.grad);
  non_finite_check_and_unscale_kernel<T><<<gpu::grid_for(a.n, 256, on.device), 256, 0, on.stream>>>(
      static_cast<T*>(a.grad), a.n, a.inv_scale, a.found_inf);
  FRUGAL_CUDA_CHECK_LAUNCH("non_finite_check_and_unscale_kernel");
}

const bool kRegistered = [] {
  gpu::for_types(gpu::Floating{}, [](auto t) {
    using T = decltype(t);
    op_non_finite_check_and_unscale.set(DeviceType::CUDA, dtype_v<T>, non_finite_check_and_unscale_cuda<T>);
    op_sgd_step.set(DeviceType::CUDA, dtype_v<T>, sgd_step_cuda<T>);
    op_adam_step.set(DeviceType::CUDA, dtype_v<T>, adam_step_cuda<T>);
    op_sparse_adam_step.set(DeviceType::CUDA, dtype_v<T>, sparse_adam_step_cuda<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
