// CPU optimizer updates: SGD and Adam/AdamW fused into one pass over param, grad and state per element,
// with PyTorch's formulas (optim/sgd.h, optim/adam.h) and operation order, but for one product in Adam's
// (adam_loop). f16/bf16 parameters compute in
// f32 with f32 state. The composite references (several frugal::ops passes) are in
// tests/optim/test_kernels.cpp.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/op_table_optim.h"
#include "core/parallel.h"
#include "kernels/cpu/register.h"

namespace frugal {
namespace {

using cpu::for_types;

// param, grad (n, T); momentum_buffer (n, acc_t<T>) or null. The options are template arguments, so each
// combination is a branch-free loop the compiler vectorises (with them tested per element, it did not: W4's
// update, 32 M parameters a step, ran scalar).
template <typename T, bool kDecay, bool kBuf, bool kFirst, bool kNesterov>
void sgd_loop(const SgdStepArgs& a) {
  using C = acc_t<T>;
  T* param = static_cast<T*>(a.param);
  const T* grad = static_cast<const T*>(a.grad);
  C* buf = static_cast<C*>(a.momentum_buffer);
  const C lr = C(a.lr), wd = C(a.weight_decay), momentum = C(a.momentum), keep = C(1 - a.dampening);
  parallel_for(0, a.n, parallel_grain(), [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      const C p = C(param[i]);
      C d = C(grad[i]);
      if constexpr (kDecay) d = d + wd * p;
      if constexpr (kBuf) {
        const C b = kFirst ? d : buf[i] * momentum + keep * d;
        buf[i] = b;
        d = kNesterov ? d + momentum * b : b;
      }
      param[i] = T(p - lr * d);
    }
  });
}

template <typename T>
void sgd_step_cpu(const SgdStepArgs& a) {
  auto run = [&](auto decay, auto buf, auto first, auto nesterov) {
    sgd_loop<T, decltype(decay)::value, decltype(buf)::value, decltype(first)::value,
             decltype(nesterov)::value>(a);
  };
  auto with_nesterov = [&](auto decay, auto buf, auto first) {
    a.nesterov ? run(decay, buf, first, std::true_type{}) : run(decay, buf, first, std::false_type{});
  };
  auto with_first = [&](auto decay, auto buf) {
    a.first_step ? with_nesterov(decay, buf, std::true_type{}) : with_nesterov(decay, buf, std::false_type{});
  };
  auto with_buf = [&](auto decay) {
    a.momentum_buffer ? with_first(decay, std::true_type{}) : with_first(decay, std::false_type{});
  };
  a.weight_decay != 0 ? with_buf(std::true_type{}) : with_buf(std::false_type{});
}

// param, grad (n, T); exp_avg, exp_avg_sq, max_exp_avg_sq (n, acc_t<T>; the last only with amsgrad). The
// options are template arguments, as SGD's, so the loop vectorises (sqrt included: this file is compiled
// with -fno-math-errno). Where the compiler contracts a product and a sum into an FMA may differ between the
// vector loop and a scalar one, so a value can differ in its last bit from the scalar loop this replaced
// (seen with AdamW's decoupled decay); the references compare within rounding. One departure from
// PyTorch's order: sqrt(v) is multiplied by the reciprocal of sqrt(bias correction 2) (rounded once, from
// the double) where PyTorch divides by it, which may move the update's last bit; the CUDA step
// (kernels/cuda/math.h) still divides. The loop is bound by its divisions (16 lanes in 8-16 cycles on
// AVX-512): one of two the less made W1's largest layer's step (200,704 f32) 71 -> 49 us on 2 threads of a
// Xeon.
template <typename T, bool kCoupled, bool kDecoupled, bool kAmsgrad>
void adam_loop(const AdamStepArgs& a) {
  using C = acc_t<T>;
  T* param = static_cast<T*>(a.param);
  const T* grad = static_cast<const T*>(a.grad);
  C* exp_avg = static_cast<C*>(a.exp_avg);
  C* exp_avg_sq = static_cast<C*>(a.exp_avg_sq);
  C* max_sq = static_cast<C*>(a.max_exp_avg_sq);
  const C beta1 = C(a.beta1), beta2 = C(a.beta2), one_minus_beta1 = C(1 - a.beta1),
          one_minus_beta2 = C(1 - a.beta2), eps = C(a.eps), wd = C(a.weight_decay),
          shrink = C(1 - a.lr * a.weight_decay), step_size = C(a.step_size),
          inv_bc2_sqrt = C(1.0 / a.bias_correction2_sqrt);
  parallel_for(0, a.n, parallel_grain(), [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      C p = C(param[i]);
      C g = C(grad[i]);
      if constexpr (kCoupled) g = g + wd * p;
      if constexpr (kDecoupled) p = p * shrink;
      const C m = exp_avg[i] * beta1 + one_minus_beta1 * g;
      const C v = exp_avg_sq[i] * beta2 + one_minus_beta2 * (g * g);
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      C v_used = v;
      if constexpr (kAmsgrad) {
        v_used = std::max(max_sq[i], v);
        max_sq[i] = v_used;
      }
      const C denom = std::sqrt(v_used) * inv_bc2_sqrt + eps;
      param[i] = T(p - step_size * (m / denom));
    }
  });
}

template <typename T>
void adam_step_cpu(const AdamStepArgs& a) {
  const bool decay = a.weight_decay != 0;
  auto run = [&](auto coupled, auto decoupled) {
    a.amsgrad ? adam_loop<T, decltype(coupled)::value, decltype(decoupled)::value, true>(a)
              : adam_loop<T, decltype(coupled)::value, decltype(decoupled)::value, false>(a);
  };
  if (decay && a.decoupled_weight_decay)
    run(std::false_type{}, std::true_type{});
  else if (decay)
    run(std::true_type{}, std::false_type{});
  else
    run(std::false_type{}, std::false_type{});
}

const bool kRegistered = [] {
  for_types<float, double, Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_sgd_step.set(DeviceType::CPU, dtype_v<T>, sgd_step_cpu<T>);
    op_adam_step.set(DeviceType::CPU, dtype_v<T>, adam_step_cpu<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
