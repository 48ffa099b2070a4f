// The per-element math of the CUDA kernels beyond the elementwise ops (those are kernels/math.h's, shared
// with the CPU): conversions, reduction states, softmax and cross-entropy terms, optimizer updates and the
// fused ops of the GPT path, as functions callable from host and device (FRUGAL_HOST_DEVICE), so that they
// are tested on the host against the CPU kernels (tests/cuda/test_math.cpp) on machines without a GPU. Values
// are in the compute type C; loading and storing the 16-bit types is the .cu files' business
// (kernels/cuda/common.cuh). Plain C++: no CUDA header.
//
//   math::adam_step(p, g, m, v, v_max, h);       // one element of the fused Adam update
#pragma once

#include "kernels/math.h"

namespace frugal::math {

// A value of compute type From converted to compute type To (the storage conversion of the 16-bit floats
// comes after): to bool means != 0, floats to integers as float_to_int says.
template <typename To, typename From>
FRUGAL_HOST_DEVICE To convert(From v) {
  if constexpr (std::is_same_v<To, bool>)
    return v != From(0);
  else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>)
    return float_to_int<To>(v);
  else
    return To(v);
}

// ---------------------------------------------------------------------------------------------------------------
// Reductions: a state per partial result, an identity, one element taken in, two states merged (in any
// order: the GPU merges in a tree), and the final value. The CPU kernels fold left to right; the results
// agree exactly for max, min and the arg ops, to rounding for sums.

template <typename C>
struct SumReduce {
  using Acc = C;
  FRUGAL_HOST_DEVICE Acc identity() const { return C(0); }
  FRUGAL_HOST_DEVICE Acc take(C v, int64_t) const { return v; }
  FRUGAL_HOST_DEVICE Acc merge(Acc a, Acc b) const { return Add{}(a, b); }  // integers wrap
};

// max / min: NaN wins.
template <typename C, bool kMax>
struct ExtremeReduce {
  using Acc = C;
  FRUGAL_HOST_DEVICE Acc identity() const {
    if constexpr (std::is_same_v<C, bool>)
      return !kMax;
    else
      return kMax ? lowest_<C>() : highest_<C>();
  }
  FRUGAL_HOST_DEVICE Acc take(C v, int64_t) const { return v; }
  FRUGAL_HOST_DEVICE Acc merge(Acc a, Acc b) const {
    if (isnan_(a) || isnan_(b)) return isnan_(a) ? a : b;
    return (kMax ? a < b : b < a) ? b : a;
  }
};

// argmax / argmin: the index of the extreme; NaN wins; ties (and NaNs) go to the smallest index, so the
// result does not depend on the merge order. index < 0 marks the identity.
template <typename C>
struct ArgState {
  C value;
  int64_t index;
};
template <typename C, bool kMax>
struct ArgReduce {
  using Acc = ArgState<C>;
  FRUGAL_HOST_DEVICE Acc identity() const { return {C(0), -1}; }
  FRUGAL_HOST_DEVICE Acc take(C v, int64_t i) const { return {v, i}; }
  FRUGAL_HOST_DEVICE Acc merge(Acc a, Acc b) const {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    const bool a_nan = isnan_(a.value), b_nan = isnan_(b.value);
    if (a_nan != b_nan) return a_nan ? a : b;
    if (!a_nan && a.value != b.value) return (kMax ? a.value < b.value : b.value < a.value) ? b : a;
    return b.index < a.index ? b : a;
  }
};

// var: Welford's count, mean and sum of squared deviations in f64, merged with Chan's formula.
struct VarState {
  double n, mean, m2;
};
struct VarReduce {
  using Acc = VarState;
  FRUGAL_HOST_DEVICE Acc identity() const { return {0, 0, 0}; }
  template <typename C>
  FRUGAL_HOST_DEVICE Acc take(C v, int64_t) const {
    return {1, double(v), 0};
  }
  FRUGAL_HOST_DEVICE Acc merge(Acc a, Acc b) const {
    const double n = a.n + b.n;
    if (n == 0) return a;
    const double delta = b.mean - a.mean;
    return {n, a.mean + delta * (b.n / n), a.m2 + b.m2 + delta * delta * (a.n * b.n / n)};
  }
};
// The variance from a merged state: m2 / (n - correction), NaN when that is not positive.
FRUGAL_HOST_DEVICE inline double variance(const VarState& s, double correction) {
  const double denom = s.n - correction;
  return denom > 0 ? s.m2 / denom : std::numeric_limits<double>::quiet_NaN();
}

// ---------------------------------------------------------------------------------------------------------------
// Softmax and cross-entropy over a row: the running maximum m and sum s of exp(x - m), merged across threads.
// A row whose maximum is -inf gives NaN outputs through x - m (as the CPU kernels); one holding +inf gives
// NaN where x is +inf and 0 elsewhere (as PyTorch), where the CPU kernel gives NaN everywhere.

template <typename C>
struct MaxSum {
  C max;  // -inf while empty
  C sum;  // of exp(x - max); elements equal to max count 1 (also when max is -inf)
};
template <typename C>
FRUGAL_HOST_DEVICE MaxSum<C> max_sum_take(MaxSum<C> a, C x) {
  if (x > a.max) return {x, a.sum * exp_(a.max - x) + C(1)};
  if (x == a.max) return {a.max, a.sum + C(1)};
  return {a.max, a.sum + exp_(x - a.max)};  // a NaN x makes the sum NaN
}
template <typename C>
FRUGAL_HOST_DEVICE MaxSum<C> max_sum_merge(MaxSum<C> a, MaxSum<C> b) {
  const C m = a.max < b.max ? b.max : a.max;
  // exp(max - m) of the part that holds m is 1, also when m is infinite (where max - m would be NaN).
  return {m, (a.max == m ? a.sum : a.sum * exp_(a.max - m)) + (b.max == m ? b.sum : b.sum * exp_(b.max - m))};
}

// loss = lse - (1 - eps) x[t] - eps / C sum_j x[j]  (CrossEntropyArgs in core/op_table.h)
template <typename C>
FRUGAL_HOST_DEVICE C cross_entropy_loss(C lse, C x_target, C sum_x, C label_smoothing, int64_t classes) {
  const C keep = C(1) - label_smoothing;
  return lse - keep * x_target - (label_smoothing != C(0) ? label_smoothing / C(classes) * sum_x : C(0));
}
// d_logits[j] = grad (exp(x[j] - lse) - eps / C - (1 - eps) [j == t])
template <typename C>
FRUGAL_HOST_DEVICE C cross_entropy_grad(C x, C lse, C grad, bool is_target, C label_smoothing,
                                        int64_t classes) {
  const C off = label_smoothing / C(classes), keep = C(1) - label_smoothing;
  return (exp_(x - lse) - off - (is_target ? keep : C(0))) * grad;
}

// ---------------------------------------------------------------------------------------------------------------
// Optimizer updates of one element, in the order of kernels/cpu/optim.cpp and kernels/cpu/sparse.cpp (which
// follow PyTorch's), on values of the compute type C.

template <typename C>
struct SgdHyper {
  C lr, weight_decay, momentum, keep;  // keep = 1 - dampening
  bool decay, nesterov, first_step, has_buffer;
};
template <typename C>
FRUGAL_HOST_DEVICE C sgd_step(C p, C g, C* buffer, const SgdHyper<C>& h) {
  C d = g;
  if (h.decay) d = d + h.weight_decay * p;
  if (h.has_buffer) {
    const C b = h.first_step ? d : *buffer * h.momentum + h.keep * d;
    *buffer = b;
    d = h.nesterov ? d + h.momentum * b : b;
  }
  return p - h.lr * d;
}

template <typename C>
struct AdamHyper {
  C beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, shrink, step_size, bc2_sqrt;
  bool coupled, decoupled, amsgrad;
};
template <typename C>
FRUGAL_HOST_DEVICE C adam_step(C p, C g, C* exp_avg, C* exp_avg_sq, C* max_exp_avg_sq,
                               const AdamHyper<C>& h) {
  if (h.coupled) g = g + h.weight_decay * p;
  if (h.decoupled) p = p * h.shrink;
  const C m = *exp_avg * h.beta1 + h.one_minus_beta1 * g;
  const C v = *exp_avg_sq * h.beta2 + h.one_minus_beta2 * (g * g);
  *exp_avg = m;
  *exp_avg_sq = v;
  C v_used = v;
  if (h.amsgrad) {
    v_used = *max_exp_avg_sq < v ? v : *max_exp_avg_sq;
    *max_exp_avg_sq = v_used;
  }
  const C denom = sqrt_(v_used) / h.bc2_sqrt + h.eps;
  return p - h.step_size * (m / denom);
}

template <typename C>
struct SparseAdamHyper {
  C one_minus_beta1, one_minus_beta2, eps, step_size;
};
template <typename C>
FRUGAL_HOST_DEVICE C sparse_adam_step(C p, C g, C* m, C* v, const SparseAdamHyper<C>& h) {
  const C m_new = *m + (g - *m) * h.one_minus_beta1;
  const C v_new = *v + (g * g - *v) * h.one_minus_beta2;
  *m = m_new;
  *v = v_new;
  const C denom = sqrt_(v_new) + h.eps;
  return p + -h.step_size * (m_new / denom);
}

// ---------------------------------------------------------------------------------------------------------------
// The fused ops of the GPT path (formulas in core/op_table.h): the activations' gradients, LayerNorm's dx,
// the attention probabilities' gradient and the GradScaler's check.

// dx = y > 0 ? dy : 0, y being ReLU's output (exactly where(y > 0, dy, 0); NaN in y gives 0)
struct ReluBackward {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C dy, C y) const {
    return y > C(0) ? dy : C(0);
  }
};
// dx = dy (Phi(x) + x phi(x))
struct GeluBackward {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C dy, C x) const {
    return dy * (C(0.5) + C(0.5) * erf_(x * C(0.70710678118654752)) +
                 x * C(0.39894228040143267794) * exp_(C(-0.5) * x * x));
  }
};
// dx = dy ((1 + t) / 2 + x (1 - t^2) k (1 + 3 c x^2) / 2), t = tanh(k (x + c x^3))
struct GeluTanhBackward {
  template <typename C>
  FRUGAL_HOST_DEVICE C operator()(C dy, C x) const {
    const C k = C(0.79788456080286535588), c = C(0.044715);
    const C t = tanh_(k * x * (C(1) + c * x * x));
    return dy * C(0.5) * (C(1) + t + x * (C(1) - t * t) * k * (C(1) + C(3) * c * x * x));
  }
};

// LayerNorm backward of one element: dx = rstd (g - mean(g) - xh mean(g xh)), g = dy weight, xh the
// normalised input.
template <typename C>
FRUGAL_HOST_DEVICE C layer_norm_dx(C g, C xh, C rstd, C mean_g, C mean_gx) {
  return rstd * (g - mean_g - xh * mean_gx);
}

// The attention probabilities' gradient of one element: dx = scale y (dy - sum_k dy[k] y[k]).
template <typename C>
FRUGAL_HOST_DEVICE C attention_softmax_dx(C y, C dy, C dot, C scale) {
  return scale * y * (dy - dot);
}

// Whether a gradient element makes the GradScaler skip the step: inf or NaN.
template <typename C>
FRUGAL_HOST_DEVICE bool non_finite(C x) {
  return !(fabs_(x) <= std::numeric_limits<C>::max());  // false for finite x, true for inf and NaN
}

}  // namespace frugal::math
