// CPU kernels of the fused linear layer (core/ops.h: linear, linear_relu, linear_relu_backward).
// Forward, f32 and bf16 with oneDNN (f16 composes it in the op layer): oneDNN's matmul primitive reads the
// weight [n, k] as its transpose in place and adds the bias as it stores each tile of y, so no pass
// transposes the weight or fills y with the bias first. linear_relu's ReLU is one pass over y after it (Note
// [linear_relu keeps a NaN]). bf16 multiplies with AVX-512 BF16 dot products accumulated in f32, the bias
// added in f32, y rounded once.
// Backward (every floating dtype): the ReLU mask and the bias gradient's column sums in one pass over d y.
// Their references are the unfused ops (tests/nn/test_linear_relu.cpp).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/op_table_linalg.h"
#include "core/parallel.h"
#include "kernels/cpu/cascade.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/register.h"
#include "kernels/cpu/relu.h"

#ifdef FRUGAL_HAVE_ONEDNN
#include <unordered_map>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels/cpu/onednn.h"
#include "kernels/cpu/vec.h"
#include "kernels/cpu/workspace.h"
#endif

namespace frugal {
namespace {

#ifdef FRUGAL_HAVE_ONEDNN

struct LinearPlan {
  dnnl::matmul primitive;
  dnnl::memory::desc x, w, bias, y, scratchpad;
};

using LinearPlans = cpu::PlanCache<5, LinearPlan>;

template <typename T>
constexpr dnnl::memory::data_type onednn_type() {
  return std::is_same_v<T, float> ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16;
}

// The multiply-adds below which the product runs on one thread under passive waiting.
template <typename T>
constexpr int64_t product_threshold() {
  return std::is_same_v<T, float> ? detail::kPassiveF32Product : detail::kPassiveBf16Product;
}

template <typename T>
std::shared_ptr<const LinearPlan> build_plan(const LinearArgs& a) {
  constexpr dnnl::memory::data_type dt = onednn_type<T>();
  const detail::OneThreadProduct threads(a.m * a.n * a.k, product_threshold<T>());
  auto plan = std::make_shared<LinearPlan>();
  plan->x = dnnl::memory::desc({a.m, a.k}, dt, {a.k, 1});
  plan->w = dnnl::memory::desc({a.k, a.n}, dt, {1, a.k});  // w [n, k] read as its transpose
  plan->y = dnnl::memory::desc({a.m, a.n}, dt, {a.n, 1});
  if (a.bias) plan->bias = dnnl::memory::desc({1, a.n}, dt, {a.n, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::matmul::desc desc = a.bias ? dnnl::matmul::desc(plan->x, plan->w, plan->bias, plan->y)
                                         : dnnl::matmul::desc(plan->x, plan->w, plan->y);
  const dnnl::matmul::primitive_desc pd(desc, attr, cpu::onednn_engine());
  plan->primitive = dnnl::matmul(pd);
  plan->scratchpad = pd.scratchpad_desc();
  return plan;
}

// Note [linear_relu keeps a NaN]
// linear_relu gives what relu(linear(...)) gives, a NaN included: relu's rule is v < 0 ? 0 : v, as its
// kernel's max(v, 0) computes it (Eigen's, with std::max's operand order), so a NaN (and a -0) comes through.
// oneDNN's ReLU post-op computes max(v, 0) with the operands the other way round, which takes a NaN to 0: a
// NaN input row, or a NaN weight's column, came out as zeros, and nn::Sequential's Linear, ReLU pairs, which
// run this op, hid it where the unfused modules showed it (the loss stayed finite). So the ReLU is a pass
// over y after the primitive, while y is still in cache: W4's step (32 such layers, 4 MiB of y each) took
// 1021-1093 ms against 1007-1118 with the post-op (7 alternated rounds, Zen 4), W1's within noise.
// The few rows' path and the unfused one apply the same rule as they store y. conv2d_relu does the same
// (kernels/cpu/conv.cpp), with the same cpu::relu_in_place.

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
  if (a.relu) cpu::relu_in_place(y, a.m * a.n);
}

// Note [a layer's forward on a few rows]
// y = x w^T (+ b, then the ReLU) for m <= kFewRows rows in f32: serving a request or a few at a time. There
// oneDNN 2.6's matmul primitive spends most of its time around the arithmetic: W1's MLP (784 -> 256 -> 256
// -> 10) answered one row in 29 us, and a 1024 -> 1024 layer in 91 us, on 2 threads of a Zen 4 (medians of
// 1001, alternated runs); as dot products, 8.4-8.8 and 27-28 us. Each task is a run of blocks of kFewCols
// rows of w (y's columns); a block keeps 2 x kFewCols vectors of sums for a pair of x's rows, each step one
// vector of each row times one of w's rows, fused multiply-adds, and sums their lanes at the end (a last,
// partial vector of k masked with AVX-512, added one by one after the lanes with AVX2); the next pair reads
// the block of w again from L1. The MLP at 2, 4 and 8 rows: 0.38, 0.54 and 0.78 of oneDNN's time (1024 ->
// 1024: 0.37, 0.55, 0.78); at 16 rows the same, and past that oneDNN's register blocking wins: hence 8. The
// order of the sums is not oneDNN's, so a row's output differs from the same row's in a larger batch by
// rounding (about 1e-7 relative), as between any two GEMM kernels. No working memory: the meta kernel takes
// none for these shapes either. Under passive waiting a layer below kPassiveF32Product multiply-adds runs on
// one thread (Note [a product on one thread under passive waiting], core/parallel.cpp), as oneDNN's products
// do: W1's MLP on 8 rows took 108-113 us there, split over two threads (its first layer's second half waited
// for the sleeping thread to wake, and the first for it to finish), and 64-75 us alone (2-core Zen 4,
// medians of 5001, 2 rounds alternated).
constexpr int64_t kFewRows = 8, kFewCols = 4;

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#if defined(__AVX512F__)
using FewVec = __m512;
constexpr int64_t kFewLanes = 16;
inline FewVec few_zero() { return _mm512_setzero_ps(); }
inline FewVec few_load(const float* p) { return _mm512_loadu_ps(p); }
inline FewVec few_fma(FewVec a, FewVec b, FewVec c) { return _mm512_fmadd_ps(a, b, c); }
#else
using FewVec = __m256;
constexpr int64_t kFewLanes = 8;
inline FewVec few_zero() { return _mm256_setzero_ps(); }
inline FewVec few_load(const float* p) { return _mm256_loadu_ps(p); }
inline FewVec few_fma(FewVec a, FewVec b, FewVec c) { return _mm256_fmadd_ps(a, b, c); }
#endif

// Rows [i0, i0 + R) of y at columns [j0, j0 + kFewCols) (a column past n repeats the last, computed, not
// stored).
template <int R>
void few_rows_block(const LinearArgs& a, int64_t i0, int64_t j0) {
  const auto* x = static_cast<const float*>(a.x) + i0 * a.k;
  const auto* w = static_cast<const float*>(a.w);
  const auto* bias = static_cast<const float*>(a.bias);
  auto* y = static_cast<float*>(a.y);
  const float* wc[kFewCols];
  for (int64_t c = 0; c < kFewCols; ++c) wc[c] = w + std::min(j0 + c, a.n - 1) * a.k;
  FewVec acc[R][kFewCols];
  for (int r = 0; r < R; ++r)
    for (int64_t c = 0; c < kFewCols; ++c) acc[r][c] = few_zero();
  const int64_t full = a.k - a.k % kFewLanes;
  auto step = [&](const FewVec* xv, auto load_w) {
    for (int64_t c = 0; c < kFewCols; ++c) {
      const FewVec wv = load_w(wc[c]);
      for (int r = 0; r < R; ++r) acc[r][c] = few_fma(xv[r], wv, acc[r][c]);
    }
  };
  for (int64_t p = 0; p < full; p += kFewLanes) {
    FewVec xv[R];
    for (int r = 0; r < R; ++r) xv[r] = few_load(x + r * a.k + p);
    step(xv, [p](const float* row) { return few_load(row + p); });
  }
#if defined(__AVX512F__)
  if (full < a.k) {
    const __mmask16 tail = cpu::first_lanes(a.k - full);
    FewVec xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm512_maskz_loadu_ps(tail, x + r * a.k + full);
    step(xv, [&](const float* row) { return _mm512_maskz_loadu_ps(tail, row + full); });
  }
#endif
  for (int r = 0; r < R; ++r)
    for (int64_t c = 0; c < kFewCols && j0 + c < a.n; ++c) {
      float v = cpu::sum_lanes(acc[r][c]);
#if !defined(__AVX512F__)
      for (int64_t p = full; p < a.k; ++p) v = std::fma(x[r * a.k + p], wc[c][p], v);
#endif
      if (bias) v += bias[j0 + c];
      y[(i0 + r) * a.n + j0 + c] = a.relu && v < 0.0f ? 0.0f : v;  // Note [linear_relu keeps a NaN]
    }
}

bool few_rows(const LinearArgs& a) { return a.m >= 1 && a.m <= kFewRows && a.k >= 1; }

void linear_few_rows(const LinearArgs& a) {
  const int64_t blocks = (a.n + kFewCols - 1) / kFewCols;
  const int64_t grain = std::max<int64_t>(1, detail::small_product_grain() / (a.m * a.k * kFewCols));
  const detail::OneThreadProduct threads(a.m * a.n * a.k, detail::kPassiveF32Product);
  parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t i0 = 0; i0 < a.m; i0 += 2) {  // the block of w, in L1 after the first pair of rows
        if (a.m - i0 == 1)
          few_rows_block<1>(a, i0, b * kFewCols);
        else
          few_rows_block<2>(a, i0, b * kFewCols);
      }
  });
}
#else
bool few_rows(const LinearArgs&) { return false; }
void linear_few_rows(const LinearArgs&) {}
#endif

// One cache for the CPU kernels and their meta twins, so that a dry run sizes the scratchpad the run will
// take.
template <typename T>
std::shared_ptr<const LinearPlan> plan_for(const LinearArgs& a) {
  static LinearPlans plans(64);
  return plans.get({a.m, a.n, a.k, a.bias ? 1 : 0, int64_t(dtype_v<T>)}, [&] { return build_plan<T>(a); });
}

template <typename T>
void linear_cpu(const LinearArgs& a) {
  if constexpr (std::is_same_v<T, float>)
    if (few_rows(a)) return linear_few_rows(a);
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
  {
    const detail::OneThreadProduct threads(a.m * a.n * a.k, product_threshold<T>());
    plan->primitive.execute(stream, args);
    stream.wait();
  }
  if (a.relu) cpu::relu_in_place(static_cast<T*>(a.y), a.m * a.n);
}

// The meta kernel (core/op_table.h): the scratchpad oneDNN's matmul takes, which depends on the ISA it runs
// on: none on a Zen 3 (AVX2), 257 KiB for a layer of the estimate tests' MLP on an AVX-512 Xeon.
template <typename T>
void linear_meta(const LinearArgs& a) {
  if constexpr (std::is_same_v<T, float>)
    if (few_rows(a)) return;  // no working memory (Note [a layer's forward on a few rows])
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
    parallel_for(0, rows, parallel_grain(), [&](int64_t b, int64_t e) {
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
