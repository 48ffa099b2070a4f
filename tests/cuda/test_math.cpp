// The CUDA kernels' per-element math (kernels/cuda/math.h) on the host, against the CPU kernels: every
// elementwise op, the conversions, the reduction states merged in tree order, the online softmax, the fused
// cross-entropy terms and the optimizer updates. Runs on every machine; tests/cuda/test_ops.cpp checks the
// kernels themselves on a GPU.
#include "kernels/cuda/math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "core/op_table_attention.h"
#include "core/op_table_optim.h"
#include "core/op_table_sparse.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

using testing::expect_close;
using testing::uniform;

// Applies f to every element of a contiguous f32/f64/i64 tensor the way a kernel would: in the compute type.
template <typename C, typename F>
std::vector<double> apply(const Tensor& x, F f) {
  std::vector<double> out;
  for (C v : x.to_vector<C>()) out.push_back(double(f(v)));
  return out;
}
template <typename C, typename F>
std::vector<double> apply2(const Tensor& a, const Tensor& b, F f) {
  const auto av = a.to_vector<C>(), bv = b.to_vector<C>();
  std::vector<double> out;
  for (size_t i = 0; i < av.size(); ++i) out.push_back(double(f(av[i], bv[i])));
  return out;
}

// f32 results of libm against Eigen's vectorised functions: a few ulp apart.
constexpr testing::Tol kF32{1e-6, 2e-6};
constexpr testing::Tol kF64{1e-14, 1e-13};

// The input range of each one-input op of core/op_list.h ([-5, 5) when not named here).
struct Range {
  const char* name;
  double lo, hi;
};
constexpr Range kRanges[] = {{"exp", -20, 20},     {"log", 1e-3, 50}, {"sqrt", 0, 50},
                             {"rsqrt", 1e-3, 50},  {"gelu", -8, 8},   {"gelu_tanh", -8, 8},
                             {"sigmoid", -30, 30}, {"tanh", -10, 10}, {"silu", -30, 30},
                             {"erf", -4, 4},       {"sin", -10, 10},  {"cos", -10, 10}};
Range range_of(const char* name) {
  for (const Range& r : kRanges)
    if (std::string(r.name) == name) return r;
  return {name, -5, 5};
}

// Every one-input op of the list: its functor, run on the host as a GPU thread runs it, against the CPU's
// kernel (which may run an Eigen form instead).
TEST(CudaMath, UnaryOpsMatchTheCpuKernels) {
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> cpu;
    std::function<double(float)> f32;
    std::function<double(double)> f64;
    double lo, hi;
  };
  std::vector<Case> cases;
#define FRUGAL_CASE(name, Op, ...)                                                                        \
  cases.push_back({#name, [](const Tensor& x) { return ops::name(x); },                                   \
                   [](float v) { return double(math::Op{}(v)); }, [](double v) { return math::Op{}(v); }, \
                   range_of(#name).lo, range_of(#name).hi});
  FRUGAL_UNARY_OP_LIST(FRUGAL_CASE)
#undef FRUGAL_CASE
  ASSERT_GE(cases.size(), 15u);
  for (const Case& c : cases) {
    const Tensor x = uniform({4099}, c.lo, c.hi, DType::F64, 7);
    expect_close(apply<float>(x.to(DType::F32), c.f32), c.cpu(x.to(DType::F32)).to_vector<double>(), kF32,
                 std::string(c.name) + " f32");
    expect_close(apply<double>(x, c.f64), c.cpu(x).to_vector<double>(), kF64, std::string(c.name) + " f64");
  }
  // Integer forms, exactly.
  const Tensor i = uniform({999}, -1000, 1000, DType::F64, 8).to(DType::I64);
  EXPECT_EQ(apply<int64_t>(i, math::Neg{}), ops::neg(i).to_vector<double>());
  EXPECT_EQ(apply<int64_t>(i, math::Abs{}), ops::abs(i).to_vector<double>());
  EXPECT_EQ(apply<int64_t>(i, math::Relu{}), ops::relu(i).to_vector<double>());
}

TEST(CudaMath, ClampMatchesTheCpuKernelIncludingIntegerBounds) {
  const Tensor x = uniform({2000}, -10, 10, DType::F32, 9);
  EXPECT_EQ(apply<float>(x, math::Clamp<float>(-2.5, 3)), ops::clamp(x, -2.5, 3).to_vector<double>());
  EXPECT_EQ(apply<float>(x, math::Clamp<float>(-INFINITY, 1)), ops::clamp_max(x, 1).to_vector<double>());
  const Tensor i = x.to(DType::I32);
  EXPECT_EQ(apply<int32_t>(i, math::Clamp<int32_t>(-2.5, INFINITY)),
            ops::clamp(i, -2.5, INFINITY).to_vector<double>());
  EXPECT_EQ(apply<int32_t>(i, math::Clamp<int32_t>(-1e30, 4.9)),
            ops::clamp(i, -1e30, 4.9).to_vector<double>());
  EXPECT_TRUE(std::isnan(math::Clamp<float>(0, 1)(NAN)));
}

TEST(CudaMath, BinaryOpsAndComparisonsMatchTheCpuKernels) {
  const Tensor a = uniform({3001}, -4, 4, DType::F32, 10), b = uniform({3001}, -4, 4, DType::F32, 11);
  const Tensor pos = uniform({3001}, 0.1, 3, DType::F32, 12);
  expect_close(apply2<float>(a, b, math::Add{}), ops::add(a, b).to_vector<double>(), kF32, "add");
  expect_close(apply2<float>(a, b, math::Sub{}), ops::sub(a, b).to_vector<double>(), kF32, "sub");
  expect_close(apply2<float>(a, b, math::Mul{}), ops::mul(a, b).to_vector<double>(), kF32, "mul");
  expect_close(apply2<float>(a, b, math::Div{}), ops::div(a, b).to_vector<double>(), kF32, "div");
  expect_close(apply2<float>(pos, b, math::Pow{}), ops::pow(pos, b).to_vector<double>(), kF32, "pow");
  expect_close(apply2<float>(a, b, math::Maximum{}), ops::maximum(a, b).to_vector<double>(), kF32, "maximum");
  expect_close(apply2<float>(a, b, math::Minimum{}), ops::minimum(a, b).to_vector<double>(), kF32, "minimum");
  // Integers exactly, pow with negative exponents and the bases 1 and -1 included.
  const Tensor ia = uniform({3001}, -6, 6, DType::F64, 13).to(DType::I64);
  const Tensor ib = uniform({3001}, -3, 9, DType::F64, 14).to(DType::I64);
  EXPECT_EQ(apply2<int64_t>(ia, ib, math::Pow{}), ops::pow(ia, ib).to_vector<double>());
  EXPECT_EQ(apply2<int64_t>(ia, ib, math::Add{}), ops::add(ia, ib).to_vector<double>());
  EXPECT_EQ(apply2<int64_t>(ia, ib, math::Maximum{}), ops::maximum(ia, ib).to_vector<double>());
  EXPECT_EQ(apply2<int64_t>(ia, ib, math::Minimum{}), ops::minimum(ia, ib).to_vector<double>());
  // Comparisons, with ties.
  const Tensor ta = ia.to(DType::F32), tb = ib.to(DType::F32);
#define FRUGAL_CHECK_COMPARE(name, Op) \
  EXPECT_EQ(apply2<float>(ta, tb, math::Op{}), ops::name(ta, tb).to(DType::F64).to_vector<double>()) << #name;
  FRUGAL_CHECK_COMPARE(eq, Eq)
  FRUGAL_CHECK_COMPARE(ne, Ne)
  FRUGAL_CHECK_COMPARE(lt, Lt)
  FRUGAL_CHECK_COMPARE(le, Le)
  FRUGAL_CHECK_COMPARE(gt, Gt)
  FRUGAL_CHECK_COMPARE(ge, Ge)
#undef FRUGAL_CHECK_COMPARE
  // NaN propagates through maximum and minimum, as in PyTorch.
  EXPECT_TRUE(std::isnan(math::Maximum{}(NAN, 1.0f)));
  EXPECT_TRUE(std::isnan(math::Minimum{}(1.0f, NAN)));
  EXPECT_TRUE(std::isnan(math::Relu{}(NAN)));
}

TEST(CudaMath, ConversionsMatchTheCpuCasts) {
  // Note [float to integer casts] (kernels/cpu/elementwise.cpp): negative values to u8, NaN, infinities and
  // values beyond the integer types included.
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor x = tensor<float>({-3.7f, -1, -0.5f, 0, 0.25f, 1, 2.9f, 200.5f, 1e6f, -255.5f, 300, 3e9f,
                                  -3e9f, 1e19f, -1e19f, NAN, inf, -inf});
  for (DType from : {DType::F32, DType::F64}) {
    const auto v = x.to_vector<double>();
    std::vector<int64_t> i64;
    std::vector<int32_t> i32;
    std::vector<uint8_t> u8;
    std::vector<double> b;
    for (double d : v) {
      const float f = float(d);
      i32.push_back(from == DType::F32 ? math::convert<int32_t>(f) : math::convert<int32_t>(d));
      i64.push_back(from == DType::F32 ? math::convert<int64_t>(f) : math::convert<int64_t>(d));
      u8.push_back(from == DType::F32 ? math::convert<uint8_t>(f) : math::convert<uint8_t>(d));
      b.push_back(math::convert<bool>(f));
    }
    const Tensor xf = x.to(from);
    EXPECT_EQ(i32, xf.to(DType::I32).to_vector<int32_t>()) << dtype_name(from);
    EXPECT_EQ(i64, xf.to(DType::I64).to_vector<int64_t>()) << dtype_name(from);
    EXPECT_EQ(u8, xf.to(DType::U8).to_vector<uint8_t>()) << dtype_name(from);
    EXPECT_EQ(b, xf.to(DType::Bool).to(DType::F64).to_vector<double>()) << dtype_name(from);
  }
  EXPECT_EQ(math::convert<uint8_t>(-1.0f), 255);  // as PyTorch's CPU: through i64, modulo 256
  EXPECT_EQ(math::convert<int32_t>(NAN), 0);
  EXPECT_EQ(math::convert<float>(int64_t(-7)), -7.0f);
  EXPECT_EQ(math::convert<bool>(int64_t(2)), true);
  EXPECT_EQ(math::convert<uint8_t>(200.9f), 200);
}

// Merges per-element states in a random tree, as a GPU's threads and blocks would.
template <typename R>
typename R::Acc tree_reduce(const R& r, const std::vector<typename R::Acc>& leaves, std::mt19937_64& rng) {
  std::vector<typename R::Acc> level = leaves;
  if (level.empty()) return r.identity();
  while (level.size() > 1) {
    std::vector<typename R::Acc> next;
    for (size_t i = 0; i < level.size(); i += 2) {
      if (i + 1 == level.size()) {
        next.push_back(rng() % 2 ? r.merge(level[i], r.identity()) : level[i]);
      } else {
        next.push_back(rng() % 2 ? r.merge(level[i], level[i + 1]) : r.merge(level[i + 1], level[i]));
      }
    }
    level = next;
  }
  return level[0];
}

template <typename R, typename C>
typename R::Acc reduce_row(const R& r, const std::vector<C>& row, std::mt19937_64& rng) {
  std::vector<typename R::Acc> leaves;
  for (size_t i = 0; i < row.size(); ++i) leaves.push_back(r.take(row[i], int64_t(i)));
  return tree_reduce(r, leaves, rng);
}

TEST(CudaMath, ReductionStatesMergedInAnyOrderMatchTheCpuKernels) {
  std::mt19937_64 rng(5);
  constexpr int64_t kRows = 40, kCols = 333;
  // Few distinct values, so that ties are common; a NaN in some rows.
  Tensor x = uniform({kRows, kCols}, -5, 5, DType::F64, 15).to(DType::I64).to(DType::F32);
  auto xv = x.to_vector<float>();
  for (int64_t r = 0; r < kRows; r += 7) xv[size_t(r * kCols + (r * 13) % kCols)] = NAN;
  x = tensor(xv, {kRows, kCols});
  const auto max_cpu = ops::max(x, {1}).to_vector<double>(), min_cpu = ops::min(x, {1}).to_vector<double>();
  const auto argmax_cpu = ops::argmax(x, 1).to_vector<double>(),
             argmin_cpu = ops::argmin(x, 1).to_vector<double>();
  for (int64_t r = 0; r < kRows; ++r) {
    const std::vector<float> row(xv.begin() + r * kCols, xv.begin() + (r + 1) * kCols);
    const float mx = reduce_row(math::ExtremeReduce<float, true>{}, row, rng);
    const float mn = reduce_row(math::ExtremeReduce<float, false>{}, row, rng);
    if (std::isnan(max_cpu[size_t(r)])) {
      EXPECT_TRUE(std::isnan(mx) && std::isnan(mn)) << "row " << r;
    } else {
      EXPECT_EQ(mx, max_cpu[size_t(r)]) << "row " << r;
      EXPECT_EQ(mn, min_cpu[size_t(r)]) << "row " << r;
    }
    EXPECT_EQ(reduce_row(math::ArgReduce<float, true>{}, row, rng).index, argmax_cpu[size_t(r)])
        << "row " << r;
    EXPECT_EQ(reduce_row(math::ArgReduce<float, false>{}, row, rng).index, argmin_cpu[size_t(r)])
        << "row " << r;
  }
  // Sums and variances of real-valued rows.
  const Tensor y = uniform({kRows, kCols}, -3, 5, DType::F32, 16);
  const auto yv = y.to_vector<float>();
  std::vector<double> sums, vars;
  for (int64_t r = 0; r < kRows; ++r) {
    const std::vector<float> row(yv.begin() + r * kCols, yv.begin() + (r + 1) * kCols);
    sums.push_back(reduce_row(math::SumReduce<float>{}, row, rng));
    vars.push_back(math::variance(reduce_row(math::VarReduce{}, row, rng), 1));
  }
  expect_close(sums, ops::sum(y, {1}).to_vector<double>(), {1e-4, 1e-5}, "sum");
  expect_close(vars, ops::var(y, {1}).to_vector<double>(), {1e-5, 1e-5}, "var");
  EXPECT_TRUE(std::isnan(math::variance(reduce_row(math::VarReduce{}, std::vector<float>{2}, rng), 1)));
  // Integers and bools: the identities are the types' extremes.
  EXPECT_EQ(reduce_row(math::ExtremeReduce<int64_t, true>{}, std::vector<int64_t>{-5, -9}, rng), -5);
  EXPECT_EQ(reduce_row(math::ExtremeReduce<bool, false>{}, std::vector<bool>{true, false}, rng), false);
  EXPECT_EQ((math::ExtremeReduce<int32_t, false>{}.identity()), std::numeric_limits<int32_t>::max());
}

// Softmax rows through the online max/sum states, merged from parts of random sizes.
TEST(CudaMath, OnlineSoftmaxMatchesTheCpuKernel) {
  std::mt19937_64 rng(6);
  constexpr int64_t kRows = 12, kCols = 517;
  auto xv = uniform({kRows, kCols}, -30, 30, DType::F32, 17).to_vector<float>();
  for (int64_t j = 0; j < kCols; j += 3) xv[size_t(2 * kCols + j)] = -INFINITY;  // a masked row
  for (int64_t j = 0; j < kCols; ++j) xv[size_t(5 * kCols + j)] = -INFINITY;     // all masked: NaN
  const Tensor x = tensor(xv, {kRows, kCols});
  const auto soft = ops::softmax(x, 1).to_vector<double>(),
             log_soft = ops::log_softmax(x, 1).to_vector<double>();
  std::vector<double> ours, ours_log;
  for (int64_t r = 0; r < kRows; ++r) {
    std::vector<math::MaxSum<float>> parts;
    for (int64_t j = 0; j < kCols;) {
      const int64_t len = 1 + int64_t(rng() % 40);
      math::MaxSum<float> s{-INFINITY, 0};
      for (int64_t k = j; k < std::min(kCols, j + len); ++k)
        s = math::max_sum_take(s, xv[size_t(r * kCols + k)]);
      parts.push_back(s);
      if (rng() % 5 == 0) parts.push_back({-INFINITY, 0});  // a thread that had no element
      j += len;
    }
    while (parts.size() > 1) {
      const size_t i = rng() % (parts.size() - 1);
      parts[i] = math::max_sum_merge(parts[i], parts[i + 1]);
      parts.erase(parts.begin() + long(i) + 1);
    }
    const float m = parts[0].max, s = parts[0].sum;
    for (int64_t j = 0; j < kCols; ++j) {
      const float v = xv[size_t(r * kCols + j)];
      ours.push_back(math::exp_(v - m) / s);
      ours_log.push_back(v - m - math::log_(s));
    }
  }
  expect_close(ours, soft, kF32, "softmax");
  expect_close(ours_log, log_soft, {1e-5, 2e-6}, "log_softmax");
}

TEST(CudaMath, CrossEntropyTermsMatchTheFusedCpuOp) {
  constexpr int64_t kRows = 9, kClasses = 37;
  const Tensor logits = uniform({kRows, kClasses}, -6, 6, DType::F32, 18).requires_grad_();
  std::vector<int64_t> t(kRows);
  for (int64_t r = 0; r < kRows; ++r) t[size_t(r)] = (r * 11) % kClasses;
  t[3] = -100;  // ignored
  const Tensor target = tensor(t);
  for (double eps : {0.0, 0.1}) {
    const Tensor loss = nn::functional::cross_entropy_rows(logits, target, -100, eps);
    logits.zero_grad();
    loss.sum().backward();
    const auto xv = logits.to_vector<float>();
    std::vector<double> our_loss, our_grad;
    for (int64_t r = 0; r < kRows; ++r) {
      math::MaxSum<float> s{-INFINITY, 0};
      float sum_x = 0;
      for (int64_t j = 0; j < kClasses; ++j) {
        s = math::max_sum_take(s, xv[size_t(r * kClasses + j)]);
        sum_x += xv[size_t(r * kClasses + j)];
      }
      const float lse = s.max + math::log_(s.sum);
      const bool ignored = t[size_t(r)] == -100;
      our_loss.push_back(ignored ? 0.0
                                 : math::cross_entropy_loss(lse, xv[size_t(r * kClasses + t[size_t(r)])],
                                                            sum_x, float(eps), kClasses));
      for (int64_t j = 0; j < kClasses; ++j)
        our_grad.push_back(ignored ? 0.0
                                   : math::cross_entropy_grad(xv[size_t(r * kClasses + j)], lse, 1.0f,
                                                              j == t[size_t(r)], float(eps), kClasses));
    }
    expect_close(our_loss, loss.to_vector<double>(), {1e-5, 1e-5}, "loss");
    expect_close(our_grad, logits.grad().to_vector<double>(), {1e-6, 1e-5}, "grad");
  }
}

// The optimizer updates against the CPU kernels, called through the op table on the same data.
TEST(CudaMath, OptimizerUpdatesMatchTheCpuKernels) {
  constexpr int64_t n = 1000;
  const auto p0 = uniform({n}, -1, 1, DType::F32, 19).to_vector<float>();
  const auto g0 = uniform({n}, -1, 1, DType::F32, 20).to_vector<float>();
  const auto s0 = uniform({n}, 0, 1, DType::F32, 21).to_vector<float>();
  for (bool nesterov : {false, true}) {
    for (bool first : {false, true}) {
      std::vector<float> p = p0, buf = s0, p_ref = p0, buf_ref = s0;
      SgdStepArgs a;
      a.param = p_ref.data();
      a.grad = g0.data();
      a.momentum_buffer = buf_ref.data();
      a.n = n;
      a.lr = 0.1, a.momentum = 0.9, a.dampening = 0.1, a.weight_decay = 0.01;
      a.nesterov = nesterov;
      a.first_step = first;
      op_sgd_step.get(kCPU, DType::F32)(a);
      const math::SgdHyper<float> h{0.1f, 0.01f, 0.9f, float(1 - 0.1), true, nesterov, first, true};
      for (int64_t i = 0; i < n; ++i)
        p[size_t(i)] = math::sgd_step(p[size_t(i)], g0[size_t(i)], &buf[size_t(i)], h);
      EXPECT_EQ(p, p_ref) << "sgd nesterov=" << nesterov << " first=" << first;
      EXPECT_EQ(buf, buf_ref);
    }
  }
  for (bool decoupled : {false, true}) {
    for (bool amsgrad : {false, true}) {
      std::vector<float> p = p0, m = s0, v = s0, vmax = s0, p_ref = p0, m_ref = s0, v_ref = s0, vmax_ref = s0;
      AdamStepArgs a;
      a.param = p_ref.data();
      a.grad = g0.data();
      a.exp_avg = m_ref.data();
      a.exp_avg_sq = v_ref.data();
      a.max_exp_avg_sq = vmax_ref.data();
      a.n = n;
      a.lr = 1e-2, a.beta1 = 0.9, a.beta2 = 0.99, a.eps = 1e-8, a.weight_decay = 0.05;
      a.step_size = a.lr / (1 - std::pow(0.9, 3));
      a.bias_correction2_sqrt = std::sqrt(1 - std::pow(0.99, 3));
      a.decoupled_weight_decay = decoupled;
      a.amsgrad = amsgrad;
      op_adam_step.get(kCPU, DType::F32)(a);
      const math::AdamHyper<float> h{float(a.beta1),
                                     float(a.beta2),
                                     float(1 - a.beta1),
                                     float(1 - a.beta2),
                                     float(a.eps),
                                     float(a.weight_decay),
                                     float(1 - a.lr * a.weight_decay),
                                     float(a.step_size),
                                     float(a.bias_correction2_sqrt),
                                     !decoupled,
                                     decoupled,
                                     amsgrad};
      for (int64_t i = 0; i < n; ++i) {
        const size_t k = size_t(i);
        p[k] = math::adam_step(p[k], g0[k], &m[k], &v[k], &vmax[k], h);
      }
      expect_close(std::vector<double>(p.begin(), p.end()), std::vector<double>(p_ref.begin(), p_ref.end()),
                   {1e-7, 1e-6}, "adam");
      EXPECT_EQ(m, m_ref);
      EXPECT_EQ(v, v_ref);
      if (amsgrad) {
        EXPECT_EQ(vmax, vmax_ref);
      }
    }
  }
  {
    constexpr int64_t rows = 10, dim = 100;  // n elements as [rows, dim]; rows 7, 2, 5 updated
    std::vector<float> p = p0, m = s0, v = s0, p_ref = p0, m_ref = s0, v_ref = s0;
    const std::vector<int64_t> idx = {7, 2, 5};
    SparseAdamStepArgs a;
    a.param = p_ref.data();
    a.exp_avg = m_ref.data();
    a.exp_avg_sq = v_ref.data();
    a.indices = idx.data();
    a.values = g0.data();
    a.nnz = 3;
    a.dim = dim;
    a.beta1 = 0.9, a.beta2 = 0.999, a.eps = 1e-8, a.step_size = 0.01;
    op_sparse_adam_step.get(kCPU, DType::F32)(a);
    const math::SparseAdamHyper<float> h{float(1 - a.beta1), float(1 - a.beta2), float(a.eps),
                                         float(a.step_size)};
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t j = 0; j < dim; ++j) {
        const size_t k = size_t(idx[size_t(r)] * dim + j);
        p[k] = math::sparse_adam_step(p[k], g0[size_t(r * dim + j)], &m[k], &v[k], h);
      }
    EXPECT_EQ(p, p_ref);
    EXPECT_EQ(m, m_ref);
    EXPECT_EQ(v, v_ref);
    (void)rows;
  }
}

TEST(CudaMath, GptPathMathMatchesTheCpuKernels) {
  // GELU's gradients against the one-pass CPU kernels.
  const Tensor x = uniform({4099}, -8, 8, DType::F32, 60), dy = uniform({4099}, -2, 2, DType::F32, 61);
  expect_close(apply2<float>(dy, x, math::GeluBackward{}), ops::gelu_backward(dy, x).to_vector<double>(),
               kF32, "gelu_backward");
  // ReLU's gradient: a select, bit for bit (ReLU outputs with zeros, a NaN and -0).
  Tensor relu_y = ops::relu(uniform({4099}, -1, 1, DType::F32, 59));
  relu_y.data<float>()[3] = NAN;
  relu_y.data<float>()[4] = -0.0f;
  EXPECT_EQ(apply2<float>(dy, relu_y, math::ReluBackward{}),
            ops::relu_backward(dy, relu_y).to_vector<double>());
  // t = tanh(...) near -1 leaves 1 + t with few bits: libm's tanhf and Eigen's approximation differ there by
  // a few ulp of 1, i.e. ~1e-6 absolute.
  expect_close(apply2<float>(dy, x, math::GeluTanhBackward{}),
               ops::gelu_tanh_backward(dy, x).to_vector<double>(), {1e-5, 2e-6}, "gelu_tanh_backward");

  // LayerNorm's dx of one row from the statistics of the CPU forward, against the CPU backward (f64).
  constexpr int64_t n = 37;
  const Tensor xr = uniform({1, n}, -2, 3, DType::F64, 62), g = uniform({1, n}, -1, 1, DType::F64, 63);
  const Tensor w = uniform({n}, 0.5, 1.5, DType::F64, 64);
  const ops::LayerNormResult f = ops::layer_norm(xr, {n}, w, {}, 1e-5);
  const ops::LayerNormGrads b = ops::layer_norm_backward(g, xr, {n}, w, f.mean, f.rstd, true, false, false);
  const auto xv = xr.to_vector<double>(), gv = g.to_vector<double>(), wv = w.to_vector<double>();
  const double mu = f.mean.item<double>(), rs = f.rstd.item<double>();
  double sum_g = 0, sum_gx = 0;
  for (int64_t j = 0; j < n; ++j) {
    sum_g += gv[size_t(j)] * wv[size_t(j)];
    sum_gx += gv[size_t(j)] * wv[size_t(j)] * (xv[size_t(j)] - mu) * rs;
  }
  std::vector<double> dx;
  for (int64_t j = 0; j < n; ++j)
    dx.push_back(math::layer_norm_dx(gv[size_t(j)] * wv[size_t(j)], (xv[size_t(j)] - mu) * rs, rs, sum_g / n,
                                     sum_gx / n));
  expect_close(dx, b.dx.to_vector<double>(), kF64, "layer_norm dx");

  // The attention probabilities' gradient of one causal row against the CPU kernel.
  constexpr int64_t t = 6;
  const Tensor s = uniform({t, t}, -3, 3, DType::F64, 65), ds = uniform({t, t}, -1, 1, DType::F64, 66);
  AttentionSoftmaxArgs a;
  const Tensor y = empty({t, t}, DType::F64), dx_cpu = empty({t, t}, DType::F64);
  a.x = s.raw_data();
  a.y = y.raw_data();
  a.dy = ds.raw_data();
  a.dx = dx_cpu.raw_data();
  a.rows = t;
  a.t = t;
  a.scale = 0.5;
  a.causal = true;
  op_attention_softmax.get(kCPU, DType::F64)(a);
  op_attention_softmax_backward.get(kCPU, DType::F64)(a);
  const auto yv = y.to_vector<double>(), dyv = ds.to_vector<double>();
  std::vector<double> dxs;
  for (int64_t r = 0; r < t; ++r) {
    double dot = 0;
    for (int64_t j = 0; j <= r; ++j) dot += yv[size_t(r * t + j)] * dyv[size_t(r * t + j)];
    for (int64_t j = 0; j < t; ++j)
      dxs.push_back(
          j <= r ? math::attention_softmax_dx(yv[size_t(r * t + j)], dyv[size_t(r * t + j)], dot, 0.5) : 0);
  }
  expect_close(dxs, dx_cpu.to_vector<double>(), kF64, "attention softmax dx");

  // The GradScaler's test: inf and NaN, not the largest finite values.
  EXPECT_FALSE(math::non_finite(std::numeric_limits<float>::max()));
  EXPECT_FALSE(math::non_finite(-std::numeric_limits<float>::max()));
  EXPECT_FALSE(math::non_finite(0.0f));
  EXPECT_TRUE(math::non_finite(INFINITY));
  EXPECT_TRUE(math::non_finite(-INFINITY));
  EXPECT_TRUE(math::non_finite(NAN));
}

}  // namespace
}  // namespace frugal
