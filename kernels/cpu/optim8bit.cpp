// CPU Adam8bit update (op_adam8bit_step): per quantisation block, dequantise both moments, the Adam/AdamW
// step from the new f32 moments (math::adam8bit_step, kernels/dynamic_code.h), the block's new scales, and
// the moments requantised (kernels/dynamic_code.h). Blocks run in parallel; inside one, two plain loops the
// compiler vectorises (gathers for the table lookups). Beside it, the naive reference it is tested against
// bit for bit (adam8bit_step_reference_cpu, kernels/cpu/reference.h).
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
// For each bucket, lut holds the code step k of the bucket's lowest value; a value of the bucket is then at
// most fixups thresholds further, which kFixups compare-and-add steps walk (the table build checks that
// kFixups suffices). Everything below 2^kMinExponent is one bucket (it lies below the first threshold of
// both codes, 1.6e-7), everything from 2 up (and inf, NaN) the last. Exact: the same thresholds as
// dynamic_code::quantize, hence the same codes.
constexpr int kMantissaBits = 7;
constexpr int kMinExponent = -24, kMaxExponent = 1;  // buckets cover [2^-24, 2^1)
constexpr int kBuckets = (kMaxExponent - kMinExponent) << kMantissaBits;
constexpr int32_t kFirstBucketBits = (127 + kMinExponent) << kMantissaBits;
constexpr int kFixups = 2;

struct FastCode {
  const Code* code = nullptr;
  int32_t lut[2 * kBuckets];  // side 0's buckets, then side 1's
  float threshold[2 * 256];   // code->threshold, flat
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
    for (int k = 0; k < 256; ++k) f.threshold[side * 256 + k] = c.threshold[side][k];
  for (int side = 0; side < 2; ++side)
    for (int b = 0; b < kBuckets; ++b) {
      const uint32_t first = uint32_t(b + kFirstBucketBits) << (23 - kMantissaBits);
      const float lowest = b == 0 ? 0.0f : std::bit_cast<float>(first);
      const float highest = b == kBuckets - 1
                                ? std::numeric_limits<float>::infinity()
                                : std::bit_cast<float>(first + (1u << (23 - kMantissaBits)) - 1);
      f.lut[side * kBuckets + b] = steps_of(c, side, lowest);
      FRUGAL_ASSERT(steps_of(c, side, highest) - f.lut[side * kBuckets + b] <= kFixups,
                    "adam8bit: a bucket of the dynamic code spans more than kFixups thresholds");
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
  int32_t k = f.lut[side * kBuckets + bucket_of(a)];
  const float* t = f.threshold + side * 256;
  static_assert(kFixups == 2, "quantize_fast walks two steps");
  k += int32_t(a > t[k]);
  k += int32_t(a > t[k]);
  // NaN (and, unsigned, a negative q) to 0's code; written without && so that the loop stays branch-free.
  const int32_t to_zero = int32_t(!(a == a)) | (kSigned ? 0 : int32_t(q < 0));
  k &= to_zero - 1;
  return uint8_t(f.code->zero + (1 - 2 * side) * k);
}

// codes[i] = the code of x[i] / scale, i < len.
template <bool kSigned, typename C>
void quantize_block(const FastCode& f, const C* x, C scale, uint8_t* codes, int64_t len) {
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) codes[i] = quantize_fast<kSigned>(f, float(x[i] / scale));
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

// param, grad [n] (T); codes [n] (u8), absmax [ceil(n / block_size)] (f32), per moment. The options are
// template arguments (as adam_loop's in kernels/cpu/optim.cpp), so the loops are branch-free.
template <typename T, bool kCoupled, bool kDecoupled>
void adam8bit_loop(const Adam8bitStepArgs& a) {
  using C = acc_t<T>;
  T* param = static_cast<T*>(a.param);
  const T* grad = static_cast<const T*>(a.grad);
  math::Adam8bitHyper<C> h = hyper_of<C>(a);
  h.coupled = kCoupled;
  h.decoupled = kDecoupled;
  const FastCode& f1 = fast_signed();
  const FastCode& f2 = fast_unsigned();
  const float* value1 = f1.code->value;
  const float* value2 = f2.code->value;
  const int64_t bs = a.block_size, blocks = (a.n + bs - 1) / bs;
  parallel_for(0, blocks, std::max<int64_t>(1, kGrain / bs), [&](int64_t block_begin, int64_t block_end) {
    alignas(64) C m_new[kAdam8bitMaxBlock], v_new[kAdam8bitMaxBlock];
    for (int64_t b = block_begin; b < block_end; ++b) {
      const int64_t begin = b * bs, len = std::min(bs, a.n - begin);
      T* p = param + begin;
      const T* g = grad + begin;
      uint8_t* c1 = a.exp_avg_codes + begin;
      uint8_t* c2 = a.exp_avg_sq_codes + begin;
      const C scale1 = C(a.exp_avg_absmax[b]), scale2 = C(a.exp_avg_sq_absmax[b]);
      C max1 = 0, max2 = 0;
#pragma omp simd reduction(max : max1, max2)
      for (int64_t i = 0; i < len; ++i) {
        const math::Adam8bitElement<C> e =
            math::adam8bit_step(C(p[i]), C(g[i]), C(value1[c1[i]]) * scale1, C(value2[c2[i]]) * scale2, h);
        p[i] = T(e.p);
        m_new[i] = e.m;
        v_new[i] = e.v;
        max1 = std::max(max1, math::finite_abs(e.m));
        max2 = std::max(max2, math::finite_abs(e.v));
      }
      const float absmax1 = float(max1), absmax2 = float(max2);
      a.exp_avg_absmax[b] = absmax1;
      a.exp_avg_sq_absmax[b] = absmax2;
      // A zero scale (every moment 0 or non-finite) stores every code as 0's: x / inf is 0 or NaN.
      const C inf = std::numeric_limits<C>::infinity();
      const C div1 = absmax1 > 0 ? C(absmax1) : inf, div2 = absmax2 > 0 ? C(absmax2) : inf;
      quantize_block<true>(f1, m_new, div1, c1, len);
      quantize_block<false>(f2, v_new, div2, c2, len);
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
    for (int64_t i = 0; i < len; ++i) {
      const float s1 = a.exp_avg_absmax[b], s2 = a.exp_avg_sq_absmax[b];
      a.exp_avg_codes[begin + i] = quantize_naive(code1, s1 > 0 ? float(m[size_t(i)] / C(s1)) : 0.0f);
      a.exp_avg_sq_codes[begin + i] = quantize_naive(code2, s2 > 0 ? float(v[size_t(i)] / C(s2)) : 0.0f);
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
