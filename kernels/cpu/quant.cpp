// int8 GEMM for nn::quant (core/quant_kernels.h): oneDNN's matmul primitive for the s32 products (u8 x s8 ->
// s32), then one pass of our own for the zero point, the per-column scales, the bias and a ReLU; the naive
// reference loops beside it as fallback and test oracle.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <string_view>
#include <type_traits>
#include <vector>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "core/error.h"
#include "core/op_table_copy.h"
#include "core/parallel.h"
#include "core/quant_kernels.h"
#include "kernels/cpu/im2col.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/transpose_block.h"
#include "kernels/cpu/workspace.h"

#ifdef FRUGAL_HAVE_ONEDNN
#include "kernels/cpu/onednn.h"
#endif

namespace frugal::cpu {

void int8_linear_s32_reference(const uint8_t* x, int32_t x_zero_point, const int8_t* w, int32_t* acc,
                               int64_t m, int64_t k, int64_t n) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      int32_t s = 0;
      for (int64_t p = 0; p < k; ++p) s += (int32_t(x[i * k + p]) - x_zero_point) * int32_t(w[j * k + p]);
      acc[i * n + j] = s;
    }
}

void int8_linear_reference(const uint8_t* x, int32_t x_zero_point, const int8_t* w, const float* scale,
                           const float* bias, float* out, int64_t m, int64_t k, int64_t n, bool relu) {
  std::vector<int32_t> acc(size_t(m * n));
  int8_linear_s32_reference(x, x_zero_point, w, acc.data(), m, k, n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const float v = int8_output_value(acc[i * n + j], scale[j], bias, j);
      out[i * n + j] = relu ? std::max(v, 0.0f) : v;
    }
}

namespace {

// A range of quantize_u8, as a function of values and restrict pointers: in a lambda over captured
// references, every u8 store may alias the captures (a char type aliases anything), so GCC reloads them and
// runs the loop scalar (65536 inputs, W1's second layer: 199 us, against 32 us vectorised).
void quantize_range(const float* __restrict x, int64_t n, float inv, int32_t zp, int32_t qmax,
                    uint8_t* __restrict out) {
  const float lo = float(-zp), hi = float(qmax - zp);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = quantize_one(x[i], inv, lo, hi, zp);
}

}  // namespace

void quantize_u8(const float* x, int64_t n, float inv_scale, int32_t zero_point, int32_t qmax, uint8_t* out) {
  parallel_for(0, n, parallel_grain(), [&](int64_t b, int64_t e) {
    quantize_range(x + b, e - b, inv_scale, zero_point, qmax, out + b);
  });
}

namespace {

// A chunk of value_range, as a function of values and a restrict pointer for the same reason as
// quantize_range.
void range_chunk(const float* __restrict x, int64_t n, float& lo, float& hi) {
  float l = 0, h = 0;
#pragma omp simd reduction(min : l) reduction(max : h)
  for (int64_t i = 0; i < n; ++i) {
    l = x[i] < l ? x[i] : l;
    h = x[i] > h ? x[i] : h;
  }
  lo = l, hi = h;
}

}  // namespace

void value_range(const float* x, int64_t n, float& lo, float& hi) {
  lo = 0, hi = 0;
  parallel_for(0, n, parallel_grain(), [&](int64_t b, int64_t e) {
    float l, h;
    range_chunk(x + b, e - b, l, h);
#pragma omp critical(frugal_quant_range)
    lo = std::min(lo, l), hi = std::max(hi, h);
  });
}

#ifdef FRUGAL_HAVE_ONEDNN
namespace {

struct Int8Plan {
  dnnl::matmul matmul;
  dnnl::memory::desc x, w, out, scratchpad;
};

// Keyed on (m, k, n, x transposed). No zero point and no scales inside oneDNN: with a source zero point its
// gemm recomputes the weights' compensation on every call (W1's 256 x 256 x 10 layer: 216 us against 55
// without), so the primitive gives the plain s32 products and linear() below applies the zero point's term
// and the scales.
std::shared_ptr<const Int8Plan> int8_plan(int64_t m, int64_t k, int64_t n, bool x_transposed) {
  static PlanCache<4, Int8Plan> cache(256);
  return cache.get({m, k, n, x_transposed ? 1 : 0}, [&] {
    const detail::OneThreadProduct threads(m * k * n, detail::kPassiveInt8Product);
    using dt = dnnl::memory::data_type;
    auto plan = std::make_shared<Int8Plan>();
    plan->x = dnnl::memory::desc({m, k}, dt::u8,
                                 x_transposed ? dnnl::memory::dims{1, m} : dnnl::memory::dims{k, 1});
    plan->w = dnnl::memory::desc({k, n}, dt::s8, dnnl::memory::dims{1, k});  // w (n, k) read as its transpose
    plan->out = dnnl::memory::desc({m, n}, dt::s32, dnnl::memory::dims{n, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(plan->x, plan->w, plan->out), attr, onednn_engine());
    plan->scratchpad = pd.scratchpad_desc();
    plan->matmul = dnnl::matmul(pd);
    return std::shared_ptr<const Int8Plan>(plan);
  });
}

// acc = x w^T without the zero point, in s32.
bool run_onednn(const uint8_t* x, const int8_t* w, int32_t* acc, int64_t m, int64_t k, int64_t n,
                bool x_transposed = false) {
  auto plan = int8_plan(m, k, n, x_transposed);
  if (!plan) return false;
  dnnl::engine& eng = onednn_engine();
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory(plan->x, eng, const_cast<uint8_t*>(x))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(plan->w, eng, const_cast<int8_t*>(w))},
      {DNNL_ARG_DST, dnnl::memory(plan->out, eng, acc)}};
  Tensor scratch = add_scratchpad(plan->scratchpad, args);
  const detail::OneThreadProduct threads(m * k * n, detail::kPassiveInt8Product);
  plan->matmul.execute(onednn_stream(), args);
  onednn_stream().wait();
  return true;
}

// zp_sums[j] = x_zero_point * sum_p w[j, p]: sum_p (x - zp) w = sum_p x w - zp_sums[j], exactly in s32.
std::vector<int32_t> zero_point_sums(const int8_t* w, int32_t x_zero_point, int64_t k, int64_t n) {
  std::vector<int32_t> sums(size_t(n), 0);
  if (x_zero_point == 0) return sums;
  parallel_for(0, n, items_per_grain(k), [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      const int8_t* row = w + j * k;
      int64_t p = 0;
      int32_t s = 0;
#ifdef __AVX2__
      // 32 weights a step: their bytes with the sign bit flipped are w + 128 as u8, which VPSADBW sums in
      // groups of 8 (a sum of absolute differences from zero); 128 a weight is taken off at the end. It
      // ran in 6% of W1's int8 forward at a batch of 256 one widened weight at a time.
      __m256i acc = _mm256_setzero_si256();
      const __m256i flip = _mm256_set1_epi8(char(0x80));
      for (; p + 32 <= k; p += 32) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + p));
        acc = _mm256_add_epi64(acc, _mm256_sad_epu8(_mm256_xor_si256(v, flip), _mm256_setzero_si256()));
      }
      const __m128i half = _mm_add_epi64(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
      s = int32_t(_mm_cvtsi128_si64(half) + _mm_extract_epi64(half, 1) - 128 * p);
#endif
      for (; p < k; ++p) s += int32_t(row[p]);
      sums[size_t(j)] = s * x_zero_point;
    }
  });
  return sums;
}

// oneDNN's int8 convolution over channels-last u8 codes, the zero point given to oneDNN (which treats the
// padding as the zero point's code) and s32 out, for a chunk of `images`. Only where it has a real kernel:
// on an AVX-512 Xeon with VNNI and AMX, W2's second convolution (x [256, 32, 14, 14], 3 x 3, 64 out) took
// 0.33-0.35x oneDNN's f32 brgconv, where the im2col GEMM below took 1.5x frugal's f32 convolution; a
// reference kernel (`ref_int8`, which NCHW gets) would be far slower than that GEMM.
struct Int8ConvPlan {
  dnnl::convolution_forward conv;
  dnnl::reorder weight_reorder;  // [o, c, kh, kw] s8 into the primitive's layout
  dnnl::memory::desc x, w_user, w, y, scratchpad;
};

std::atomic<bool> g_int8_conv_onednn{true};

// The multiply-adds of `images` of a's convolution: under passive waiting, below kPassiveInt8Product its
// primitive is made and run on one thread (Note [a product on one thread under passive waiting]).
int64_t int8_conv_macs(const ConvArgs& a, int64_t images) {
  return images * a.o * a.oh * a.ow * a.c * a.kh * a.kw;
}

std::shared_ptr<const Int8ConvPlan> int8_conv_plan(const ConvArgs& a, int64_t images) {
  static PlanCache<13, Int8ConvPlan> cache(64);
  return cache.get(
      {images, a.c, a.h, a.w, a.o, a.kh, a.kw, a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.dil_h, a.dil_w},
      [&]() -> std::shared_ptr<const Int8ConvPlan> {
        const detail::OneThreadProduct threads(int8_conv_macs(a, images), detail::kPassiveInt8Product);
        using dt = dnnl::memory::data_type;
        using tag = dnnl::memory::format_tag;
        auto plan = std::make_shared<Int8ConvPlan>();
        plan->x = dnnl::memory::desc({images, a.c, a.h, a.w}, dt::u8, tag::nhwc);
        plan->y = dnnl::memory::desc({images, a.o, a.oh, a.ow}, dt::s32, tag::nhwc);
        plan->w_user = dnnl::memory::desc({a.o, a.c, a.kh, a.kw}, dt::s8, tag::oihw);
        const dnnl::memory::desc w_any({a.o, a.c, a.kh, a.kw}, dt::s8, tag::any);
        const int64_t pad_b = (a.oh - 1) * a.stride_h + (a.kh - 1) * a.dil_h + 1 - a.h - a.pad_h;
        const int64_t pad_r = (a.ow - 1) * a.stride_w + (a.kw - 1) * a.dil_w + 1 - a.w - a.pad_w;
        dnnl::primitive_attr attr;
        attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
        const dnnl::convolution_forward::desc desc(
            dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, plan->x, w_any, plan->y,
            {a.stride_h, a.stride_w}, {a.dil_h - 1, a.dil_w - 1}, {a.pad_h, a.pad_w}, {pad_b, pad_r});
        const dnnl::convolution_forward::primitive_desc pd(desc, attr, onednn_engine());
        if (std::string_view(pd.impl_info_str()).starts_with("ref")) return nullptr;
        plan->w = pd.weights_desc();
        plan->scratchpad = pd.scratchpad_desc();
        plan->conv = dnnl::convolution_forward(pd);
        plan->weight_reorder = dnnl::reorder(
            dnnl::reorder::primitive_desc(onednn_engine(), plan->w_user, onednn_engine(), plan->w));
        return plan;
      });
}

}  // namespace
#endif

bool int8_linear_uses_onednn(int64_t m, int64_t k, int64_t n) {
#ifdef FRUGAL_HAVE_ONEDNN
  return m > 0 && k > 0 && n > 0 && !int8_few_rows(m, k, n) && int8_plan(m, k, n, false) != nullptr;
#else
  (void)m, (void)k, (void)n;
  return false;
#endif
}

namespace {

// A row of linear()'s s32 sums, in place, to its output values (Note [an int8 output value]).
template <bool kBias>
void output_row(float* __restrict row, const int32_t* __restrict zp_sums, const float* __restrict scale,
                const float* __restrict bias, int64_t n, bool relu) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float v =
        int8_output_value(std::bit_cast<int32_t>(row[j]) - zp_sums[j], scale[j], kBias ? bias : nullptr, j);
    row[j] = relu && v < 0.0f ? 0.0f : v;
  }
}

// int8_linear and int8_linear_xt: x (m, k), or its transpose (k, m) when x_transposed. `sums`, when given, is
// zero_point_sums(w, x_zero_point, k, n), computed once by a caller that multiplies by w several times.
void linear(const uint8_t* x, bool x_transposed, int32_t x_zero_point, const int8_t* w, const float* scale,
            const float* bias, float* out, int64_t m, int64_t k, int64_t n, bool relu,
            const std::vector<int32_t>* sums = nullptr) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  if (!x_transposed && int8_few_rows(m, k, n))
    return int8_few_rows_linear(x, x_zero_point, w, scale, bias, out, m, k, n, relu);
#endif
#ifdef FRUGAL_HAVE_ONEDNN
  // The s32 products land in out's own bytes and become floats in place, one pass with the zero point's
  // term, the scale, the bias and the ReLU: the same integer and float operations as the reference.
  static_assert(sizeof(int32_t) == sizeof(float));
  if (m > 0 && k > 0 && n > 0 && run_onednn(x, w, reinterpret_cast<int32_t*>(out), m, k, n, x_transposed)) {
    const std::vector<int32_t> own = sums ? std::vector<int32_t>() : zero_point_sums(w, x_zero_point, k, n);
    const std::vector<int32_t>& zp_sums = sums ? *sums : own;
    parallel_for(0, m, items_per_grain(n), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        if (bias)  // two loops, so that no branch on the bias stands inside the vectorised one
          output_row<true>(out + i * n, zp_sums.data(), scale, bias, n, relu);
        else
          output_row<false>(out + i * n, zp_sums.data(), scale, bias, n, relu);
    });
    return;
  }
#else
  (void)sums;
#endif
  if (!x_transposed) return int8_linear_reference(x, x_zero_point, w, scale, bias, out, m, k, n, relu);
  std::vector<uint8_t> rows(size_t(m * k));
  for (int64_t p = 0; p < k; ++p)
    for (int64_t i = 0; i < m; ++i) rows[size_t(i * k + p)] = x[p * m + i];
  int8_linear_reference(rows.data(), x_zero_point, w, scale, bias, out, m, k, n, relu);
}

}  // namespace

void int8_linear(const uint8_t* x, int32_t x_zero_point, const int8_t* w, const float* scale,
                 const float* bias, float* out, int64_t m, int64_t k, int64_t n, bool relu) {
  linear(x, false, x_zero_point, w, scale, bias, out, m, k, n, relu);
}

namespace {

// linear's working memory on the meta device: run_onednn's one arena block (its scratchpad), taken and given
// back; the zero point's sums and the reference path use the heap.
void linear_meta([[maybe_unused]] int64_t m, [[maybe_unused]] int64_t k, [[maybe_unused]] int64_t n,
                 [[maybe_unused]] bool x_transposed) {
#ifdef FRUGAL_HAVE_ONEDNN
  if (m <= 0 || k <= 0 || n <= 0 || (!x_transposed && int8_few_rows(m, k, n))) return;
  const auto plan = int8_plan(m, k, n, x_transposed);
  if (plan && plan->scratchpad.get_size() > 0) meta_workspace(int64_t(plan->scratchpad.get_size()));
#endif
}

}  // namespace

void int8_linear_meta(int64_t m, int64_t k, int64_t n) { linear_meta(m, k, n, false); }

void int8_linear_xt(const uint8_t* xt, int32_t x_zero_point, const int8_t* w, const float* scale,
                    const float* bias, float* out, int64_t m, int64_t k, int64_t n, bool relu) {
  linear(xt, true, x_zero_point, w, scale, bias, out, m, k, n, relu);
}

namespace {

// One output value from its s32 sum (Note [an int8 output value]), then the ReLU: the vector blocks and
// the scalar edges of to_nchw (and pool2_to_nchw) round alike whatever the compiler contracts.
template <bool kBias, bool kRelu>
inline float output_value(int32_t s, float scale, const float* bias, int64_t oc) {
  const float v = int8_output_value(s, scale, kBias ? bias : nullptr, oc);
  return kRelu && v < 0.0f ? 0.0f : v;
}
inline float output_value(int32_t s, float scale, const float* bias, int64_t oc, bool relu) {
  if (bias)
    return relu ? output_value<true, true>(s, scale, bias, oc)
                : output_value<true, false>(s, scale, bias, oc);
  return relu ? output_value<false, true>(s, scale, bias, oc)
              : output_value<false, false>(s, scale, bias, oc);
}

// Pixel-major s32 or f32 (image, pixel, o) to NCHW f32, in tiles of 32 pixels so that both sides stay in
// cache; for s32, output_value on the way. Blocks of 8 pixels x 8 channels are transposed in registers
// (kernels/cpu/transpose_block.h) where the build has AVX2 and FMA; the edges go element by element.
template <typename S>
void to_nchw(const S* src_all, float* y, int64_t images, int64_t P, int64_t O, const float* scale,
             const float* bias, bool relu) {
  static_assert(sizeof(S) == sizeof(float));
  constexpr int64_t kTile = 32;
  const int64_t tiles = (P + kTile - 1) / kTile;
  parallel_for(0, images * tiles, items_per_grain(kTile * O), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t img = t / tiles, p0 = t % tiles * kTile, p1 = std::min(P, p0 + kTile);
      const S* src = src_all + img * P * O;
      float* dst = y + img * O * P;
      int64_t pb = p0, ob = 0;  // the blocks cover pixels [p0, pb) and channels [0, ob)
#if FRUGAL_TRANSPOSE_AVX && defined(__AVX2__) && defined(__FMA__)
      pb = p0 + (p1 - p0) / 8 * 8, ob = O / 8 * 8;
      const __m256 zero = _mm256_setzero_ps();
      for (int64_t oc = 0; oc < ob; oc += 8)
        for (int64_t p = p0; p < pb; p += 8) {
          __m256 r[8];  // r[j]: channel oc + j at pixels p..p+7
          transpose8x8_load(reinterpret_cast<const float*>(src + p * O + oc), O, r);
          for (int j = 0; j < 8; ++j) {
            __m256 v = r[j];
            if constexpr (!std::is_same_v<S, float>) {
              const __m256 x = _mm256_cvtepi32_ps(_mm256_castps_si256(v)), sc = _mm256_set1_ps(scale[oc + j]);
              v = bias ? _mm256_fmadd_ps(x, sc, _mm256_set1_ps(bias[oc + j])) : _mm256_mul_ps(x, sc);
              if (relu) v = _mm256_max_ps(zero, v);  // as v < 0 ? 0 : v, -0 and NaN kept
            }
            _mm256_storeu_ps(dst + (oc + j) * P + p, v);
          }
        }
#endif
      for (int64_t oc = 0; oc < O; ++oc)
        for (int64_t p = oc < ob ? pb : p0; p < p1; ++p) {
          if constexpr (std::is_same_v<S, float>)
            dst[oc * P + p] = src[p * O + oc];
          else
            dst[oc * P + p] = output_value(src[p * O + oc], scale[oc], bias, oc, relu);
        }
    }
  });
}

// Pixel-major s32 or f32 (image, pixel, o) outputs of [OH, OW] to NCHW f32 max-pooled over 2 x 2 windows at
// stride 2 (PH = OH / 2, PW = OW / 2, as MaxPool2d(2) floors): each window's four values made (output_value
// for s32; f32 values are final) and the largest kept, into a pixel-major buffer, then to_nchw. Only the
// pooled quarter is written out, and no ReLU or pooling pass reads the full output again.
template <typename S>
void pool2_to_nchw(const S* src_all, float* y, int64_t images, int64_t OH, int64_t OW, int64_t O,
                   const float* scale, const float* bias, bool relu, const Int8ConvCodes* codes,
                   int64_t first) {
  const int64_t PH = OH / 2, PW = OW / 2, PP = PH * PW;
  Tensor buffer = workspace(images * PP * O * int64_t(sizeof(float)));
  float* pooled = reinterpret_cast<float*>(buffer.data<uint8_t>());
  // The bias and the ReLU as template arguments: a branch on either inside the channel loop kept it scalar.
  auto pool = [&]<bool kBias, bool kRelu>() {
    parallel_for(0, images * PH, items_per_grain(4 * PW * O), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t img = t / PH, ph = t % PH;
        for (int64_t pw = 0; pw < PW; ++pw) {
          const S* p00 = src_all + ((img * OH + 2 * ph) * OW + 2 * pw) * O;
          const S* p01 = p00 + O;
          const S* p10 = p00 + OW * O;
          const S* p11 = p10 + O;
          float* out = pooled + ((img * PH + ph) * PW + pw) * O;
          int64_t oc = 0;
#if defined(__AVX2__) && defined(__FMA__)
          // 8 channels at a time: output_value's operations, and std::max(a, b) as
          // _mm256_max_ps(b, a) (both give a unless a < b).
          auto load = [&](const S* p) {
            if constexpr (std::is_same_v<S, float>) {
              return _mm256_loadu_ps(p + oc);
            } else {
              const __m256 x =
                  _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + oc)));
              const __m256 sc = _mm256_loadu_ps(scale + oc);
              __m256 v;
              if constexpr (kBias)
                v = _mm256_fmadd_ps(x, sc, _mm256_loadu_ps(bias + oc));
              else
                v = _mm256_mul_ps(x, sc);
              if constexpr (kRelu) v = _mm256_max_ps(_mm256_setzero_ps(), v);  // v < 0 ? 0 : v
              return v;
            }
          };
          for (; oc + 8 <= O; oc += 8)
            _mm256_storeu_ps(out + oc, _mm256_max_ps(_mm256_max_ps(load(p11), load(p10)),
                                                     _mm256_max_ps(load(p01), load(p00))));
#endif
          for (; oc < O; ++oc) {
            auto value = [&](const S* p) {
              if constexpr (std::is_same_v<S, float>)
                return p[oc];
              else
                return output_value<kBias, kRelu>(p[oc], scale[oc], bias, oc);
            };
            out[oc] = std::max(std::max(value(p00), value(p01)), std::max(value(p10), value(p11)));
          }
        }
      }
    });
  };
  if (bias)
    relu ? pool.template operator()<true, true>() : pool.template operator()<true, false>();
  else
    relu ? pool.template operator()<false, true>() : pool.template operator()<false, false>();
  if (!codes) {
    to_nchw(pooled, y, images, PP, O, nullptr, nullptr, false);
    return;
  }
  // The next layer's codes instead of y: the pixel-major values quantised, then each image's [PP, O] codes
  // transposed to its NCHW order, [O, PP] (a byte transpose rather than to_nchw's f32 one).
  Tensor pixel_major = workspace(images * PP * O);
  uint8_t* q = pixel_major.data<uint8_t>();
  quantize_u8(pooled, images * PP * O, codes->inv_scale, codes->zero_point, codes->qmax, q);
  parallel_for(0, images, 1, [&](int64_t b, int64_t e) {
    for (int64_t img = b; img < e; ++img) {
      transpose_codes(q + img * PP * O, codes->y + (first + img) * O * PP, PP, O);
    }
  });
}

// pool2_to_nchw's working memory on the meta device, in its order: the pooled values, and with codes their
// pixel-major codes, both given back when it returns.
void pool2_to_nchw_meta(int64_t images, int64_t PP, int64_t O, bool codes) {
  const Tensor buffer = meta_workspace(images * PP * O * int64_t(sizeof(float)));
  const Tensor pixel_major = codes ? meta_workspace(images * PP * O) : Tensor();
}

#ifdef FRUGAL_HAVE_ONEDNN
// int8_conv2d through oneDNN's int8 convolution; false where it has no kernel for the shape. kDry: its meta
// twin, which takes the same blocks in the same order and computes nothing (no pointer of `a` is read).
template <bool kDry>
bool conv2d_onednn(const ConvArgs& a, const Int8ConvInput& in, const float* scale, bool relu, bool pool2,
                   const Int8ConvCodes* out_codes, int64_t chunk) {
  if (a.groups != 1 || !g_int8_conv_onednn.load(std::memory_order_relaxed) || !int8_conv_plan(a, chunk))
    return false;
  auto ws = [](int64_t bytes) { return kDry ? meta_workspace(bytes) : workspace(bytes); };
  const int64_t C = a.c, HW = a.h * a.w, P = a.oh * a.ow, O = a.o, YP = (a.oh / 2) * (a.ow / 2);
  auto* ys = static_cast<float*>(a.y);
  dnnl::engine& eng = onednn_engine();
  std::shared_ptr<const Int8ConvPlan> plan;
  // Codes given channels last are the primitive's input as they are; values are quantised a chunk at a time.
  Tensor weights, codes = in.nhwc_codes ? Tensor() : ws(chunk * C * HW),
                  nhwc = in.nhwc_codes ? Tensor() : ws(chunk * C * HW),
                  out = ws(chunk * P * O * int64_t(sizeof(int32_t)));
  Tensor zp = ws(int64_t(sizeof(int32_t)));
  if constexpr (!kDry) *static_cast<int32_t*>(zp.raw_data()) = in.zero_point;
  for (int64_t n0 = 0; n0 < a.n; n0 += chunk) {
    const int64_t images = std::min(chunk, a.n - n0);
    const auto chunk_plan = int8_conv_plan(a, images);
    if (!chunk_plan) return false;  // the caller then computes the whole of y the other way
    if (!weights.defined() || chunk_plan->w != plan->w) {
      weights = ws(int64_t(chunk_plan->w.get_size()));
      if constexpr (!kDry) {
        dnnl::memory user(chunk_plan->w_user, eng, const_cast<void*>(a.weight));
        dnnl::memory packed(chunk_plan->w, eng, weights.raw_data());
        const detail::OneThreadProduct threads(int8_conv_macs(a, images), detail::kPassiveInt8Product);
        chunk_plan->weight_reorder.execute(onednn_stream(), user, packed);
      }
    }
    plan = chunk_plan;
    if constexpr (kDry) {  // the scratchpad, held while the chunk is pooled
      const size_t scratch = plan->scratchpad.get_size();
      const Tensor scratchpad = scratch > 0 ? meta_workspace(int64_t(scratch)) : Tensor();
      if (pool2) pool2_to_nchw_meta(images, YP, O, out_codes != nullptr);
      continue;
    }
    // NCHW values to NHWC codes, the images split across threads: each image quantised (NCHW) and then
    // transposed while its codes are in cache. (Quantising in registers after an f32 8 x 8 transpose, with no
    // NCHW codes at all, was slower: the f32 transpose's shuffles cost more than the byte transpose's.)
    void* xt = in.nhwc_codes ? const_cast<uint8_t*>(static_cast<const uint8_t*>(a.x) + n0 * C * HW)
                             : nhwc.raw_data();
    if (!in.nhwc_codes) {
      const auto* xs = static_cast<const float*>(a.x);
      uint8_t* xq = codes.data<uint8_t>();
      parallel_for(0, images, 1, [&](int64_t b, int64_t e) {
        for (int64_t img = b; img < e; ++img) {
          quantize_range(xs + (n0 + img) * C * HW, C * HW, in.inv_scale, in.zero_point, in.qmax,
                         xq + img * C * HW);
          transpose_codes(xq + img * C * HW, static_cast<uint8_t*>(xt) + img * C * HW, C, HW);
        }
      });
    }
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, dnnl::memory(plan->x, eng, xt)},
        {DNNL_ARG_WEIGHTS, dnnl::memory(plan->w, eng, weights.raw_data())},
        {DNNL_ARG_DST, dnnl::memory(plan->y, eng, out.raw_data())},
        {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC,
         dnnl::memory({{1}, dnnl::memory::data_type::s32, {1}}, eng, zp.raw_data())}};
    const Tensor scratch = add_scratchpad(plan->scratchpad, args);
    {
      const detail::OneThreadProduct threads(int8_conv_macs(a, images), detail::kPassiveInt8Product);
      plan->conv.execute(onednn_stream(), args);
      onednn_stream().wait();
    }
    const auto* sums = static_cast<const int32_t*>(out.raw_data());
    if (pool2)
      pool2_to_nchw(sums, out_codes ? nullptr : ys + n0 * O * YP, images, a.oh, a.ow, O, scale,
                    static_cast<const float*>(a.bias), relu, out_codes, n0);
    else
      to_nchw(sums, ys + n0 * O * P, images, P, O, scale, static_cast<const float*>(a.bias), relu);
  }
  return true;
}
#endif

}  // namespace

namespace {

// int8_conv2d; kDry: int8_conv2d_meta.
template <bool kDry>
void int8_conv2d_impl(const ConvArgs& a, const Int8ConvInput& in, const float* scale, bool relu, bool pool2,
                      const Int8ConvCodes* out_codes) {
  FRUGAL_ASSERT(!out_codes || pool2, "int8_conv2d: codes out are made from a pooled output only");
  const int64_t P = a.oh * a.ow, K = a.c * a.kh * a.kw, O = a.o;
  // Images go through in chunks of about 4096 output pixels, so that the patches (u8, K a pixel) and the
  // GEMM's pixel-major output stay small beside x and y.
  const int64_t chunk = std::clamp<int64_t>(4096 / P, 1, std::max<int64_t>(a.n, 1));
#ifdef FRUGAL_HAVE_ONEDNN
  if (a.n > 0 && P > 0 && O > 0 && conv2d_onednn<kDry>(a, in, scale, relu, pool2, out_codes, chunk)) return;
#endif
  const int64_t CHW = a.c * a.h * a.w;
  auto ws = [](int64_t bytes) { return kDry ? meta_workspace(bytes) : workspace(bytes); };
  Tensor codes = ws(chunk * CHW), col = ws(K * chunk * P), out = ws(chunk * P * O * int64_t(sizeof(float)));
  if constexpr (kDry) {  // the chunks' blocks, in the order the loop below takes them
    for (int64_t n0 = 0; n0 < a.n; n0 += chunk) {
      const int64_t images = std::min(chunk, a.n - n0);
      linear_meta(images * P, K, O, true);
      if (pool2) pool2_to_nchw_meta(images, (a.oh / 2) * (a.ow / 2), O, out_codes != nullptr);
    }
    return;
  }
  auto* xq = codes.data<uint8_t>();
  const auto* w = static_cast<const int8_t*>(a.weight);
  auto* cs = col.data<uint8_t>();
  auto* os = reinterpret_cast<float*>(out.data<uint8_t>());
  auto* ys = static_cast<float*>(a.y);
  const std::vector<int32_t> sums =
#ifdef FRUGAL_HAVE_ONEDNN
      zero_point_sums(w, in.zero_point, K, O);
#else
      {};
#endif
  for (int64_t n0 = 0; n0 < a.n; n0 += chunk) {
    const int64_t images = std::min(chunk, a.n - n0), pixels = images * P;
    // The chunk's codes, then its patches side by side in each row (c, i, j) of im2col, the padding at the
    // zero point's code (the value 0.0); the GEMM takes them as x^T.
    if (in.nhwc_codes) {  // each image's [HW, C] transposed to [C, HW]
      parallel_for(0, images, 1, [&](int64_t b, int64_t e) {
        for (int64_t img = b; img < e; ++img) {
          transpose_codes(static_cast<const uint8_t*>(a.x) + (n0 + img) * CHW, xq + img * CHW, a.h * a.w,
                          a.c);
        }
      });
    } else {
      quantize_u8(static_cast<const float*>(a.x) + n0 * CHW, images * CHW, in.inv_scale, in.zero_point,
                  in.qmax, xq);
    }
    parallel_for(0, images, 1, [&](int64_t b, int64_t e) {
      for (int64_t img = b; img < e; ++img)
        im2col(a, xq + img * CHW, cs + img * P, pixels, uint8_t(in.zero_point));
    });
    linear(cs, true, in.zero_point, w, scale, static_cast<const float*>(a.bias), os, pixels, K, O, relu,
           &sums);
    if (pool2)
      pool2_to_nchw(os, out_codes ? nullptr : ys + n0 * O * (a.oh / 2) * (a.ow / 2), images, a.oh, a.ow, O,
                    nullptr, nullptr, false, out_codes, n0);
    else
      to_nchw(os, ys + n0 * O * P, images, P, O, nullptr, nullptr, false);
  }
}

}  // namespace

void int8_conv2d(const ConvArgs& a, const Int8ConvInput& in, const float* scale, bool relu, bool pool2,
                 const Int8ConvCodes* out_codes) {
  int8_conv2d_impl<false>(a, in, scale, relu, pool2, out_codes);
}

void int8_conv2d_meta(const ConvArgs& a, const Int8ConvInput& in, bool pool2, bool codes_out) {
  const Int8ConvCodes out{};  // stands for the codes: the dry run writes none
  int8_conv2d_impl<true>(a, in, nullptr, false, pool2, codes_out ? &out : nullptr);
}

void set_int8_conv_onednn([[maybe_unused]] bool use) {
#ifdef FRUGAL_HAVE_ONEDNN
  g_int8_conv_onednn.store(use, std::memory_order_relaxed);
#endif
}

void int8_linear_s32(const uint8_t* x, int32_t x_zero_point, const int8_t* w, int32_t* acc, int64_t m,
                     int64_t k, int64_t n) {
#ifdef FRUGAL_HAVE_ONEDNN
  if (m > 0 && k > 0 && n > 0 && run_onednn(x, w, acc, m, k, n)) {
    const std::vector<int32_t> zp_sums = zero_point_sums(w, x_zero_point, k, n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) acc[i * n + j] -= zp_sums[size_t(j)];
    return;
  }
#endif
  int8_linear_s32_reference(x, x_zero_point, w, acc, m, k, n);
}

namespace {

// The op tables' CPU kernels (core/quant_kernels.h): the functions above, for QuantizedLinear's device path
// on the tests' stand-in GPU.
const bool kRegistered = [] {
  op_value_range.set(DeviceType::CPU, DType::F32,
                     [](const ValueRangeArgs& a) { value_range(a.x, a.n, a.lo_hi[0], a.lo_hi[1]); });
  op_quantize_u8.set(DeviceType::CPU, DType::F32, [](const QuantizeU8Args& a) {
    quantize_u8(a.x, a.n, a.inv_scale, a.zero_point, a.qmax, a.out);
  });
  op_int8_linear.set(DeviceType::CPU, DType::U8, [](const Int8LinearArgs& a) {
    int8_linear(a.x, a.x_zero_point, a.w, a.scale, a.bias, a.out, a.m, a.k, a.n, a.relu);
  });
  return true;
}();

}  // namespace

}  // namespace frugal::cpu
