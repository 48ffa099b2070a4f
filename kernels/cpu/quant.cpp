// int8 GEMM for nn::quant (core/quant_kernels.h): oneDNN's matmul primitive for the s32 products (u8 x s8 ->
// s32), then one pass of our own for the zero point, the per-column scales, the bias and a ReLU; the naive
// reference loops beside it as fallback and test oracle.
#include <algorithm>
#include <bit>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/quant_kernels.h"
#include "kernels/cpu/im2col.h"
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
      float v = float(acc[i * n + j]) * scale[j];
      if (bias) v += bias[j];
      out[i * n + j] = relu ? std::max(v, 0.0f) : v;
    }
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
  plan->matmul.execute(onednn_stream(), args);
  onednn_stream().wait();
  return true;
}

// zp_sums[j] = x_zero_point * sum_p w[j, p]: sum_p (x - zp) w = sum_p x w - zp_sums[j], exactly in s32.
std::vector<int32_t> zero_point_sums(const int8_t* w, int32_t x_zero_point, int64_t k, int64_t n) {
  std::vector<int32_t> sums(size_t(n), 0);
  if (x_zero_point == 0) return sums;
  parallel_for(0, n, std::max<int64_t>(1, kGrain / k), [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      int32_t s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t p = 0; p < k; ++p) s += int32_t(w[j * k + p]);
      sums[size_t(j)] = s * x_zero_point;
    }
  });
  return sums;
}

}  // namespace
#endif

bool int8_linear_uses_onednn(int64_t m, int64_t k, int64_t n) {
#ifdef FRUGAL_HAVE_ONEDNN
  return m > 0 && k > 0 && n > 0 && int8_plan(m, k, n, false) != nullptr;
#else
  (void)m, (void)k, (void)n;
  return false;
#endif
}

namespace {

// int8_linear and int8_linear_xt: x (m, k), or its transpose (k, m) when x_transposed. `sums`, when given, is
// zero_point_sums(w, x_zero_point, k, n), computed once by a caller that multiplies by w several times.
void linear(const uint8_t* x, bool x_transposed, int32_t x_zero_point, const int8_t* w, const float* scale,
            const float* bias, float* out, int64_t m, int64_t k, int64_t n, bool relu,
            const std::vector<int32_t>* sums = nullptr) {
#ifdef FRUGAL_HAVE_ONEDNN
  // The s32 products land in out's own bytes and become floats in place, one pass with the zero point's
  // term, the scale, the bias and the ReLU: the same integer and float operations as the reference.
  static_assert(sizeof(int32_t) == sizeof(float));
  if (m > 0 && k > 0 && n > 0 && run_onednn(x, w, reinterpret_cast<int32_t*>(out), m, k, n, x_transposed)) {
    const std::vector<int32_t> own = sums ? std::vector<int32_t>() : zero_point_sums(w, x_zero_point, k, n);
    const std::vector<int32_t>& zp_sums = sums ? *sums : own;
    parallel_for(0, m, std::max<int64_t>(1, kGrain / n), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        float* row = out + i * n;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
          float v = float(std::bit_cast<int32_t>(row[j]) - zp_sums[size_t(j)]) * scale[j];
          if (bias) v += bias[j];
          row[j] = relu && v < 0.0f ? 0.0f : v;
        }
      }
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

void int8_linear_xt(const uint8_t* xt, int32_t x_zero_point, const int8_t* w, const float* scale,
                    const float* bias, float* out, int64_t m, int64_t k, int64_t n, bool relu) {
  linear(xt, true, x_zero_point, w, scale, bias, out, m, k, n, relu);
}

void int8_conv2d(const ConvArgs& a, int32_t x_zero_point, const float* scale, bool relu) {
  const int64_t P = a.oh * a.ow, K = a.c * a.kh * a.kw, O = a.o;
  // Images go through in chunks of about 4096 output pixels, so that the patches (u8, K a pixel) and the
  // GEMM's pixel-major output stay small beside x and y.
  const int64_t chunk = std::clamp<int64_t>(4096 / P, 1, std::max<int64_t>(a.n, 1));
  Tensor col = workspace(K * chunk * P), out = workspace(chunk * P * O * int64_t(sizeof(float)));
  const auto* xs = static_cast<const uint8_t*>(a.x);
  const auto* w = static_cast<const int8_t*>(a.weight);
  auto* cs = col.data<uint8_t>();
  auto* os = reinterpret_cast<float*>(out.data<uint8_t>());
  auto* ys = static_cast<float*>(a.y);
  const std::vector<int32_t> sums =
#ifdef FRUGAL_HAVE_ONEDNN
      zero_point_sums(w, x_zero_point, K, O);
#else
      {};
#endif
  for (int64_t n0 = 0; n0 < a.n; n0 += chunk) {
    const int64_t images = std::min(chunk, a.n - n0), pixels = images * P;
    // The chunk's patches side by side in each row (c, i, j) of im2col, the padding at the zero point's code
    // (the value 0.0); the GEMM takes them as x^T.
    parallel_for(0, images, 1, [&](int64_t b, int64_t e) {
      for (int64_t img = b; img < e; ++img)
        im2col(a, xs + (n0 + img) * a.c * a.h * a.w, cs + img * P, pixels, uint8_t(x_zero_point));
    });
    linear(cs, true, x_zero_point, w, scale, static_cast<const float*>(a.bias), os, pixels, K, O, relu,
           &sums);
    // Pixel-major (image, pixel, o) to NCHW, in tiles of 32 pixels so that both sides stay in cache.
    constexpr int64_t kTile = 32;
    const int64_t tiles = (P + kTile - 1) / kTile;
    parallel_for(0, images * tiles, std::max<int64_t>(1, kGrain / (kTile * O)), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t img = t / tiles, p0 = t % tiles * kTile, p1 = std::min(P, p0 + kTile);
        const float* src = os + img * P * O;
        float* dst = ys + (n0 + img) * O * P;
        for (int64_t oc = 0; oc < O; ++oc)
          for (int64_t p = p0; p < p1; ++p) dst[oc * P + p] = src[p * O + oc];
      }
    });
  }
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

}  // namespace frugal::cpu
