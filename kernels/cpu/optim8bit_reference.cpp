// The naive reference of op_adam8bit_step (adam8bit_step_reference_cpu, kernels/cpu/reference.h), which
// the CPU kernels (kernels/cpu/optim8bit.cpp, optim8bit_float8.cpp) equal bit for bit, and the codes from
// their definitions: the dynamic code's by a scan of its 256 entries, the float8 codes' by a scan of their
// magnitudes.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/op_table_optim.h"
#include "kernels/cpu/optim8bit.h"
#include "kernels/cpu/reference.h"
#include "kernels/dynamic_code.h"
#include "kernels/float8_code.h"

namespace frugal {
namespace {

using dynamic_code::Code;
using optim8bit::inverse_scale;

// The naive reference: one element at a time, the moments of a block in vectors, the scale in a plain loop
// and each code by a scan of all 256 entries for the nearest (in f64; ties toward 0, NaN to 0).
uint8_t quantize_naive(const Code& c, float q) {
  if (q != q) return uint8_t(c.zero);
  const double x = std::min(std::max(double(q), double(c.value[0])), double(c.value[255]));  // inf: an end
  int best = 0;
  double best_distance = std::fabs(x - double(c.value[0]));
  for (int k = 1; k < 256; ++k) {
    const double d = std::fabs(x - double(c.value[k]));
    if (d < best_distance || (d == best_distance && std::fabs(c.value[k]) < std::fabs(c.value[best]))) {
      best = k;
      best_distance = d;
    }
  }
  return uint8_t(best);
}

// The float8 codes from their definition (Note [the float8 codes], kernels/float8_code.h): magnitude k, of
// e = k >> M and m = k & (2^M - 1), is (1 + m / 2^M) x 2^(e - 15), or m x 2^(-14 - M) for e = 0; a value's
// code by a scan of every magnitude for the nearest (in f64; a tie to the even code).
double float8_magnitude_naive(int k, int mantissa) {
  const int e = k >> mantissa, m = k & ((1 << mantissa) - 1);
  return e == 0 ? std::ldexp(double(m), -14 - mantissa)
                : std::ldexp(1 + std::ldexp(double(m), -mantissa), e - 15);
}
// Every magnitude of each code, [0]: signed (128), [1]: unsigned (256).
const std::array<std::array<double, 256>, 2>& float8_magnitudes() {
  static const std::array<std::array<double, 256>, 2> table = [] {
    std::array<std::array<double, 256>, 2> t{};
    for (int k = 0; k < 256; ++k) t[0][size_t(k)] = float8_magnitude_naive(k & 0x7f, 3);
    for (int k = 0; k < 256; ++k) t[1][size_t(k)] = float8_magnitude_naive(k, 4);
    return t;
  }();
  return table;
}
double float8_decode_naive(bool is_signed, uint8_t code) {
  if (!is_signed) return float8_magnitudes()[1][code];
  const double a = float8_magnitudes()[0][code & 0x7f];
  return code & 0x80 ? -a : a;
}
uint8_t float8_encode_naive(bool is_signed, float q) {
  if (q != q || (!is_signed && !(q > 0))) return 0;
  const std::array<double, 256>& magnitude = float8_magnitudes()[is_signed ? 0 : 1];
  const int largest = is_signed ? 127 : 255;
  const double a = std::min(std::fabs(double(q)), magnitude[size_t(largest)]);  // inf: the top
  int best = 0;
  double best_distance = a;
  for (int k = 1; k <= largest; ++k) {
    const double d = std::fabs(a - magnitude[size_t(k)]);
    if (d < best_distance || (d == best_distance && k % 2 == 0)) {
      best = k;
      best_distance = d;
    }
  }
  return uint8_t(is_signed && std::signbit(q) ? 0x80 | best : best);
}

template <typename T>
void adam8bit_step_reference(const Adam8bitStepArgs& a) {
  using C = acc_t<T>;
  T* param = static_cast<T*>(a.param);
  const T* grad = static_cast<const T*>(a.grad);
  const math::Adam8bitHyper<C> h = math::adam8bit_hyper<C>(a);
  const Code& code1 = dynamic_code::signed_code();
  const Code& code2 = dynamic_code::unsigned_code();
  const bool float8 = a.float8;
  for (int64_t begin = 0, b = 0; begin < a.n; begin += a.block_size, ++b) {
    const int64_t len = std::min(a.block_size, a.n - begin);
    std::vector<C> m(size_t(len), C(0)), v(size_t(len), C(0));
    const auto old = float8_code::factors_of<C>(a.exp_avg_absmax[b], a.exp_avg_sq_absmax[b]);
    for (int64_t i = 0; i < len; ++i) {
      const int64_t k = begin + i;
      C m_old = C(code1.value[a.exp_avg_codes[k]]) * C(a.exp_avg_absmax[b]);
      C v_old = C(code2.value[a.exp_avg_sq_codes[k]]) * C(a.exp_avg_sq_absmax[b]);
      if (float8) {
        m_old = C(float8_decode_naive(true, a.exp_avg_codes[k])) * old.exp_avg;
        const C root = C(float8_decode_naive(false, a.exp_avg_sq_codes[k])) * old.root;
        v_old = root * root;
      }
      const math::Adam8bitElement<C> e = math::adam8bit_step(C(param[k]), C(grad[k]), m_old, v_old, h);
      param[k] = T(e.p);
      m[size_t(i)] = e.m;
      v[size_t(i)] = e.v;
    }
    C max1 = 0, max2 = 0;
    for (int64_t i = 0; i < len; ++i) {
      max1 = std::max(max1, math::finite_abs(m[size_t(i)]));
      max2 = std::max(max2, math::finite_abs(v[size_t(i)]));
    }
    a.exp_avg_absmax[b] = float(max1);
    a.exp_avg_sq_absmax[b] = float(max2);
    if (float8) {
      // The largest finite root of exp_avg_sq is its scale.
      C max_root = 0;
      for (int64_t i = 0; i < len; ++i)
        max_root = std::max(max_root, math::finite_abs(math::sqrt_(v[size_t(i)])));
      a.exp_avg_sq_absmax[b] = float(max_root);
      const auto now = float8_code::factors_of<C>(a.exp_avg_absmax[b], a.exp_avg_sq_absmax[b]);
      for (int64_t i = 0; i < len; ++i) {
        a.exp_avg_codes[begin + i] = float8_encode_naive(true, float(m[size_t(i)] * now.inv_exp_avg));
        a.exp_avg_sq_codes[begin + i] =
            float8_encode_naive(false, float(math::sqrt_(v[size_t(i)]) * now.inv_root));
      }
      continue;
    }
    const C inv1 = inverse_scale<C>(a.exp_avg_absmax[b]), inv2 = inverse_scale<C>(a.exp_avg_sq_absmax[b]);
    for (int64_t i = 0; i < len; ++i) {
      a.exp_avg_codes[begin + i] = quantize_naive(code1, float(m[size_t(i)] * inv1));
      a.exp_avg_sq_codes[begin + i] = quantize_naive(code2, float(v[size_t(i)] * inv2));
    }
  }
}

}  // namespace

void adam8bit_step_reference_cpu(DType dtype, const Adam8bitStepArgs& a) {
  switch (dtype) {
    case DType::F32:
      return adam8bit_step_reference<float>(a);
    case DType::F64:
      return adam8bit_step_reference<double>(a);
    case DType::F16:
      return adam8bit_step_reference<Half>(a);
    case DType::BF16:
      return adam8bit_step_reference<BFloat16>(a);
    default:
      FRUGAL_CHECK_DTYPE(false, "adam8bit_step_reference_cpu: no kernel for dtype ", dtype_name(dtype),
                         "; the parameters of Adam8bit are f32, f64, f16 or bf16");
  }
}

uint8_t dynamic_code_quantize_reference(bool is_signed, float q) {
  return quantize_naive(is_signed ? dynamic_code::signed_code() : dynamic_code::unsigned_code(), q);
}
uint8_t float8_code_encode_reference(bool is_signed, float q) { return float8_encode_naive(is_signed, q); }
double float8_code_decode_reference(bool is_signed, uint8_t code) {
  return float8_decode_naive(is_signed, code);
}

}  // namespace frugal
