// CPU Adam8bit update (op_adam8bit_step): per quantisation block, dequantise both moments, the Adam/AdamW
// step from the new f32 moments (math::adam8bit_step, kernels/dynamic_code.h), the block's new scales, and
// the moments requantised (kernels/dynamic_code.h). Blocks run in parallel; inside one, two plain loops the
// compiler vectorises (gathers for the table lookups; Note [four passes over a block]). Beside it, the naive
// reference it is tested against bit for bit (adam8bit_step_reference_cpu, kernels/cpu/reference.h).
#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/op_table_optim.h"
#include "core/parallel.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/register.h"
#include "kernels/dynamic_code.h"

namespace frugal {
namespace {

using dynamic_code::Code;

// Note [quantising with buckets]: a float's bits, shifted right, are monotone in its value, so the bits
// above the lowest 23 - kMantissaBits (the exponent and kMantissaBits of mantissa) name a bucket of values.
// With 7 mantissa bits no bucket holds more than one threshold of either code (the table build checks it),
// so a value's code step is its bucket's first step, base[b], plus one if it exceeds split[b], the one
// threshold that can lie in the bucket: two independent loads, no search. Everything below 2^kMinExponent is
// bucket 0 (it lies below the first threshold of both codes, 1.6e-7), everything from 2 up (and inf, NaN)
// the last. Exact: the same thresholds as dynamic_code::quantize, hence the same codes. Per code, the tables
// take 2 x 12 KB of splits and 2 x 12 KB of bases.
constexpr int kMantissaBits = 7;
constexpr int kMinExponent = -23, kMaxExponent = 1;  // buckets cover [2^-23, 2^1)
constexpr int kBuckets = (kMaxExponent - kMinExponent) << kMantissaBits;
constexpr int32_t kFirstBucketBits = (127 + kMinExponent) << kMantissaBits;

struct FastCode {
  const Code* code = nullptr;
  float split[2 * kBuckets];   // side 0's buckets, then side 1's
  int32_t base[2 * kBuckets];  // int32, not u8: gcc vectorises the loads of 32-bit elements only
};

int32_t bucket_of(float a) {
  const int32_t b = int32_t(std::bit_cast<uint32_t>(a) >> (23 - kMantissaBits)) - kFirstBucketBits;
  return std::min(std::max(b, int32_t(0)), int32_t(kBuckets - 1));
}

// The code step of a >= 0 on one side: how many of its thresholds a exceeds.
int32_t steps_of(const Code& c, int side, float a) {
  int32_t k = 0;
  while (k + 1 < c.count[side] && a > c.threshold[side][k]) ++k;
  return k;
}

FastCode make_fast(const Code& c) {
  FastCode f;
  f.code = &c;
  for (int side = 0; side < 2; ++side)
    for (int b = 0; b < kBuckets; ++b) {
      const uint32_t first = uint32_t(b + kFirstBucketBits) << (23 - kMantissaBits);
      const float lowest = b == 0 ? 0.0f : std::bit_cast<float>(first);
      const float highest = b == kBuckets - 1
                                ? std::numeric_limits<float>::infinity()
                                : std::bit_cast<float>(first + (1u << (23 - kMantissaBits)) - 1);
      const int32_t base = steps_of(c, side, lowest);
      FRUGAL_ASSERT(steps_of(c, side, highest) - base <= 1,
                    "adam8bit: a bucket of the dynamic code holds two thresholds; more mantissa bits needed");
      f.base[side * kBuckets + b] = base;
      f.split[side * kBuckets + b] = c.threshold[side][base];
    }
  return f;
}

const FastCode& fast_signed() {
  static const FastCode f = make_fast(dynamic_code::signed_code());
  return f;
}
const FastCode& fast_unsigned() {
  static const FastCode f = make_fast(dynamic_code::unsigned_code());
  return f;
}

// dynamic_code::quantize(*f.code, q), through the buckets (Note [quantising with buckets]). kSigned false:
// q >= 0 or NaN, as the second moment is (a negative q gets 0's code, the nearest entry).
template <bool kSigned>
inline uint8_t quantize_fast(const FastCode& f, float q) {
  const int32_t side = kSigned ? int32_t(q < 0) : 0;
  const float a = std::fabs(q);
  const int32_t b = side * kBuckets + bucket_of(a);
  int32_t k = f.base[b] + int32_t(a > f.split[b]);
  // NaN (and, unsigned, a negative q) to 0's code; written without && so that the loop stays branch-free.
  const int32_t to_zero = int32_t(!(a == a)) | (kSigned ? 0 : int32_t(q < 0));
  k &= to_zero - 1;
  return uint8_t(f.code->zero + (1 - 2 * side) * k);
}

// codes[i] = the code of x[i] x inv_scale, i < len.
template <bool kSigned, typename C>
void quantize_block(const FastCode& f, const C* x, C inv_scale, uint8_t* codes, int64_t len) {
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) codes[i] = quantize_fast<kSigned>(f, float(x[i] * inv_scale));
}

// What a block's moments are multiplied by before rounding to the code: 1 / its scale, or 0 for a zero
// scale (every moment 0 or non-finite: each gets 0's code, x 0 being 0 or NaN). A multiply rather than a
// division per element; a product may then exceed 1 by a rounding, which rounds to the code's end.
template <typename C>
C inverse_scale(float absmax) {
  return absmax > 0 ? C(1) / C(absmax) : C(0);
}

template <typename C>
math::Adam8bitHyper<C> hyper_of(const Adam8bitStepArgs& a) {
  const bool decay = a.weight_decay != 0;
  return {C(a.beta1),
          C(a.beta2),
          C(1 - a.beta1),
          C(1 - a.beta2),
          C(a.eps),
          C(a.weight_decay),
          C(1 - a.lr * a.weight_decay),
          C(a.step_size),
          C(a.bias_correction2_sqrt),
          decay && !a.decoupled_weight_decay,
          decay && a.decoupled_weight_decay};
}

// Note [four passes over a block]: the block's moments live in two f32 buffers on the stack, and each step
// is its own plain loop over them (dequantise, update, scales, quantise): one loop doing all, with the
// gathers, the update and the max reductions together, ran scalar (gcc 12 vectorised it, then took the
// scalar version), 13x slower than Adam's kernel. The block stays in L1 across the passes.

// out[i] = value[codes[i]] x scale, i < len.
template <typename C>
void dequantize_block(const float* value, const uint8_t* codes, C scale, C* out, int64_t len) {
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) out[i] = C(value[codes[i]]) * scale;
}

// The update of len elements: p, g (T); m, v (C) in: the dequantised moments, out: the new ones.
template <typename T, typename C>
void update_block(T* p, const T* g, C* m, C* v, const math::Adam8bitHyper<C> h, int64_t len) {
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) {
    const math::Adam8bitElement<C> e = math::adam8bit_step(C(p[i]), C(g[i]), m[i], v[i], h);
    p[i] = T(e.p);
    m[i] = e.m;
    v[i] = e.v;
  }
}

// The largest finite |x[i]|, i < len (0 if none).
template <typename C>
C finite_max(const C* x, int64_t len) {
  C r = 0;
#pragma omp simd reduction(max : r)
  for (int64_t i = 0; i < len; ++i) r = std::max(r, math::finite_abs(x[i]));
  return r;
}

// param, grad [n] (T); codes [n] (u8), absmax [ceil(n / block_size)] (f32), per moment. The weight decay's
// kind is a template argument (as adam_loop's in kernels/cpu/optim.cpp), so the update is branch-free.
template <typename T, bool kCoupled, bool kDecoupled>
void adam8bit_loop(const Adam8bitStepArgs& a) {
  using C = acc_t<T>;
  T* param = static_cast<T*>(a.param);
  const T* grad = static_cast<const T*>(a.grad);
  const math::Adam8bitHyper<C> h = hyper_of<C>(a);
  const FastCode& f1 = fast_signed();
  const FastCode& f2 = fast_unsigned();
  const int64_t bs = a.block_size, blocks = (a.n + bs - 1) / bs;
  parallel_for(0, blocks, std::max<int64_t>(1, kGrain / bs), [&](int64_t block_begin, int64_t block_end) {
    alignas(64) C m[kAdam8bitMaxBlock], v[kAdam8bitMaxBlock];  // Note [four passes over a block]
    math::Adam8bitHyper<C> hyper = h;  // set here, so that the flags are constants in this loop
    hyper.coupled = kCoupled;
    hyper.decoupled = kDecoupled;
    for (int64_t b = block_begin; b < block_end; ++b) {
      const int64_t begin = b * bs, len = std::min(bs, a.n - begin);
      uint8_t* c1 = a.exp_avg_codes + begin;
      uint8_t* c2 = a.exp_avg_sq_codes + begin;
      dequantize_block(f1.code->value, c1, C(a.exp_avg_absmax[b]), m, len);
      dequantize_block(f2.code->value, c2, C(a.exp_avg_sq_absmax[b]), v, len);
      update_block(param + begin, grad + begin, m, v, hyper, len);
      const float absmax1 = float(finite_max(m, len)), absmax2 = float(finite_max(v, len));
      a.exp_avg_absmax[b] = absmax1;
      a.exp_avg_sq_absmax[b] = absmax2;
      quantize_block<true>(f1, m, inverse_scale<C>(absmax1), c1, len);
      quantize_block<false>(f2, v, inverse_scale<C>(absmax2), c2, len);
    }
  });
}

template <typename T>
void adam8bit_step_cpu(const Adam8bitStepArgs& a) {
  FRUGAL_ASSERT(a.block_size > 0 && a.block_size <= kAdam8bitMaxBlock, "adam8bit_step: block_size ",
                a.block_size, " got past the options' check");
  if (a.weight_decay != 0 && a.decoupled_weight_decay)
    adam8bit_loop<T, false, true>(a);
  else if (a.weight_decay != 0)
    adam8bit_loop<T, true, false>(a);
  else
    adam8bit_loop<T, false, false>(a);
}

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

template <typename T>
void adam8bit_step_reference(const Adam8bitStepArgs& a) {
  using C = acc_t<T>;
  T* param = static_cast<T*>(a.param);
  const T* grad = static_cast<const T*>(a.grad);
  const math::Adam8bitHyper<C> h = hyper_of<C>(a);
  const Code& code1 = dynamic_code::signed_code();
  const Code& code2 = dynamic_code::unsigned_code();
  for (int64_t begin = 0, b = 0; begin < a.n; begin += a.block_size, ++b) {
    const int64_t len = std::min(a.block_size, a.n - begin);
    std::vector<C> m(size_t(len), C(0)), v(size_t(len), C(0));
    for (int64_t i = 0; i < len; ++i) {
      const int64_t k = begin + i;
      const C m_old = C(code1.value[a.exp_avg_codes[k]]) * C(a.exp_avg_absmax[b]);
      const C v_old = C(code2.value[a.exp_avg_sq_codes[k]]) * C(a.exp_avg_sq_absmax[b]);
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
    const C inv1 = inverse_scale<C>(a.exp_avg_absmax[b]), inv2 = inverse_scale<C>(a.exp_avg_sq_absmax[b]);
    for (int64_t i = 0; i < len; ++i) {
      a.exp_avg_codes[begin + i] = quantize_naive(code1, float(m[size_t(i)] * inv1));
      a.exp_avg_sq_codes[begin + i] = quantize_naive(code2, float(v[size_t(i)] * inv2));
    }
  }
}

const bool kRegistered = [] {
  cpu::for_types<float, double, Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_adam8bit_step.set(DeviceType::CPU, dtype_v<T>, adam8bit_step_cpu<T>);
  });
  return true;
}();

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

uint8_t dynamic_code_quantize_cpu(bool is_signed, float q) {
  return is_signed ? quantize_fast<true>(fast_signed(), q) : quantize_fast<false>(fast_unsigned(), q);
}
uint8_t dynamic_code_quantize_reference(bool is_signed, float q) {
  return quantize_naive(is_signed ? dynamic_code::signed_code() : dynamic_code::unsigned_code(), q);
}

}  // namespace frugal
