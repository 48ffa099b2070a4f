// The 8-bit dynamic code that optim::Adam8bit stores its moments in (bitsandbytes' "dynamic map", from
// Dettmers' 8-bit approximations, 2015): 256 values in [-1, 1], dense near 0 and sparse near 1, that a value
// divided by its block's largest |value| is rounded to; and Adam8bit's update of one element. Built once on
// the host; plain C++ that the CPU and CUDA kernels (kernels/cpu/optim8bit.cpp, kernels/cuda/optim8bit.cu)
// and the tests share. No CUDA header.
//
//   const dynamic_code::Code& c = dynamic_code::signed_code();
//   uint8_t k = dynamic_code::quantize(c, 0.3f);  float back = c.value[k];  // 0.3 to the nearest entry
//
// Note [the dynamic code]: as bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8),
// decade i = 0..6 covers [0.1, 1] x 10^(i-6) with 2^i (signed) or 2^(i+1) (unsigned) evenly spaced entries
// (the means of linspace(0.1, 1, items + 1)), mirrored below 0 for the signed code; then 0 and 1. Signed:
// 127 negatives (down to -0.99297), 0, 127 positives and 1.0; unsigned: 0, 254 positives and 1.0. Entries
// are ascending, so a code compares like its value. Rounding goes to the nearest entry, a tie to the one
// nearer 0, NaN to 0; beyond the ends to the end. That rule is kept as thresholds: on each side of 0
// (magnitudes m_0 = 0 < m_1 < ... of that side), threshold[k] is the largest float at or below the exact
// midpoint of m_k and m_{k+1}, so for every float a >= 0, `a > threshold[k]` exactly when a is nearer
// m_{k+1} (ties to m_k). The code of q is then zero +- (how many thresholds of its side |q| exceeds), found
// by binary search here (the GPU) or a bucket table and a fixed number of steps (the CPU).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/math.h"

namespace frugal::dynamic_code {

// Trivial (no member initialisers), so that a GPU block can keep a copy in shared memory.
struct Code {
  float value[256];  // ascending
  int zero;          // value[zero] == 0
  // Side 0 holds q >= 0 (magnitudes value[zero + k]), side 1 q < 0 (magnitudes -value[zero - k]), k = 0 ..
  // count[s] - 1; threshold[s][count[s] - 1] is +inf (the entries past it are unused, 0).
  int count[2];
  float threshold[2][256];
};

// The code of q: nearest entry, ties toward 0, NaN to 0 (Note [the dynamic code]).
FRUGAL_HOST_DEVICE inline uint8_t quantize(const Code& c, float q) {
  const int side = q < 0 ? 1 : 0;
  const float a = q < 0 ? -q : q;
  const float* t = c.threshold[side];
  int lo = 0, hi = c.count[side] - 1;  // the answer k lies in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (a > t[mid])
      lo = mid + 1;
    else
      hi = mid;
  }
  const int k = a == a ? lo : 0;
  return uint8_t(side ? c.zero - k : c.zero + k);
}

// The decades of the code (Note [the dynamic code]): decade i holds decade_items(is_signed, i) entries evenly
// spread over [0.1, 1] x 10^(i - 6).
inline constexpr int kDecades = 7;
constexpr int decade_items(bool is_signed, int i) { return is_signed ? 1 << i : 1 << (i + 1); }

// Builds the signed or unsigned code (host only; signed_code()/unsigned_code() keep one of each).
inline Code make_code(bool is_signed) {
  double mags[256];  // the positive entries below 1, ascending
  int n = 0;
  double scale = 1e-6;
  for (int i = 0; i < kDecades; ++i, scale *= 10) {
    const int items = decade_items(is_signed, i);
    for (int j = 0; j < items; ++j) {
      const double lo = 0.1 + 0.9 * double(j) / double(items), hi = 0.1 + 0.9 * double(j + 1) / double(items);
      mags[n++] = scale * (lo + hi) / 2;
    }
  }
  Code c{};
  int k = 0;
  if (is_signed)
    for (int j = n - 1; j >= 0; --j) c.value[k++] = -float(mags[j]);
  c.zero = k;
  c.value[k++] = 0;
  for (int j = 0; j < n; ++j) c.value[k++] = float(mags[j]);
  c.value[k++] = 1;
  // k == 256 here: 127 + 1 + 127 + 1 signed, 1 + 254 + 1 unsigned.
  c.count[0] = 256 - c.zero;
  c.count[1] = c.zero + 1;
  for (int side = 0; side < 2; ++side) {
    double magnitude[256];  // the side's, ascending from 0
    for (int j = 0; j < c.count[side]; ++j) magnitude[j] = side ? -c.value[c.zero - j] : c.value[c.zero + j];
    for (int j = 0; j + 1 < c.count[side]; ++j) {
      const double mid = (magnitude[j] + magnitude[j + 1]) / 2;  // exact in double
      float t = float(mid);
      if (double(t) > mid) t = std::nextafter(t, 0.0f);
      c.threshold[side][j] = t;
    }
    c.threshold[side][c.count[side] - 1] = std::numeric_limits<float>::infinity();
  }
  return c;
}

inline const Code& signed_code() {
  static const Code c = make_code(true);
  return c;
}
inline const Code& unsigned_code() {
  static const Code c = make_code(false);
  return c;
}

}  // namespace frugal::dynamic_code

namespace frugal::math {

// One element of Adam8bit's update (op_adam8bit_step, every backend): from the dequantised
// moments m and v, the new moments and parameter. The parameter's step uses the new moments before they are
// rounded to the code. Every multiply-add is an explicit fma, so that a vector loop, a scalar loop and the
// GPU round alike (a contraction the compiler chose could differ between them).
//
// The step is Adam's in bitsandbytes' form (its 8-bit kernels'): lr / (1 - beta1^t) x m / (sqrt(v) /
// c + eps), c = sqrt(1 - beta2^t), is computed as (lr c / (1 - beta1^t)) x m / (sqrt(v) + eps c), the
// correction folded into the step size and eps on the host: one division an element instead of two. It
// equals f32 Adam's (optim/adam.h, PyTorch's order of operations) to a rounding or two, far below the
// 8-bit moments' own rounding. On a Zen 3 the float8 kernel took 0.91x its time with two divisions.
template <typename C>
struct Adam8bitHyper {
  C beta1, beta2, one_minus_beta1, one_minus_beta2;
  C eps;        // eps x sqrt(1 - beta2^t)
  C step_size;  // lr x sqrt(1 - beta2^t) / (1 - beta1^t)
  C weight_decay, shrink;
  bool coupled, decoupled;
};
// The hyperparameters of a step from its arguments (Args: Adam8bitStepArgs of core/op_table_optim.h, a
// template argument so that this header needs no op table), computed in C; on the host, for every backend.
template <typename C, typename Args>
Adam8bitHyper<C> adam8bit_hyper(const Args& a) {
  const bool decay = a.weight_decay != 0;
  return {C(a.beta1),
          C(a.beta2),
          C(1 - a.beta1),
          C(1 - a.beta2),
          C(a.eps * a.bias_correction2_sqrt),
          C(a.step_size * a.bias_correction2_sqrt),
          C(a.weight_decay),
          C(1 - a.lr * a.weight_decay),
          decay && !a.decoupled_weight_decay,
          decay && a.decoupled_weight_decay};
}
template <typename C>
struct Adam8bitElement {
  C p, m, v;
};
FRUGAL_HOST_DEVICE inline float fma_(float a, float b, float c) { return ::fmaf(a, b, c); }
FRUGAL_HOST_DEVICE inline double fma_(double a, double b, double c) { return ::fma(a, b, c); }
template <typename C>
#if defined(__GNUC__) && !defined(__CUDACC__)
[[gnu::always_inline]]  // inside the CPU kernel's simd loop; the call alone stops its vectorisation
#endif
FRUGAL_HOST_DEVICE inline Adam8bitElement<C>
adam8bit_step(C p, C g, C m, C v, const Adam8bitHyper<C>& h) {
  if (h.coupled) g = fma_(h.weight_decay, p, g);
  if (h.decoupled) p = p * h.shrink;
  m = fma_(h.beta1, m, h.one_minus_beta1 * g);
  v = fma_(h.beta2, v, h.one_minus_beta2 * (g * g));
  const C denom = sqrt_(v) + h.eps;
  return {fma_(-h.step_size, m / denom, p), m, v};
}
// |x| when finite, else 0: a block's scale is its largest finite |moment| (Note [non-finite 8-bit moments],
// optim/adam8bit.h).
template <typename C>
FRUGAL_HOST_DEVICE C finite_abs(C x) {
  const C a = x < C(0) ? -x : x;
  return a <= std::numeric_limits<C>::max() ? a : C(0);
}

}  // namespace frugal::math
