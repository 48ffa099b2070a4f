// The float8 codes that optim::Adam8bit can keep its moments in instead of the dynamic code
// (Adam8bitOptions::code, optim/adam8bit.h): a byte read as a small float, so that a kernel turns codes into
// values and values into codes by arithmetic alone, with no table and no search. Plain C++ that the CPU and
// CUDA kernels (kernels/cpu/optim8bit_float8.cpp, kernels/cuda/optim8bit.cu) and the tests share. No CUDA
// header.
//
//   float x = float8_code::decode_signed(0x3f);            // 0x3f: +, exponent 7, mantissa 7
//   uint8_t k = float8_code::encode_signed(x);             // 0x3f again
//   uint8_t r = float8_code::encode_unsigned(0.3f);        // the nearest E4M4 magnitude
//
// Note [the float8 codes]: both are IEEE-style floats of 4 exponent bits (bias 15: the largest magnitude is
// just under 2) with subnormals, and no infinity or NaN, so that every byte is a finite value:
// - signed (exp_avg): E4M3, a sign bit then 7 bits of magnitude: 1.875 down to 2^-17, a normal value
//   rounded within 6.25%;
// - unsigned (the square root of exp_avg_sq): E4M4, 8 bits of magnitude: 1.9375 down to 2^-18, within 3.1%.
// A block's values are scaled so that its largest maps to the top code exactly: the stored moment is
// value x absmax / top. exp_avg_sq is stored as its square root, scaled by the block's largest root: the
// kernel takes that root anyway, its rounding is the denominator's directly, and the range of exp_avg_sq
// covered is squared, down to 1e-12 of the block's largest. Rounding goes to the nearest code, a tie to
// the even one (IEEE's rule, so that the vector kernels round with an add); NaN to the code of +0; beyond the
// top (and inf) to the top; the unsigned code takes every q <= 0 to 0. Against the dynamic code (Note [the
// dynamic code], kernels/dynamic_code.h), which quantisation to its 256 entries costs a table lookup and a
// comparison per value, these cost a dozen integer operations; their precision and range compare in
// optim/adam8bit.h's Note [choosing the code].
//
// The arithmetic (for M mantissa bits): a magnitude a >= 2^-14 is a normal code, its f32 bits rounded to M
// bits of mantissa by an integer add (ties to even) and shifted: the code is the rounded bits less
// 112 << M (f32's exponent bias 127 less 15). Below 2^-14 codes are evenly spaced by 2^(-14 - M): adding
// 2^(9 - M) to a, whose f32 spacing is exactly that, rounds a to its code, which is then the sum's bits less
// the constant's. Decoding is the same backwards: for a code k >= 2^M the bits (k + (112 << M)) << (23 - M);
// below, the value of k + 2^M less 2^-14 (exact). Every step is exact or one IEEE rounding, so a scalar
// loop, a vector loop and the GPU agree bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/math.h"

namespace frugal::float8_code {

FRUGAL_HOST_DEVICE inline uint32_t bits_of(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  return b;
}
FRUGAL_HOST_DEVICE inline float float_of(uint32_t b) {
  float x;
  memcpy(&x, &b, 4);
  return x;
}

// a + b rounded on its own: nvcc would otherwise fuse a product that feeds a into one fma. On the CPU, GCC's
// C++ default (-ffp-contract=fast) fuses across statements too, but only a product whose every use is an add:
// the callers' products are also compared (the subnormal test) or pass through an absolute value first, so
// none fuses (GCC 12 at -O3 emits no fma for encode_signed or encode_unsigned of a product, vectorised or
// not); clang's default fuses within one expression only.
FRUGAL_HOST_DEVICE inline float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// One format's constants: kMantissa bits of mantissa under 4 bits of exponent.
template <int kMantissa>
struct Format {
  static constexpr int kShift = 23 - kMantissa;           // f32 mantissa bits below the code's
  static constexpr uint32_t kOffset = 112u << kMantissa;  // code = f32 bits >> kShift, less this
  static constexpr uint32_t kLargest = (16u << kMantissa) - 1;
  static constexpr uint32_t kFirstNormal = 1u << kMantissa;
  static constexpr float kSmallestNormal = 1.0f / 16384;               // 2^-14
  static constexpr float kMagic = float(1u << (9 - kMantissa));        // spacing 2^(-14 - kMantissa)
  static constexpr float kTop = 2.0f - 1.0f / float(1u << kMantissa);  // the largest magnitude
};
using Signed = Format<3>;
using Unsigned = Format<4>;

// The code of a magnitude a >= 0, not NaN (inf: the largest).
template <typename F>
FRUGAL_HOST_DEVICE inline uint32_t encode_magnitude(float a) {
  uint32_t k;
  if (a < F::kSmallestNormal) {
    k = bits_of(add_rn(a, F::kMagic)) - bits_of(F::kMagic);
  } else {
    const uint32_t b = bits_of(a);
    k = ((b + ((1u << (F::kShift - 1)) - 1) + ((b >> F::kShift) & 1)) >> F::kShift) - F::kOffset;
  }
  return k < F::kLargest ? k : F::kLargest;
}

// The magnitude of a code k <= F::kLargest.
template <typename F>
FRUGAL_HOST_DEVICE inline float decode_magnitude(uint32_t k) {
  if (k >= F::kFirstNormal) return float_of((k + F::kOffset) << F::kShift);
  return float_of((k + F::kFirstNormal + F::kOffset) << F::kShift) - F::kSmallestNormal;
}

// The signed code of q: its sign bit, then its magnitude's code; NaN to 0 (+0's code).
FRUGAL_HOST_DEVICE inline uint8_t encode_signed(float q) {
  if (!(q == q)) return 0;
  const uint32_t sign = bits_of(q) >> 31;
  return uint8_t(sign << 7 | encode_magnitude<Signed>(q < 0 ? -q : q));
}
FRUGAL_HOST_DEVICE inline float decode_signed(uint8_t code) {
  const float a = decode_magnitude<Signed>(code & 0x7fu);
  return code & 0x80u ? -a : a;
}

// The unsigned code of q: 0 for q <= 0 and NaN.
FRUGAL_HOST_DEVICE inline uint8_t encode_unsigned(float q) {
  return q > 0 ? uint8_t(encode_magnitude<Unsigned>(q)) : uint8_t(0);
}
FRUGAL_HOST_DEVICE inline float decode_unsigned(uint8_t code) { return decode_magnitude<Unsigned>(code); }

// A block's factors in the compute type C, from its scales (the largest finite |exp_avg| and the largest
// finite root of exp_avg_sq): a moment is its code's value times `exp_avg` (a root times `root`); a new
// moment times `inv_exp_avg` (a new root times `inv_root`) is rounded to its code. A zero scale gives a 0
// inverse (every code then 0's: x 0 is 0 or NaN).
template <typename C>
struct BlockFactors {
  C exp_avg, root, inv_exp_avg, inv_root;
};
template <typename C>
FRUGAL_HOST_DEVICE inline BlockFactors<C> factors_of(float absmax, float root_absmax) {
  return {C(absmax) / C(Signed::kTop), C(root_absmax) / C(Unsigned::kTop),
          absmax > 0 ? C(Signed::kTop) / C(absmax) : C(0),
          root_absmax > 0 ? C(Unsigned::kTop) / C(root_absmax) : C(0)};
}

}  // namespace frugal::float8_code
