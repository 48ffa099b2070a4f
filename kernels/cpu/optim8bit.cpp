// CPU Adam8bit update (op_adam8bit_step): per quantisation block, dequantise both moments, the Adam/AdamW
// step from the new f32 moments (math::adam8bit_step, kernels/dynamic_code.h), the block's new scales, and
// the moments requantised. Blocks run in parallel (adam8bit_loop). This file holds the dynamic code's blocks
// (kernels/dynamic_code.h): two passes with AVX2 (Note [Adam8bit with AVX2]) where the build targets it, else
// plain loops the compiler vectorises (Note [four passes over a block]); its AVX-512 block (Note [Adam8bit
// with AVX-512]) is in optim8bit_dynamic_avx512.cpp, the float8 codes' blocks in optim8bit_float8.cpp, the
// naive reference that all equal bit for bit in optim8bit_reference.cpp.
#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "core/op_table_optim.h"
#include "core/parallel.h"
#include "kernels/cpu/optim8bit.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/register.h"
#include "kernels/dynamic_code.h"

namespace frugal::optim8bit {
namespace {

using dynamic_code::Code;

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
      const uint32_t first = uint32_t(b + kFirstBucketBits) << kLowBits;
      const float lowest = b == 0 ? 0.0f : std::bit_cast<float>(first);
      const float highest = b == kBuckets - 1 ? std::numeric_limits<float>::infinity()
                                              : std::bit_cast<float>(first + uint32_t(kLowMask));
      const int32_t base = steps_of(c, side, lowest);
      FRUGAL_ASSERT(steps_of(c, side, highest) - base <= 1,
                    "adam8bit: a bucket of the dynamic code holds two thresholds; more mantissa bits needed");
      const uint32_t split = std::bit_cast<uint32_t>(c.threshold[side][base]);
      const bool inside = (split >> kLowBits) == uint32_t(b + kFirstBucketBits);
      FRUGAL_ASSERT(!inside || (b != 0 && b != kBuckets - 1),
                    "adam8bit: a threshold of the dynamic code lies in a clamped bucket");
      f.entry[side * kBuckets + b] = base << kLowBits | (inside ? int32_t(split) & kLowMask : kLowMask);
    }
  return f;
}

// codes[i] = the code of x[i] x inv_scale, i < len.
template <bool kSigned, typename C>
void quantize_block(const FastCode& f, const C* x, C inv_scale, uint8_t* codes, int64_t len) {
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) codes[i] = quantize_fast<kSigned>(f, float(x[i] * inv_scale));
}

// Note [four passes over a block]: the block's moments live in two f32 buffers on the stack, and each step
// is its own plain loop over them (dequantise, update, scales, quantise): one loop doing all, with the
// gathers, the update and the max reductions together, ran scalar (gcc 12 vectorised it, then took the
// scalar version), 13x slower than Adam's kernel. The block stays in L1 across the passes. The f32 kernel
// with AVX2 takes two passes instead (Note [Adam8bit with AVX2]); these loops serve f16, bf16, f64 and
// builds without AVX2.

// out[i] = value[codes[i]] x scale, i < len.
template <typename C>
void dequantize_block(const float* value, const uint8_t* codes, C scale, C* out, int64_t len) {
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) out[i] = C(value[codes[i]]) * scale;
}

// One block of len elements, four passes (Note [four passes over a block]): p, g [len] (T); c1, c2 [len]
// the moments' codes and *absmax1, *absmax2 their scales, in and out; m, v [len] scratch.
template <typename T, typename C>
void adam8bit_block_portable(T* p, const T* g, uint8_t* c1, float* absmax1, uint8_t* c2, float* absmax2,
                             const math::Adam8bitHyper<C>& h, C* m, C* v, int64_t len) {
  const FastCode& f1 = fast_signed();
  const FastCode& f2 = fast_unsigned();
  dequantize_block(f1.code->value, c1, C(*absmax1), m, len);
  dequantize_block(f2.code->value, c2, C(*absmax2), v, len);
  update_block(p, g, m, v, h, len);
  *absmax1 = float(finite_max(m, len));
  *absmax2 = float(finite_max(v, len));
  quantize_block<true>(f1, m, inverse_scale<C>(*absmax1), c1, len);
  quantize_block<false>(f2, v, inverse_scale<C>(*absmax2), c2, len);
}

}  // namespace

const FastCode& fast_signed() {
  static const FastCode f = make_fast(dynamic_code::signed_code());
  return f;
}
const FastCode& fast_unsigned() {
  static const FastCode f = make_fast(dynamic_code::unsigned_code());
  return f;
}

#if FRUGAL_ADAM8BIT_AVX2  // the dynamic code's AVX2 block; an AVX-512 build takes its own (below)
// Note [Adam8bit with AVX2]: the f32 kernel's block in two passes written with intrinsics. gcc 12
// vectorises the four plain loops (Note [four passes over a block]), but its quantising loop looks each code
// up with gathers (vpgatherdd: about 12 cycles for 8 lanes on the Zen 3 this was measured on) and the
// whole was 5.5x slower than Adam's kernel. What needs the intrinsics: the table lookups as scalar loads
// put together with inserts (lookup8), one per code (the bucket entry packs the step and the threshold),
// and the packing of 32 codes into bytes. Pass 1 dequantises, updates and keeps the largest |moments| in
// registers (the new moments to two f32 buffers on the stack, in L1); pass 2 quantises from them. Measured
// and dropped, both slower on one thread: pass 2 of one block in the same loop as pass 1 of the next (to
// overlap the divider's work with the lookups'; 2.8 against 2.6 ns an element), and quantising both moments
// in one loop (3.7 against 2.6). The arithmetic is math::adam8bit_step's, operation for operation (its
// fmas explicit, IEEE sqrt and division), and the codes quantize_fast's, so the vector lanes, the scalar
// tails and the GPU round alike.
namespace avx2 {
namespace {

// table[index[j]], j < 8: eight scalar loads put together with inserts. Not _mm256_i32gather_ps: on the Zen 3
// this was measured on, 8 lookups take 0.35 ns an element this way, 0.6 by a gather.
inline __m256 lookup8(const float* table, const uint8_t* index) {
  __m128 lo = _mm_load_ss(table + index[0]), hi = _mm_load_ss(table + index[4]);
  lo = _mm_insert_ps(lo, _mm_load_ss(table + index[1]), 0x10);
  hi = _mm_insert_ps(hi, _mm_load_ss(table + index[5]), 0x10);
  lo = _mm_insert_ps(lo, _mm_load_ss(table + index[2]), 0x20);
  hi = _mm_insert_ps(hi, _mm_load_ss(table + index[6]), 0x20);
  lo = _mm_insert_ps(lo, _mm_load_ss(table + index[3]), 0x30);
  hi = _mm_insert_ps(hi, _mm_load_ss(table + index[7]), 0x30);
  return _mm256_set_m128(hi, lo);
}
// The same for indices in int32 lanes, taken out two at a time (one vpextrd each costs as much as a vpextrq).
inline __m256 lookup8(const float* table, __m256i index) {
  const __m128i l = _mm256_castsi256_si128(index), h = _mm256_extracti128_si256(index, 1);
  const uint64_t i01 = uint64_t(_mm_cvtsi128_si64(l)), i23 = uint64_t(_mm_extract_epi64(l, 1));
  const uint64_t i45 = uint64_t(_mm_cvtsi128_si64(h)), i67 = uint64_t(_mm_extract_epi64(h, 1));
  __m128 lo = _mm_load_ss(table + uint32_t(i01)), hi = _mm_load_ss(table + uint32_t(i45));
  lo = _mm_insert_ps(lo, _mm_load_ss(table + (i01 >> 32)), 0x10);
  hi = _mm_insert_ps(hi, _mm_load_ss(table + (i45 >> 32)), 0x10);
  lo = _mm_insert_ps(lo, _mm_load_ss(table + uint32_t(i23)), 0x20);
  hi = _mm_insert_ps(hi, _mm_load_ss(table + uint32_t(i67)), 0x20);
  lo = _mm_insert_ps(lo, _mm_load_ss(table + (i23 >> 32)), 0x30);
  hi = _mm_insert_ps(hi, _mm_load_ss(table + (i67 >> 32)), 0x30);
  return _mm256_set_m128(hi, lo);
}

// value[codes[j]] x scale, j < 8.
inline __m256 dequantize8(const float* value, const uint8_t* codes, __m256 scale) {
  return _mm256_mul_ps(lookup8(value, codes), scale);
}

// quantize_fast<kSigned>(f, q[j]), j < 8, as int32 lanes; entry: f.entry, zero: f.code->zero in every lane.
template <bool kSigned>
inline __m256i quantize8(const float* entry, __m256i zero, __m256 q) {
  const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), q);
  const __m256i bits = _mm256_castps_si256(a);
  __m256i b = _mm256_sub_epi32(_mm256_srli_epi32(bits, kLowBits), _mm256_set1_epi32(kFirstBucketBits));
  b = _mm256_min_epi32(_mm256_max_epi32(b, _mm256_setzero_si256()), _mm256_set1_epi32(kBuckets - 1));
  const __m256i negative = _mm256_castps_si256(_mm256_cmp_ps(q, _mm256_setzero_ps(), _CMP_LT_OQ));
  if constexpr (kSigned) b = _mm256_add_epi32(b, _mm256_and_si256(negative, _mm256_set1_epi32(kBuckets)));
  const __m256i e = _mm256_castps_si256(lookup8(entry, b));
  const __m256i low = _mm256_set1_epi32(kLowMask);
  const __m256i above = _mm256_cmpgt_epi32(_mm256_and_si256(bits, low), _mm256_and_si256(e, low));  // -1
  __m256i k = _mm256_sub_epi32(_mm256_srli_epi32(e, kLowBits), above);
  __m256i to_zero = _mm256_castps_si256(_mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  if constexpr (!kSigned) to_zero = _mm256_or_si256(to_zero, negative);
  k = _mm256_andnot_si256(to_zero, k);
  if constexpr (kSigned) k = _mm256_sub_epi32(_mm256_xor_si256(k, negative), negative);  // -k if q < 0
  return _mm256_add_epi32(k, zero);
}

// codes[i] = the code of x[i] x inv_scale, i < len: 32 at a time, the rest one by one.
template <bool kSigned>
void quantize_block(const FastCode& f, const float* x, float inv_scale, uint8_t* codes, int64_t len) {
  const __m256 inv = _mm256_set1_ps(inv_scale);
  const float* entry = reinterpret_cast<const float*>(f.entry);  // loaded as floats, used as their bits
  const __m256i zero = _mm256_set1_epi32(f.code->zero);
  int64_t i = 0;
  for (; i + 32 <= len; i += 32) {
    __m256i k[4];
    for (int j = 0; j < 4; ++j)
      k[j] = quantize8<kSigned>(entry, zero, _mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * j), inv));
    pack32(k, codes + i);
  }
  for (; i < len; ++i) codes[i] = quantize_fast<kSigned>(f, x[i] * inv_scale);
}

// adam8bit_block_portable for f32, in two passes (Note [Adam8bit with AVX2]). h's flags are kCoupled and
// kDecoupled (the scalar tail reads them).
template <bool kCoupled, bool kDecoupled>
void adam8bit_block(float* p, const float* g, uint8_t* c1, float* absmax1, uint8_t* c2, float* absmax2,
                    const math::Adam8bitHyper<float>& h, float* m, float* v, int64_t len) {
  const FastCode& f1 = fast_signed();
  const FastCode& f2 = fast_unsigned();
  const float* value1 = f1.code->value;
  const float* value2 = f2.code->value;
  const __m256 scale1 = _mm256_set1_ps(*absmax1), scale2 = _mm256_set1_ps(*absmax2);
  const Hyper8 h8(h);
  __m256 max1 = _mm256_setzero_ps(), max2 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const Step8 e =
        step8<kCoupled, kDecoupled>(h8, _mm256_loadu_ps(p + i), _mm256_loadu_ps(g + i),
                                    dequantize8(value1, c1 + i, scale1), dequantize8(value2, c2 + i, scale2));
    _mm256_storeu_ps(p + i, e.p);
    _mm256_storeu_ps(m + i, e.m);
    _mm256_storeu_ps(v + i, e.v);
    max1 = _mm256_max_ps(max1, finite_abs(e.m));
    max2 = _mm256_max_ps(max2, finite_abs(e.v));
  }
  float r1 = max_of(max1), r2 = max_of(max2);
  for (; i < len; ++i) {
    const math::Adam8bitElement<float> e =
        math::adam8bit_step(p[i], g[i], value1[c1[i]] * *absmax1, value2[c2[i]] * *absmax2, h);
    p[i] = e.p;
    m[i] = e.m;
    v[i] = e.v;
    r1 = std::max(r1, math::finite_abs(e.m));
    r2 = std::max(r2, math::finite_abs(e.v));
  }
  *absmax1 = r1;
  *absmax2 = r2;
  quantize_block<true>(f1, m, inverse_scale<float>(r1), c1, len);
  quantize_block<false>(f2, v, inverse_scale<float>(r2), c2, len);
}

}  // namespace
}  // namespace avx2
#endif

namespace {

// param, grad [n] (T); codes [n] (u8), absmax [ceil(n / block_size)] (f32), per moment. The weight decay's
// kind is a template argument (as adam_loop's in kernels/cpu/optim.cpp), so the update is branch-free.
template <typename T, bool kCoupled, bool kDecoupled>
void adam8bit_loop(const Adam8bitStepArgs& a) {
  using C = acc_t<T>;
  T* param = static_cast<T*>(a.param);
  const T* grad = static_cast<const T*>(a.grad);
  const math::Adam8bitHyper<C> h = math::adam8bit_hyper<C>(a);
  const int64_t bs = a.block_size, blocks = (a.n + bs - 1) / bs;
  // An element costs two (float8) to four (dynamic) times f32 Adam's (kernels/cpu/optim.cpp), so a quarter
  // of its grain pays at least the same fork: W3's 128 x 128 projections (8 blocks) then run on two threads.
  parallel_for(0, blocks, items_per_grain(4 * bs), [&](int64_t block_begin, int64_t block_end) {
    math::Adam8bitHyper<C> hyper = h;  // set here, so that the flags are constants in this loop
    hyper.coupled = kCoupled;
    hyper.decoupled = kDecoupled;
    const bool float8 = a.float8;
#if FRUGAL_FLOAT8_AVX2 || FRUGAL_FLOAT8_AVX512
    const bool subnormals = !(_mm_getcsr() & 0x40);  // MXCSR's DAZ (Note [float8 moments with AVX2])
#endif
#if FRUGAL_ADAM8BIT_AVX512
    if constexpr (std::is_same_v<T, float>) {
      if (!float8) {
        alignas(64) float m[2 * kAdam8bitMaxBlock], v[2 * kAdam8bitMaxBlock];  // two blocks' new moments
        avx512::adam8bit_blocks<kCoupled, kDecoupled>(a, hyper, block_begin, block_end, m, v);
        return;
      }
    }
#endif
    alignas(64) C m[kAdam8bitMaxBlock], v[kAdam8bitMaxBlock];  // the block's new moments (v: float8's roots)
    for (int64_t b = block_begin; b < block_end; ++b) {
      const int64_t begin = b * bs, len = std::min(bs, a.n - begin);
      T* p = param + begin;
      const T* g = grad + begin;
      uint8_t* c1 = a.exp_avg_codes + begin;
      uint8_t* c2 = a.exp_avg_sq_codes + begin;
      float* absmax1 = a.exp_avg_absmax + b;
      float* absmax2 = a.exp_avg_sq_absmax + b;
#if FRUGAL_FLOAT8_AVX2 || FRUGAL_FLOAT8_AVX512
      if constexpr (std::is_same_v<T, float>) {
        if (float8) {
#if FRUGAL_FLOAT8_AVX512
          namespace isa = float8_avx512;
#else
          namespace isa = avx2;
#endif
          if (subnormals)
            isa::float8_block<kCoupled, kDecoupled, true>(p, g, c1, absmax1, c2, absmax2, hyper, m, v, len);
          else
            isa::float8_block<kCoupled, kDecoupled, false>(p, g, c1, absmax1, c2, absmax2, hyper, m, v, len);
          continue;
        }
      }
#endif
#if FRUGAL_ADAM8BIT_AVX2
      if constexpr (std::is_same_v<T, float>) {
        if (!float8) {
          avx2::adam8bit_block<kCoupled, kDecoupled>(p, g, c1, absmax1, c2, absmax2, hyper, m, v, len);
          continue;
        }
      }
#endif
      if (float8)
        float8_block_portable(p, g, c1, absmax1, c2, absmax2, hyper, m, v, len);
      else
        adam8bit_block_portable(p, g, c1, absmax1, c2, absmax2, hyper, m, v, len);
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

const bool kRegistered = [] {
  cpu::for_types<float, double, Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_adam8bit_step.set(DeviceType::CPU, dtype_v<T>, adam8bit_step_cpu<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal::optim8bit

namespace frugal {

using namespace optim8bit;

uint8_t dynamic_code_quantize_cpu(bool is_signed, float q) {
  return is_signed ? quantize_fast<true>(fast_signed(), q) : quantize_fast<false>(fast_unsigned(), q);
}
void dynamic_code_quantize_block_cpu(bool is_signed, const float* q, uint8_t* codes, int64_t n) {
#if FRUGAL_ADAM8BIT_AVX512
  using avx512::quantize_block;
#elif FRUGAL_ADAM8BIT_AVX2
  using avx2::quantize_block;
#endif
  if (is_signed)
    quantize_block<true>(fast_signed(), q, 1.0f, codes, n);
  else
    quantize_block<false>(fast_unsigned(), q, 1.0f, codes, n);
}

}  // namespace frugal
