// Half (IEEE 754 binary16) and BFloat16 storage types. They only store: arithmetic converts to float,
// computes, and rounds back (round to nearest even), so every f16/bf16 op accumulates in f32.
//
// Written by hand rather than taken from Eigen so that core headers stay free of Eigen (and of CUDA's
// cuda_fp16.h); the kernels may still use Eigen's own types internally. The bit layouts are the standard
// ones, so buffers are interchangeable with PyTorch, safetensors and CUDA's __half / __nv_bfloat16.
#pragma once

#include <cstdint>
#include <cstring>

namespace frugal {

namespace detail {
inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp == 0) {
    if (man == 0) return bits_f32(sign);
    // Subnormal: value = man * 2^-24.
    float f = float(man) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

inline uint16_t float_to_half(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const uint32_t au = u & 0x7fffffffu;
  if (au >= 0x7f800000u) return uint16_t(sign | 0x7c00 | (au > 0x7f800000u ? 0x200 : 0));  // inf / nan
  if (au >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to a value >= 65520: overflow to inf
  if (au < 0x38800000u) {
    // Result is subnormal (or zero): scale so the float adder does the round-to-nearest-even for us.
    float a =
        bits_f32(au) + 0.5f;  // 0.5 = 2^-1: aligns the half subnormal ulp (2^-24) to the float's last bit
    return uint16_t(sign | (f32_bits(a) - 0x3f000000u));
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
  uint32_t v = au - 0x38000000u;
  v += 0xfff + ((v >> 13) & 1);
  return uint16_t(sign | (v >> 13));
}

inline float bf16_to_float(uint16_t b) { return bits_f32(uint32_t(b) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet nan
  u += 0x7fff + ((u >> 16) & 1);                                           // round to nearest even
  return uint16_t(u >> 16);
}
}  // namespace detail

struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(detail::float_to_half(f)) {}  // NOLINT: implicit like a built-in float type
  operator float() const { return detail::half_to_float(bits); }
  static Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(detail::float_to_bf16(f)) {}  // NOLINT: implicit like a built-in float type
  operator float() const { return detail::bf16_to_float(bits); }
  static BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

}  // namespace frugal
