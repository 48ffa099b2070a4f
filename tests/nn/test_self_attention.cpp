// The fused self-attention of packed q, k, v (nn::functional::self_attention) against its composite (views,
// matmul, attention_scores_softmax): outputs and gradients in f32 (tight) and bf16 (dtype tolerance), causal
// and not, for several head counts and scales, on a non-contiguous qkv; finite differences in f64; the module
// path; f16/bf16 probabilities kept in their dtype; row statistics kept instead of probabilities; bad inputs.
#include <any>
#include <cmath>

#include "core/op_table_attention.h"
#include "core/parallel.h"
#include "nn/attention.h"
#include "tests/autograd/gradcheck_helpers.h"

namespace frugal {
namespace {

namespace F = nn::functional;
using testing::expect_close;
using testing::expect_error;
using testing::uniform;

struct Case {
  int64_t b, t, d, heads;
  double scale;
  bool causal;
};
const Case kCases[] = {
    {2, 7, 12, 3, 0.5, true},
    {2, 7, 12, 3, 0.5, false},
    {1, 1, 4, 1, 1.0, true},
    {3, 64, 128, 4, 0.17677669529663687, true},
    {2, 5, 8, 2, -0.7, true},
    {4, 33, 48, 2, 0.3, false},
    // bf16's products (Note [the attention's products in bf16]): row blocks with a remainder and two column
    // blocks; a head size of 40 (20 pairs: an 8 x 8 transpose and a rest); an odd head size (the f32 path).
    {1, 70, 64, 2, 0.2, true},
    {2, 40, 80, 2, 0.3, false},
    {2, 19, 6, 2, 0.4, true},
    // f32's transposes of K and V in 8 x 8 blocks: a head size of 12 and 21 rows (edge columns beside the
    // blocks, then edge rows).
    {2, 21, 24, 2, 0.5, true},
};

std::string name(const Case& c) {
  std::ostringstream s;
  s << "B " << c.b << " T " << c.t << " d " << c.d << " heads " << c.heads << " scale " << c.scale
    << (c.causal ? " causal" : " full");
  return s.str();
}

// The kernels' arguments for case c at this batch, without their tensors.
SelfAttentionArgs args_for(const Case& c, int64_t batch) {
  SelfAttentionArgs a;
  a.batch = batch;
  a.t = c.t;
  a.heads = c.heads;
  a.head_dim = c.d / c.heads;
  a.scale = c.scale;
  a.causal = c.causal;
  a.threads = num_threads();
  return a;
}

// y and d qkv of the fused op or the composite for a fixed random qkv and upstream gradient, dtype t; with
// `strided`, qkv is a non-contiguous view (every second element of a tensor twice as wide).
std::pair<Tensor, Tensor> run(const Case& c, DType t, bool fused, bool strided = false) {
  Tensor qkv = strided ? uniform({c.b, c.t, 6 * c.d}, -2, 2, t, 7).slice(-1, 0, 6 * c.d, 2).detach()
                       : uniform({c.b, c.t, 3 * c.d}, -2, 2, t, 7);
  qkv.requires_grad_();
  const Tensor y = fused ? F::self_attention(qkv, c.heads, c.scale, c.causal)
                         : F::self_attention_composite(qkv, c.heads, c.scale, c.causal);
  y.backward(uniform(y.shape(), -1, 1, t, 8));
  return {y.detach(), qkv.grad()};
}

TEST(SelfAttention, MatchesCompositeF32AndF64) {
  for (const Case& c : kCases)
    for (DType t : {DType::F32, DType::F64})
      for (bool strided : {false, true}) {
        const auto [y, dqkv] = run(c, t, true, strided);
        const auto [y_ref, dqkv_ref] = run(c, t, false, strided);
        const std::string what = name(c) + " " + dtype_name(t) + (strided ? " strided" : "");
        EXPECT_EQ(y.shape(), (Shape{c.b, c.t, c.d})) << what;
        EXPECT_EQ(y.dtype(), t) << what;
        const testing::Tol tol = t == DType::F64 ? testing::Tol{1e-12, 1e-10} : testing::Tol{2e-5, 2e-5};
        expect_close(y, y_ref.to_vector<double>(), tol, what + " y");
        expect_close(dqkv, dqkv_ref.to_vector<double>(), tol, what + " dqkv");
      }
}

TEST(SelfAttention, MatchesCompositeHalfTypes) {
  for (DType t : {DType::BF16, DType::F16})
    for (const Case& c : kCases)
      for (bool strided : {false, true}) {
        const auto [y, dqkv] = run(c, t, true, strided);
        const auto [y_ref, dqkv_ref] = run(c, t, false, strided);
        const std::string what = name(c) + " " + dtype_name(t) + (strided ? " strided" : "");
        EXPECT_EQ(y.dtype(), t) << what;
        EXPECT_EQ(dqkv.dtype(), t) << what;
        // The composite rounds its scores, probabilities and partial gradients to t; the fused op only its
        // results.
        const testing::Tol tol = testing::tol_for(t);
        expect_close(y, y_ref.to_vector<double>(), {4 * tol.atol, 4 * tol.rtol}, what + " y");
        expect_close(dqkv, dqkv_ref.to_vector<double>(), {8 * tol.atol, 8 * tol.rtol}, what + " dqkv");
      }
}

// bf16's forward against a naive one in double on the same bf16 inputs that rounds P to bf16 before P V
// (what the bf16 products do; the f32 path does not, and the bound covers both): |y - y_ref| within 2^-8
// |y_ref| (y's own rounding) plus 2^-8 sum_j P_j |V_j| (P's rounding). A key dropped or paired with the
// wrong value row, anywhere in the row and column blocks, is far outside it. Large scales make P nearly
// one-hot, with subnormal entries.
TEST(SelfAttention, Bf16ForwardAgainstNaiveWithRoundedProbabilities) {
  struct Shape4 {
    int64_t t, hd, heads;
    double scale;
    bool causal;
  };
  for (const Shape4& c :
       {Shape4{7, 4, 3, 0.5, true}, Shape4{1, 2, 1, 1.0, true}, Shape4{70, 32, 2, 0.2, true},
        Shape4{40, 40, 2, 0.3, false}, Shape4{19, 3, 2, 0.4, true}, Shape4{33, 24, 2, -0.3, false},
        Shape4{9, 4, 2, 30.0, true}, Shape4{64, 32, 4, 0.17677669529663687, true}}) {
    const int64_t d = c.hd * c.heads;
    const Tensor qkv = uniform({2, c.t, 3 * d}, -2, 2, DType::BF16, 21);
    const std::vector<double> x = qkv.to_vector<double>();
    const std::vector<double> y = F::self_attention(qkv, c.heads, c.scale, c.causal).to_vector<double>();
    const std::string what = "T " + std::to_string(c.t) + " hd " + std::to_string(c.hd) + " heads " +
                             std::to_string(c.heads) + (c.causal ? " causal" : " full");
    int bad = 0;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t i = 0; i < c.t; ++i) {
          auto at = [&](int64_t row, int64_t which, int64_t col) {
            return x[size_t((b * c.t + row) * 3 * d + which * d + h * c.hd + col)];
          };
          const int64_t n = c.causal ? i + 1 : c.t;
          std::vector<double> s(static_cast<size_t>(n));
          double m = -INFINITY, l = 0;
          for (int64_t j = 0; j < n; ++j) {
            double dot = 0;
            for (int64_t e = 0; e < c.hd; ++e) dot += at(i, 0, e) * at(j, 1, e);
            s[size_t(j)] = c.scale * dot;
            m = std::max(m, s[size_t(j)]);
          }
          for (int64_t j = 0; j < n; ++j) l += std::exp(s[size_t(j)] - m);
          for (int64_t e = 0; e < c.hd; ++e) {
            double ref = 0, spread = 0;
            for (int64_t j = 0; j < n; ++j) {
              const double pj = std::exp(s[size_t(j)] - m) / l;
              ref += double(float(BFloat16(float(pj)))) * at(j, 2, e);
              spread += pj * std::abs(at(j, 2, e));
            }
            const double got = y[size_t((b * c.t + i) * d + h * c.hd + e)];
            if (std::abs(got - ref) > std::ldexp(std::abs(ref) + spread, -8) + 1e-6 && bad++ < 5)
              ADD_FAILURE() << what << ": y[" << b << ", " << i << ", head " << h << ", " << e
                            << "] = " << got << ", reference " << ref;
          }
        }
  }
}

// bf16's gradients against the f32 kernels' on the same inputs (bf16 values, f32 dtype): within bf16's
// relative tolerance plus 2^-8 of the largest gradient (the rounded P and dS; the f32 path gives the f32
// results rounded). The scale of 30 makes P and dS hold f32 subnormals, which the bf16 products' packing
// rounds apart (Note [the attention's products in bf16]).
TEST(SelfAttention, Bf16GradientsAgainstTheF32Kernels) {
  for (const Case& c : {Case{2, 40, 16, 2, 30.0, true}, Case{2, 40, 16, 2, 30.0, false},
                        Case{3, 64, 128, 4, 0.17677669529663687, true}, Case{2, 33, 48, 2, -0.3, false},
                        Case{1, 70, 64, 2, 0.2, true}}) {
    const auto [y, dqkv] = run(c, DType::BF16, true);
    Tensor qkv = uniform({c.b, c.t, 3 * c.d}, -2, 2, DType::BF16, 7).to(DType::F32).requires_grad_();
    const Tensor y32 = F::self_attention(qkv, c.heads, c.scale, c.causal);
    y32.backward(uniform(y32.shape(), -1, 1, DType::BF16, 8).to(DType::F32));
    const std::vector<double> g = dqkv.to_vector<double>(), g32 = qkv.grad().to_vector<double>();
    double largest = 0;
    for (double v : g32) largest = std::max(largest, std::abs(v));
    int bad = 0;
    for (size_t i = 0; i < g.size(); ++i)
      if (std::abs(g[i] - g32[i]) > 1.6e-2 * std::abs(g32[i]) + std::ldexp(largest, -8) && bad++ < 5)
        ADD_FAILURE() << name(c) << ": d qkv[" << i << "] = " << g[i] << ", f32 kernels " << g32[i];
  }
}

TEST(SelfAttention, Gradcheck) {
  for (bool causal : {true, false})
    testing::expect_grads_ok(
        [causal](const std::vector<Tensor>& in) { return F::self_attention(in[0], 2, 0.6, causal); },
        {testing::leaf({2, 4, 12}, -1, 1, 9)}, causal ? "self_attention causal" : "self_attention full");
  testing::expect_grads_ok(
      [](const std::vector<Tensor>& in) { return F::self_attention(in[0], 1, 0.4, true); },
      {testing::leaf({1, 5, 6}, -1, 1, 10, testing::Layout::Strided)}, "self_attention strided");
}

TEST(SelfAttention, FutureTokensDoNotChangeEarlierOutputs) {
  Tensor qkv = uniform({1, 6, 24}, -2, 2, DType::F32, 11);
  const auto y1 = F::self_attention(qkv, 2, 0.5, true).to_vector<double>();
  {
    NoGradGuard g;
    qkv.narrow(1, 4, 2).copy_(uniform({1, 2, 24}, -2, 2, DType::F32, 12));
  }
  const auto y2 = F::self_attention(qkv, 2, 0.5, true).to_vector<double>();
  for (size_t i = 0; i < 4 * 8; ++i) EXPECT_EQ(y1[i], y2[i]) << i;
}

// The kernels that keep f16/bf16 probabilities in that dtype (what F::self_attention runs on CUDA) against
// those that keep them in f32: the same y bit for bit, probabilities that are the f32 ones rounded, and
// gradients within the dtype's tolerance.
TEST(SelfAttention, LowPrecisionProbabilities) {
  for (DType t : {DType::BF16, DType::F16})
    for (const Case& c : kCases) {
      const std::string what = name(c) + " " + dtype_name(t);
      const Tensor qkv = uniform({c.b, c.t, 3 * c.d}, -2, 2, t, 7);
      const Tensor dy = uniform({c.b, c.t, c.d}, -1, 1, t, 8);
      std::vector<Tensor> out[2];  // y, probs, dqkv; f32 probs, then t
      for (bool low : {false, true}) {
        SelfAttentionArgs a = args_for(c, c.b);
        const Tensor probs = empty({c.b, c.heads, c.t, c.t}, low ? t : DType::F32);
        const Tensor y = empty({c.b, c.t, c.d}, t), dqkv = empty(qkv.shape(), t);
        const Tensor ws = empty({a.threads, self_attention_workspace(a, t, true, low)});
        a.qkv = qkv.raw_data();
        a.probs = probs.raw_data();
        a.y = y.raw_data();
        a.dy = dy.raw_data();
        a.dqkv = dqkv.raw_data();
        a.workspace = ws.raw_data();
        (low ? op_self_attention_low_probs : op_self_attention).get(kCPU, t)(a);
        (low ? op_self_attention_backward_low_probs : op_self_attention_backward).get(kCPU, t)(a);
        out[low] = {y, probs, dqkv};
      }
      EXPECT_EQ(out[1][0].to_vector<float>(), out[0][0].to_vector<float>()) << what << " y";
      EXPECT_EQ(out[1][1].to_vector<float>(), out[0][1].to(t).to_vector<float>()) << what << " probs";
      const testing::Tol tol = testing::tol_for(t);
      expect_close(out[1][2], out[0][2].to_vector<double>(), {2 * tol.atol, 2 * tol.rtol}, what + " dqkv");
    }
}

// The stats forms (Note [attention keeps row statistics]) against the forms that keep P in the compute
// type, in every dtype: y and d qkv bit for bit (the backward's P is the forward's), with 2 numbers a row
// kept instead of T.
TEST(SelfAttention, RowStatisticsGiveTheProbabilityFormsResultsBitForBit) {
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16})
    for (const Case& c : kCases)
      for (int64_t shift : {0, 3}) {
        // shift: the stats forms' workspace starts this many elements past an aligned address, so their P
        // must be placed by its address (aligned_as), not by its offset in the workspace.
        const int64_t batch = c.b;
        const std::string what = name(c) + " " + dtype_name(t) + " workspace +" + std::to_string(shift);
        const Tensor qkv = uniform({batch, c.t, 3 * c.d}, -2, 2, t, 7);
        const Tensor dy = uniform({batch, c.t, c.d}, -1, 1, t, 8);
        const DType compute = t == DType::F64 ? DType::F64 : DType::F32;
        std::vector<Tensor> out[2];  // y, dqkv: probs, then stats
        for (bool stats : {false, true}) {
          SelfAttentionArgs a = args_for(c, batch);
          const Tensor kept =
              stats ? empty({batch, c.heads, c.t, 2}, compute) : empty({batch, c.heads, c.t, c.t}, compute);
          const Tensor y = empty({batch, c.t, c.d}, t), dqkv = empty(qkv.shape(), t);
          const Tensor ws = empty({a.threads * self_attention_workspace(a, t, true, stats) + shift}, compute);
          a.qkv = qkv.raw_data();
          (stats ? a.stats : a.probs) = kept.raw_data();
          a.y = y.raw_data();
          a.dy = dy.raw_data();
          a.dqkv = dqkv.raw_data();
          a.workspace = static_cast<char*>(ws.raw_data()) + (stats ? shift * dtype_size(compute) : 0);
          (stats ? op_self_attention_stats : op_self_attention).get(kCPU, t)(a);
          (stats ? op_self_attention_backward_stats : op_self_attention_backward).get(kCPU, t)(a);
          out[stats] = {y, dqkv};
        }
        EXPECT_EQ(out[1][0].to_vector<double>(), out[0][0].to_vector<double>()) << what << " y";
        EXPECT_EQ(out[1][1].to_vector<double>(), out[0][1].to_vector<double>()) << what << " dqkv";
      }
  // The op keeps qkv and the statistics on the CPU: 2 numbers a row, in the compute type.
  for (DType t : {DType::BF16, DType::F16, DType::F32, DType::F64}) {
    const Tensor qkv = uniform({2, 8, 24}, -2, 2, t, 9).requires_grad_();
    testing::SavedTensors saved;
    const std::vector<Tensor>& kept = saved.kept;
    F::self_attention(qkv, 2, 0.5, true);
    ASSERT_EQ(kept.size(), 2u) << dtype_name(t);
    EXPECT_EQ(kept[0].dtype(), t);
    EXPECT_EQ(kept[1].dtype(), t == DType::F64 ? DType::F64 : DType::F32) << dtype_name(t);
    EXPECT_EQ(kept[1].shape(), (Shape{2, 2, 8, 2})) << dtype_name(t);
  }
}

TEST(SelfAttention, BadInputs) {
  const Tensor qkv = uniform({2, 3, 12}, -1, 1);
  expect_error<ShapeError>([&] { F::self_attention(qkv, 3, 1.0, true); },
                           {"self_attention", "[2, 3, 12]", "3"});
  expect_error<ShapeError>(
      [&] {
        F::self_attention(qkv.reshape({6, 12}), 2, 1.0, true);
      },
      {"self_attention", "[6, 12]"});
  expect_error<DTypeError>([&] { F::self_attention(qkv.to(DType::I64), 2, 1.0, true); },
                           {"self_attention", "floating", "i64"});
  expect_error<Error>([&] { F::self_attention(qkv, 0, 1.0, true); }, {"self_attention", "n_heads"});
}

}  // namespace
}  // namespace frugal
