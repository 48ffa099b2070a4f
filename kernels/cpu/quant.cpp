// int8 GEMM for nn::quant (core/quant_kernels.h): oneDNN's matmul primitive (u8 x s8 -> s32, the source zero
// point and the per-column output scales applied by oneDNN, v2.x attribute API), with the naive reference
// loops beside it as fallback and test oracle.
#include <vector>

#include "core/error.h"
#include "core/quant_kernels.h"

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
                           const float* bias, float* out, int64_t m, int64_t k, int64_t n) {
  std::vector<int32_t> acc(size_t(m * n));
  int8_linear_s32_reference(x, x_zero_point, w, acc.data(), m, k, n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      out[i * n + j] = float(acc[i * n + j]) * scale[j] + (bias ? bias[j] : 0.0f);
}

#ifdef FRUGAL_HAVE_ONEDNN
namespace {

struct Int8Plan {
  dnnl::matmul matmul;
  dnnl::memory::desc x, w, out, scratchpad;
};

// Keyed on (m, k, n, f32 output?). The zero point and the scales are runtime arguments, so one primitive
// serves every batch of a shape.
std::shared_ptr<const Int8Plan> int8_plan(int64_t m, int64_t k, int64_t n, bool f32_out) {
  static PlanCache<4, Int8Plan> cache(256);
  return cache.get({m, k, n, f32_out ? 1 : 0}, [&] {
    using dt = dnnl::memory::data_type;
    auto plan = std::make_shared<Int8Plan>();
    plan->x = dnnl::memory::desc({m, k}, dt::u8, dnnl::memory::dims{k, 1});
    plan->w = dnnl::memory::desc({k, n}, dt::s8, dnnl::memory::dims{1, k});  // w (n, k) read as its transpose
    plan->out = dnnl::memory::desc({m, n}, f32_out ? dt::f32 : dt::s32, dnnl::memory::dims{n, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
    if (f32_out) attr.set_output_scales(1 << 1, {DNNL_RUNTIME_F32_VAL});  // one scale per column
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(plan->x, plan->w, plan->out), attr, onednn_engine());
    plan->scratchpad = pd.scratchpad_desc();
    plan->matmul = dnnl::matmul(pd);
    return std::shared_ptr<const Int8Plan>(plan);
  });
}

bool run_onednn(const uint8_t* x, int32_t x_zero_point, const int8_t* w, const float* scale, void* out,
                int64_t m, int64_t k, int64_t n, bool f32_out) {
  auto plan = int8_plan(m, k, n, f32_out);
  if (!plan) return false;
  dnnl::engine& eng = onednn_engine();
  int32_t zp = x_zero_point;
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory(plan->x, eng, const_cast<uint8_t*>(x))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(plan->w, eng, const_cast<int8_t*>(w))},
      {DNNL_ARG_DST, dnnl::memory(plan->out, eng, out)},
      {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC,
       dnnl::memory({{1}, dnnl::memory::data_type::s32, {1}}, eng, &zp)}};
  if (f32_out)
    args.emplace(DNNL_ARG_ATTR_OUTPUT_SCALES,
                 dnnl::memory({{n}, dnnl::memory::data_type::f32, {1}}, eng, const_cast<float*>(scale)));
  Tensor scratch = add_scratchpad(plan->scratchpad, args);
  plan->matmul.execute(onednn_stream(), args);
  onednn_stream().wait();
  return true;
}

}  // namespace
#endif

bool int8_linear_uses_onednn(int64_t m, int64_t k, int64_t n) {
#ifdef FRUGAL_HAVE_ONEDNN
  return m > 0 && k > 0 && n > 0 && int8_plan(m, k, n, true) != nullptr;
#else
  (void)m, (void)k, (void)n;
  return false;
#endif
}

void int8_linear(const uint8_t* x, int32_t x_zero_point, const int8_t* w, const float* scale,
                 const float* bias, float* out, int64_t m, int64_t k, int64_t n) {
#ifdef FRUGAL_HAVE_ONEDNN
  if (m > 0 && k > 0 && n > 0 && run_onednn(x, x_zero_point, w, scale, out, m, k, n, true)) {
    if (bias)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) out[i * n + j] += bias[j];
    return;
  }
#endif
  int8_linear_reference(x, x_zero_point, w, scale, bias, out, m, k, n);
}

void int8_linear_s32(const uint8_t* x, int32_t x_zero_point, const int8_t* w, int32_t* acc, int64_t m,
                     int64_t k, int64_t n) {
#ifdef FRUGAL_HAVE_ONEDNN
  if (m > 0 && k > 0 && n > 0 && run_onednn(x, x_zero_point, w, nullptr, acc, m, k, n, false)) return;
#endif
  int8_linear_s32_reference(x, x_zero_point, w, acc, m, k, n);
}

}  // namespace frugal::cpu
