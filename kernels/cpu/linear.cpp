// CPU kernels of the fused linear layer (core/ops.h: linear, linear_relu, linear_relu_backward).
// Forward, f32 and bf16 with oneDNN (f16 composes it in the op layer): oneDNN's matmul primitive reads the
// weight [n, k] as its transpose in place, adds the bias and (linear_relu) applies the ReLU as it stores each
// tile of y, so no pass transposes the weight, fills y with the bias first or applies the ReLU after. bf16
// multiplies with AVX-512 BF16 dot products accumulated in f32, the bias added in f32, y rounded once.
// Backward (every floating dtype): the ReLU mask and the bias gradient's column sums in one pass over d y.
// Their references are the unfused ops (tests/nn/test_linear_relu.cpp).
#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/op_table_linalg.h"
#include "core/parallel.h"
#include "kernels/cpu/cascade.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/register.h"

#ifdef FRUGAL_HAVE_ONEDNN
#include <unordered_map>

#include "kernels/cpu/onednn.h"
#include "kernels/cpu/workspace.h"
#endif

namespace frugal {
namespace {

#ifdef FRUGAL_HAVE_ONEDNN

struct LinearPlan {
  dnnl::matmul primitive;
  dnnl::memory::desc x, w, bias, y, scratchpad;
};

using LinearPlans = cpu::PlanCache<6, LinearPlan>;

template <typename T>
constexpr dnnl::memory::data_type onednn_type() {
  return std::is_same_v<T, float> ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16;
}

template <typename T>
std::shared_ptr<const LinearPlan> build_plan(const LinearArgs& a) {
  constexpr dnnl::memory::data_type dt = onednn_type<T>();
  auto plan = std::make_shared<LinearPlan>();
  plan->x = dnnl::memory::desc({a.m, a.k}, dt, {a.k, 1});
  plan->w = dnnl::memory::desc({a.k, a.n}, dt, {1, a.k});  // w [n, k] read as its transpose
  plan->y = dnnl::memory::desc({a.m, a.n}, dt, {a.n, 1});
  if (a.bias) plan->bias = dnnl::memory::desc({1, a.n}, dt, {a.n, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (a.relu) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::desc desc = a.bias ? dnnl::matmul::desc(plan->x, plan->w, plan->bias, plan->y)
                                         : dnnl::matmul::desc(plan->x, plan->w, plan->y);
  const dnnl::matmul::primitive_desc pd(desc, attr, cpu::onednn_engine());
  plan->primitive = dnnl::matmul(pd);
  plan->scratchpad = pd.scratchpad_desc();
  return plan;
}

// Where oneDNN declines the shape: the unfused steps (bias rows, a GEMM adding onto them, the ReLU). The GEMM
// they run, C = y (+)= x w^T:
GemmArgs unfused_gemm(const LinearArgs& a) {
  GemmArgs g;
  g.m = a.m;
  g.n = a.n;
  g.k = a.k;
  g.a = a.x;
  g.a_row = a.k;
  g.b = a.w;
  g.b_row = 1;
  g.b_col = a.k;
  g.c = a.y;
  g.c_row = a.n;
  g.beta = 1;
  return g;
}

template <typename T>
void linear_unfused(const LinearArgs& a) {
  T* y = static_cast<T*>(a.y);
  const T* bias = static_cast<const T*>(a.bias);
  for (int64_t i = 0; i < a.m; ++i)
    if (bias)
      std::copy(bias, bias + a.n, y + i * a.n);
    else
      std::fill(y + i * a.n, y + (i + 1) * a.n, T(0.0f));
  op_gemm.get(kCPU, dtype_v<T>)(unfused_gemm(a));
  if (a.relu)
    for (int64_t i = 0; i < a.m * a.n; ++i) y[i] = float(y[i]) > 0.0f ? y[i] : T(0.0f);
}

// One cache for the CPU kernels and their meta twins, so that a dry run sizes the scratchpad the run will
// take.
template <typename T>
std::shared_ptr<const LinearPlan> plan_for(const LinearArgs& a) {
  static LinearPlans plans(64);
  return plans.get({a.m, a.n, a.k, a.bias ? 1 : 0, a.relu ? 1 : 0, int64_t(dtype_v<T>)},
                   [&] { return build_plan<T>(a); });
}

template <typename T>
void linear_cpu(const LinearArgs& a) {
  const auto plan = plan_for<T>(a);
  if (!plan) return linear_unfused<T>(a);
  auto& eng = cpu::onednn_engine();
  auto& stream = cpu::onednn_stream();
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory(plan->x, eng, const_cast<void*>(a.x))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(plan->w, eng, const_cast<void*>(a.w))},
      {DNNL_ARG_DST, dnnl::memory(plan->y, eng, a.y)}};
  if (a.bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(plan->bias, eng, const_cast<void*>(a.bias)));
  const Tensor scratch = cpu::add_scratchpad(plan->scratchpad, args);
  plan->primitive.execute(stream, args);
  stream.wait();
}

// The meta kernel (core/op_table.h): the scratchpad oneDNN's matmul takes, which depends on the ISA it runs
// on: none on a Zen 3 (AVX2), 257 KiB for a layer of the estimate tests' MLP on an AVX-512 Xeon.
template <typename T>
void linear_meta(const LinearArgs& a) {
  const auto plan = plan_for<T>(a);
  if (!plan) return op_gemm.get(DeviceType::Meta, dtype_v<T>)(unfused_gemm(a));
  const size_t bytes = plan->scratchpad.get_size();
  const Tensor scratch = bytes ? cpu::meta_workspace(int64_t(bytes)) : Tensor();
}

#endif  // FRUGAL_HAVE_ONEDNN

// d bias is bit-identical to sum(relu_backward(g, y), {0}): the same pairwise column sums as that reduction
// (Note [pairwise sums], kernels/cpu/cascade.h; a single column is one contiguous run there, and here), fed
// each row as it is masked. d z is a select, exactly relu_backward's.
template <typename T>
void relu_backward_bias_cpu(const ReluBackwardBiasArgs& a) {
  using C = acc_t<T>;
  const T* g = static_cast<const T*>(a.g);
  const T* y = static_cast<const T*>(a.y);
  T* gz = static_cast<T*>(a.gz);
  T* db = static_cast<T*>(a.dbias);
  const int64_t rows = a.rows, n = a.cols;
  // Masks columns [c0, c1) of row r into gz and adds them to acc (indexed from c0). 16-bit rows are widened
  // into f32 on the stack first (at most kSumSlice columns at a time): element by element, the conversions
  // (with their NaN test) kept the loop scalar, a sixth of W4b's step outside its GEMMs. The values are the
  // same: the rounding back of a widened value is exact.
  auto row = [&](int64_t r, C* acc, int64_t c0, int64_t c1) {
    const T* gr = g + r * n;
    const T* yr = y + r * n;
    T* zr = gz + r * n;
    if constexpr (sizeof(T) == 2) {
      float gf[cpu::kSumSlice], yf[cpu::kSumSlice];
      const int64_t w = c1 - c0;
      FRUGAL_ASSERT(w <= cpu::kSumSlice, "relu_backward_bias: a slice of ", w, " columns");
      cpu::to_f32(gr + c0, gf, w);
      cpu::to_f32(yr + c0, yf, w);
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) {
        const float v = yf[j] > 0.0f ? gf[j] : 0.0f;
        gf[j] = v;
        acc[j] += v;
      }
      cpu::from_f32(gf, zr + c0, w);
    } else {
#pragma omp simd
      for (int64_t j = c0; j < c1; ++j) {
        const C v = C(yr[j]) > C(0) ? C(gr[j]) : C(0);
        zr[j] = T(v);
        acc[j - c0] += v;
      }
    }
  };
  if (n == 1) {
    parallel_for(0, rows, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) gz[r] = T(C(y[r]) > C(0) ? C(g[r]) : C(0));
    });
    cpu::run_sums<C, T>(
        1, rows, [&](int64_t) { return static_cast<const T*>(gz); }, [&](int64_t, C s) { db[0] = T(s); });
    return;
  }
  std::vector<C> sums(static_cast<size_t>(n));
  cpu::column_sums<C>(rows, n, sums.data(), row);
  for (int64_t j = 0; j < n; ++j) db[j] = T(sums[size_t(j)]);
}

const bool kRegistered = [] {
#ifdef FRUGAL_HAVE_ONEDNN
  op_linear.set(DeviceType::CPU, DType::F32, linear_cpu<float>);
  op_linear.set(DeviceType::Meta, DType::F32, linear_meta<float>);
  op_linear.set(DeviceType::CPU, DType::BF16, linear_cpu<BFloat16>);
  op_linear.set(DeviceType::Meta, DType::BF16, linear_meta<BFloat16>);
#endif
  cpu::for_types<float, double, Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_relu_backward_bias.set(DeviceType::CPU, dtype_v<T>, relu_backward_bias_cpu<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
