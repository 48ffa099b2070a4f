// The dynamic code's f32 block of the CPU Adam8bit kernel with AVX-512 and VBMI (Note [Adam8bit with
// AVX-512]): the moments looked up and quantised 64 at a time by byte permutes, run by
// kernels/cpu/optim8bit.cpp's loop over the blocks where the build targets AVX-512 with VBMI (else that
// file's AVX2 block); and the block quantiser dynamic_code_quantize_block_cpu exports for the tests.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/op_table_optim.h"
#include "kernels/cpu/optim8bit.h"
#include "kernels/dynamic_code.h"

namespace frugal::optim8bit {

#if FRUGAL_ADAM8BIT_AVX512
// Note [Adam8bit with AVX-512]: where the CPU has AVX-512 with VBMI (Zen 4 and later, Ice Lake and later),
// the f32 kernel looks nothing up one element at a time. A gather or eight scalar loads per 8 lanes (Note
// [Adam8bit with AVX2]) cost about 0.4 ns an element on Zen 4, and the kernel needs four lookups an element:
// as much as f32 Adam's whole update. Instead:
// - A 256-entry f32 table is kept as four planes of 256 bytes (byte p of every entry), and 64 entries are
//   looked up at once with two vpermi2b per plane (128 bytes each) and a blend on the index's top bit; the
//   four planes are then interleaved into four vectors of floats by unpacks (lookup64). The unpacks work
//   inside 128-bit lanes, so the 64 indices are taken in "lane order": position 16L + 4j + t holds element
//   16j + 4L + t (kLaneOrder). That is the order two rounds of packus leave four vectors of int32 in, so
//   indices computed in vectors need no shuffle before a lookup; codes read from memory take one vpermb.
// - Dequantising is that lookup in the code's values, times the block's scale.
// - Quantising is computed, with one lookup to decide the last comparison. Between the thresholds where one
//   decade's entries meet the next's ("region boundaries"), the thresholds lie where
//   u = (a x 10^(6 - i) - 0.1) x items / 0.9 is a whole number (the midpoints of evenly spaced entries). So:
//   the region of a = |q| is its octave's (the float's exponent: at most one boundary lies in an octave, and
//   one comparison with it decides); within the region, u computed by one fma is within 1e-5 of exact, so
//   every threshold but the nearest, round(u), is decided by u alone, and the nearest by comparing a with it
//   (looked up in a table of the thresholds, as above). The code is then exactly quantize_fast's (and the
//   naive scan's): the same thresholds, the same comparisons (tested at and beside every threshold and on a
//   sample of every octave; all 2^32 floats were compared once, with no difference).
// - Pass 2 of a block (quantising) runs interleaved with pass 1 of the next, 64 elements of each at a time
//   (adam8bit_blocks): on one thread 6% faster than one after the other.
// Measured on Zen 4 (bench_optim8bit, W3's parameters), against f32 Adam's kernel: 2 threads, 4.8-5.5x with
// the AVX2 kernel, 3.1-3.7x with this one; 1 thread, 3.6-3.9x. Where the time goes, 1 thread, ns an element:
// f32 Adam 0.47, of which its square root and two divisions (which this kernel does too) 0.41; one lookup64
// 0.145 (two an element); quantising 0.50 (two an element: the lookup 0.12, the octave and its boundary
// 0.14). Both moments' codes need about 1.3 ns an element beside the divisions, so Adam's 1.3x is out of
// reach of this design here; it would need a code that is quantised by arithmetic alone.
namespace avx512 {
namespace {

using dynamic_code::Code;

// kLaneOrder[16L + 4j + t] = 16j + 4L + t: element order to lane order and back (it is its own inverse).
inline __m512i lane_order() {
  alignas(64) static const std::array<uint8_t, 64> order = [] {
    std::array<uint8_t, 64> o{};
    for (int l = 0; l < 4; ++l)
      for (int j = 0; j < 4; ++j)
        for (int t = 0; t < 4; ++t) o[size_t(16 * l + 4 * j + t)] = uint8_t(16 * j + 4 * l + t);
    return o;
  }();
  return _mm512_load_si512(order.data());
}

// A code's tables for the lookups and the computed quantiser (Note [Adam8bit with AVX-512]).
struct Tables {
  alignas(64) uint8_t value[4][256];       // byte p of value[k], in plane p
  alignas(64) uint8_t threshold[4][256];   // byte p of side 0's threshold[k]; +inf from k = count[0] - 1 on
  alignas(64) float octave_threshold[32];  // the region boundary inside octave e, or +inf
  alignas(64) int32_t octave_region[32];   // the region of the octave's smallest value
  // Per region (0: at most the first threshold; 1 + i: decade i; 8: beyond the last entry below 1): the
  // step of its first entry, the last whole-number step within it, and u = a x mul + add.
  alignas(64) int32_t first_last[16];  // first | last << 16
  alignas(64) float mul[16];
  alignas(64) float add[16];
  int32_t zero, side1_last;
};

// Octave e holds the floats with biased exponent e + kOctaveBase (e = 0: everything below, e = 31: everything
// from 2^7 up, inf and NaN too).
constexpr int kOctaveBase = 127 - 24;

Tables make_tables(const Code& c, bool is_signed) {
  Tables t{};
  const float inf = std::numeric_limits<float>::infinity();
  auto put = [](uint8_t planes[4][256], int k, float x) {
    const uint32_t bits = std::bit_cast<uint32_t>(x);
    for (int p = 0; p < 4; ++p) planes[p][k] = uint8_t(bits >> (8 * p));
  };
  for (int k = 0; k < 256; ++k) {
    put(t.value, k, c.value[k]);
    put(t.threshold, k, k < c.count[0] - 1 ? c.threshold[0][k] : inf);
  }
  // Regions: the first step of decade i, and the boundaries (the thresholds just below each region).
  int32_t first[dynamic_code::kDecades + 2];
  first[0] = 0;
  for (int i = 0, k = 1; i <= dynamic_code::kDecades;
       k += i < dynamic_code::kDecades ? dynamic_code::decade_items(is_signed, i) : 0, ++i)
    first[i + 1] = k;
  FRUGAL_ASSERT(first[dynamic_code::kDecades + 1] == c.count[0] - 1,
                "adam8bit: the dynamic code's decades do not add up to its entries");
  constexpr int kRegions = dynamic_code::kDecades + 2;
  float boundary[kRegions - 1];  // boundary[r]: the largest value of region r
  for (int r = 0; r + 1 < kRegions; ++r) boundary[r] = c.threshold[0][first[r + 1] - 1];
  for (int r = 0; r < kRegions; ++r) {
    t.first_last[r] = first[r];
    if (r == 0 || r == kRegions - 1) continue;  // one step each: mul = add = 0, last = 0
    const int i = r - 1, items = dynamic_code::decade_items(is_signed, i);
    t.first_last[r] |= (items - 1) << 16;
    t.mul[r] = float(double(items) / (0.9 * std::pow(10.0, i - 6)));
    t.add[r] = float(-double(items) / 9);
  }
  for (int e = 0; e < 32; ++e) {
    const float bottom = e == 0 ? 0.0f : std::bit_cast<float>(uint32_t(e + kOctaveBase) << 23);
    const float top = e == 31 ? inf : std::bit_cast<float>(uint32_t(e + kOctaveBase + 1) << 23);
    int below = 0, inside = 0;
    t.octave_threshold[e] = inf;
    for (float b : boundary) {
      below += int(bottom > b);
      if (bottom <= b && b < top) ++inside, t.octave_threshold[e] = b;
    }
    FRUGAL_ASSERT(inside <= 1, "adam8bit: two region boundaries of the dynamic code in one octave");
    t.octave_region[e] = below;
  }
  t.zero = c.zero;
  t.side1_last = c.count[1] - 1;
  return t;
}

const Tables& tables(bool is_signed) {
  static const Tables s = make_tables(dynamic_code::signed_code(), true);
  static const Tables u = make_tables(dynamic_code::unsigned_code(), false);
  return is_signed ? s : u;
}

// planes[idx[i]] for 64 indices in lane order, as four vectors of floats in element order (i: 16j..16j+15 in
// out[j]).
inline void lookup64(const uint8_t (*planes)[256], __m512i idx, __m512 out[4]) {
  const __mmask64 high = _mm512_movepi8_mask(idx);
  __m512i b[4];
  for (int p = 0; p < 4; ++p) {
    const uint8_t* plane = planes[p];
    const __m512i lo = _mm512_permutex2var_epi8(_mm512_load_si512(plane), idx, _mm512_load_si512(plane + 64));
    const __m512i hi =
        _mm512_permutex2var_epi8(_mm512_load_si512(plane + 128), idx, _mm512_load_si512(plane + 192));
    b[p] = _mm512_mask_blend_epi8(high, lo, hi);
  }
  const __m512i w01lo = _mm512_unpacklo_epi8(b[0], b[1]), w01hi = _mm512_unpackhi_epi8(b[0], b[1]);
  const __m512i w23lo = _mm512_unpacklo_epi8(b[2], b[3]), w23hi = _mm512_unpackhi_epi8(b[2], b[3]);
  out[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(w01lo, w23lo));
  out[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(w01lo, w23lo));
  out[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(w01hi, w23hi));
  out[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(w01hi, w23hi));
}

// Four vectors of int32 in [0, 255] as 64 bytes in lane order.
inline __m512i pack64(const __m512i d[4]) {
  return _mm512_packus_epi16(_mm512_packus_epi32(d[0], d[1]), _mm512_packus_epi32(d[2], d[3]));
}

// value[codes[i]] x scale, i < 64.
inline void dequantize64(const Tables& t, const uint8_t* codes, __m512i order, __m512 scale, __m512 out[4]) {
  lookup64(t.value, _mm512_permutexvar_epi8(order, _mm512_loadu_si512(codes)), out);
  for (int j = 0; j < 4; ++j) out[j] = _mm512_mul_ps(out[j], scale);
}

// codes[i] = quantize_fast<kSigned>(code, x[i] x inv_scale), i < 64 (Note [Adam8bit with AVX-512]). The
// steps are computed in int32 lanes; the last comparison, the sign and NaN are applied to the 64 codes as
// bytes.
template <bool kSigned>
inline void quantize64(const Tables& t, const float* x, __m512 inv_scale, __m512i order, uint8_t* codes) {
  const __m512i one = _mm512_set1_epi32(1);
  __m512 a[4];
  __m512i step[4];
  __mmask16 negative[4], nan[4];
  for (int j = 0; j < 4; ++j) {
    const __m512 q = _mm512_mul_ps(_mm512_loadu_ps(x + 16 * j), inv_scale);
    a[j] = _mm512_abs_ps(q);
    const __m512i e =
        _mm512_min_epi32(_mm512_max_epi32(_mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(a[j]), 23),
                                                           _mm512_set1_epi32(kOctaveBase)),
                                          _mm512_setzero_si512()),
                         _mm512_set1_epi32(31));
    __m512i region = _mm512_permutex2var_epi32(_mm512_load_si512(t.octave_region), e,
                                               _mm512_load_si512(t.octave_region + 16));
    const __m512 boundary = _mm512_permutex2var_ps(_mm512_load_ps(t.octave_threshold), e,
                                                   _mm512_load_ps(t.octave_threshold + 16));
    region = _mm512_mask_add_epi32(region, _mm512_cmp_ps_mask(a[j], boundary, _CMP_GT_OQ), region, one);
    const __m512 u = _mm512_fmadd_ps(a[j], _mm512_permutexvar_ps(region, _mm512_load_ps(t.mul)),
                                     _mm512_permutexvar_ps(region, _mm512_load_ps(t.add)));
    // The nearest whole-number step, less one: the threshold to compare with. NaN u (a = inf) gives INT_MIN,
    // which wraps to INT_MAX and is clamped to the region's last step.
    const __m512i first_last = _mm512_permutexvar_epi32(region, _mm512_load_si512(t.first_last));
    __m512i nearest = _mm512_max_epi32(_mm512_sub_epi32(_mm512_cvtps_epi32(u), one), _mm512_setzero_si512());
    nearest = _mm512_min_epi32(nearest, _mm512_srli_epi32(first_last, 16));
    step[j] = _mm512_add_epi32(nearest, _mm512_and_si512(first_last, _mm512_set1_epi32(0xffff)));
    negative[j] = _mm512_cmp_ps_mask(q, _mm512_setzero_ps(), _CMP_LT_OQ);
    nan[j] = _mm512_cmp_ps_mask(a[j], a[j], _CMP_UNORD_Q);
  }
  const __m512i steps = pack64(step);  // lane order
  __m512 threshold[4];
  lookup64(t.threshold, steps, threshold);
  __mmask16 above[4];
  for (int j = 0; j < 4; ++j) above[j] = _mm512_cmp_ps_mask(a[j], threshold[j], _CMP_GT_OQ);
  auto join = [](const __mmask16 m[4]) {  // element order
    return _kor_mask64(_kor_mask64(__mmask64(m[0]), __mmask64(m[1]) << 16),
                       _kor_mask64(__mmask64(m[2]) << 32, __mmask64(m[3]) << 48));
  };
  const __mmask64 to_zero = kSigned ? join(nan) : _kor_mask64(join(nan), join(negative));
  __m512i k = _mm512_permutexvar_epi8(order, steps);  // element order
  k = _mm512_mask_add_epi8(k, join(above), k, _mm512_set1_epi8(1));
  k = _mm512_maskz_mov_epi8(_knot_mask64(to_zero), k);
  const __m512i zero = _mm512_set1_epi8(char(t.zero));
  if constexpr (kSigned) {
    const __mmask64 neg = join(negative);
    k = _mm512_mask_min_epu8(k, neg, k, _mm512_set1_epi8(char(t.side1_last)));
    k = _mm512_mask_sub_epi8(_mm512_add_epi8(zero, k), neg, zero, k);
  } else {
    k = _mm512_add_epi8(zero, k);
  }
  _mm512_storeu_si512(codes, k);
}

}  // namespace

template <bool kSigned>
void quantize_block(const FastCode& f, const float* x, float inv_scale, uint8_t* codes, int64_t len) {
  const Tables& t = tables(kSigned);
  const __m512 inv = _mm512_set1_ps(inv_scale);
  const __m512i order = lane_order();
  int64_t i = 0;
  for (; i + 64 <= len; i += 64) quantize64<kSigned>(t, x + i, inv, order, codes + i);
  for (; i < len; ++i) codes[i] = quantize_fast<kSigned>(f, x[i] * inv_scale);
}

template void quantize_block<true>(const FastCode&, const float*, float, uint8_t*, int64_t);
template void quantize_block<false>(const FastCode&, const float*, float, uint8_t*, int64_t);

namespace {

// |x| when finite, else 0 (math::finite_abs).
inline __m512 finite_abs(__m512 x) {
  const __m512 a = _mm512_abs_ps(x);
  return _mm512_maskz_mov_ps(
      _mm512_cmp_ps_mask(a, _mm512_set1_ps(std::numeric_limits<float>::max()), _CMP_LE_OQ), a);
}

// A block whose new moments (in the stack buffers m, v) wait to be quantised into c1, c2, 64 at a time: done
// of len so far.
struct Pending {
  const float *m = nullptr, *v = nullptr;
  uint8_t *c1 = nullptr, *c2 = nullptr;
  float inv1 = 0, inv2 = 0;
  int64_t len = 0, done = 0;
};

inline void quantize_next64(const Tables& t1, const Tables& t2, __m512i order, Pending& q) {
  quantize64<true>(t1, q.m + q.done, _mm512_set1_ps(q.inv1), order, q.c1 + q.done);
  quantize64<false>(t2, q.v + q.done, _mm512_set1_ps(q.inv2), order, q.c2 + q.done);
  q.done += 64;
}

inline void quantize_rest(const Tables& t1, const Tables& t2, __m512i order, Pending& q) {
  while (q.done + 64 <= q.len) quantize_next64(t1, t2, order, q);
  for (; q.done < q.len; ++q.done) {
    q.c1[q.done] = quantize_fast<true>(fast_signed(), q.m[q.done] * q.inv1);
    q.c2[q.done] = quantize_fast<false>(fast_unsigned(), q.v[q.done] * q.inv2);
  }
}

}  // namespace

// The blocks [block_begin, block_end) of one parameter, each as adam8bit_block_portable for f32: pass 1 (the
// moments dequantised, the update, the new moments to a stack buffer and their largest magnitudes) 64
// elements at a time, and pass 2 (the new moments quantised) of the block before it interleaved with it, 64
// elements of each per iteration, so that pass 2's shuffles run while pass 1 waits for its divisions (the
// blocks alternate between two pairs of buffers). m, v: 2 x kAdam8bitMaxBlock each.
template <bool kCoupled, bool kDecoupled>
void adam8bit_blocks(const Adam8bitStepArgs& args, const math::Adam8bitHyper<float>& h, int64_t block_begin,
                     int64_t block_end, float* m_buffers, float* v_buffers) {
  const Tables& t1 = tables(true);
  const Tables& t2 = tables(false);
  const float* value1 = fast_signed().code->value;
  const float* value2 = fast_unsigned().code->value;
  const __m512i order = lane_order();
  const __m512 beta1 = _mm512_set1_ps(h.beta1), beta2 = _mm512_set1_ps(h.beta2),
               one_minus_beta1 = _mm512_set1_ps(h.one_minus_beta1),
               one_minus_beta2 = _mm512_set1_ps(h.one_minus_beta2), eps = _mm512_set1_ps(h.eps),
               weight_decay = _mm512_set1_ps(h.weight_decay), shrink = _mm512_set1_ps(h.shrink),
               minus_step_size = _mm512_set1_ps(-h.step_size);
  float* const param = static_cast<float*>(args.param);
  const float* const grad = static_cast<const float*>(args.grad);
  Pending pending;
  for (int64_t b = block_begin; b < block_end; ++b) {
    const int64_t begin = b * args.block_size, len = std::min(args.block_size, args.n - begin);
    float* p = param + begin;
    const float* g = grad + begin;
    uint8_t* c1 = args.exp_avg_codes + begin;
    uint8_t* c2 = args.exp_avg_sq_codes + begin;
    float* m = m_buffers + (b % 2) * kAdam8bitMaxBlock;
    float* v = v_buffers + (b % 2) * kAdam8bitMaxBlock;
    const float absmax1 = args.exp_avg_absmax[b], absmax2 = args.exp_avg_sq_absmax[b];
    const __m512 scale1 = _mm512_set1_ps(absmax1), scale2 = _mm512_set1_ps(absmax2);
    __m512 max1 = _mm512_setzero_ps(), max2 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= len; i += 64) {
      __m512 m_old[4], v_old[4];
      dequantize64(t1, c1 + i, order, scale1, m_old);
      dequantize64(t2, c2 + i, order, scale2, v_old);
      for (int j = 0; j < 4; ++j) {
        const int64_t k = i + 16 * j;
        __m512 pi = _mm512_loadu_ps(p + k), gi = _mm512_loadu_ps(g + k);
        if constexpr (kCoupled) gi = _mm512_fmadd_ps(weight_decay, pi, gi);
        if constexpr (kDecoupled) pi = _mm512_mul_ps(pi, shrink);
        const __m512 mi = _mm512_fmadd_ps(beta1, m_old[j], _mm512_mul_ps(one_minus_beta1, gi));
        const __m512 vi =
            _mm512_fmadd_ps(beta2, v_old[j], _mm512_mul_ps(one_minus_beta2, _mm512_mul_ps(gi, gi)));
        const __m512 denom = _mm512_add_ps(_mm512_sqrt_ps(vi), eps);
        _mm512_storeu_ps(p + k, _mm512_fmadd_ps(minus_step_size, _mm512_div_ps(mi, denom), pi));
        _mm512_store_ps(m + k, mi);
        _mm512_store_ps(v + k, vi);
        max1 = _mm512_max_ps(max1, finite_abs(mi));
        max2 = _mm512_max_ps(max2, finite_abs(vi));
      }
      if (pending.done + 64 <= pending.len) quantize_next64(t1, t2, order, pending);
    }
    float r1 = _mm512_reduce_max_ps(max1), r2 = _mm512_reduce_max_ps(max2);
    for (; i < len; ++i) {
      const math::Adam8bitElement<float> e =
          math::adam8bit_step(p[i], g[i], value1[c1[i]] * absmax1, value2[c2[i]] * absmax2, h);
      p[i] = e.p;
      m[i] = e.m;
      v[i] = e.v;
      r1 = std::max(r1, math::finite_abs(e.m));
      r2 = std::max(r2, math::finite_abs(e.v));
    }
    args.exp_avg_absmax[b] = r1;
    args.exp_avg_sq_absmax[b] = r2;
    quantize_rest(t1, t2, order, pending);
    pending = {m, v, c1, c2, inverse_scale<float>(r1), inverse_scale<float>(r2), len, 0};
  }
  quantize_rest(t1, t2, order, pending);
}

template void adam8bit_blocks<false, false>(const Adam8bitStepArgs&, const math::Adam8bitHyper<float>&,
                                            int64_t, int64_t, float*, float*);
template void adam8bit_blocks<true, false>(const Adam8bitStepArgs&, const math::Adam8bitHyper<float>&,
                                           int64_t, int64_t, float*, float*);
template void adam8bit_blocks<false, true>(const Adam8bitStepArgs&, const math::Adam8bitHyper<float>&,
                                           int64_t, int64_t, float*, float*);

}  // namespace avx512
#endif

}  // namespace frugal::optim8bit
