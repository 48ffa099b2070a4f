// A representative set of differentiable ops run in f16 and bf16: outputs and gradients against the same ops
// in f32 on the same (rounded) values, at the 16-bit type's tolerance. Each op keeps its inputs' dtype, and
// so does each gradient.
#include "nn/attention.h"
#include "nn/functional.h"
#include "tests/autograd/gradcheck_helpers.h"

namespace frugal {
namespace {

namespace F = nn::functional;
using testing::expect_close;
using testing::GradFn;
using testing::uniform;

struct Case {
  std::string name;
  GradFn fn;
  std::vector<Tensor>
      inputs;        // f32 values; floating ones get gradients, integer ones (indices) stay as they are
  double scale = 1;  // of the dtype's tolerance, for ops that round several intermediate results
};

Tensor input(const Shape& shape, double lo = -1, double hi = 1, uint64_t seed = 1) {
  return uniform(shape, lo, hi, DType::F32, seed);
}
Tensor indices(const std::vector<int64_t>& v) { return tensor<int64_t>(v); }

// Runs y = fn(inputs) and sum(y * w) backward (w random, rounded to `round_to`); returns y and the gradients.
std::vector<Tensor> run(const Case& c, DType t, DType round_to) {
  std::vector<Tensor> in;
  for (const Tensor& x : c.inputs) {
    if (!is_floating(x.dtype())) {
      in.push_back(x);
      continue;
    }
    // Round to the 16-bit type first, so both runs see the same values.
    Tensor v = x.to(round_to).to(t).detach();
    v.requires_grad_();
    in.push_back(v);
  }
  const Tensor y = c.fn(in);
  const Tensor w = uniform(y.shape(), -1, 1, round_to, 99).to(y.dtype());
  sum(mul(y, w)).backward();
  std::vector<Tensor> out = {y.detach()};
  for (const Tensor& x : in)
    if (is_floating(x.dtype())) out.push_back(x.grad());
  return out;
}

void expect_matches_f32(const Case& c, DType t) {
  const std::vector<Tensor> low = run(c, t, t), ref = run(c, DType::F32, t);
  const testing::Tol tol = testing::tol_for(t);
  const testing::Tol scaled = {tol.atol * c.scale, tol.rtol * c.scale};
  for (size_t i = 0; i < low.size(); ++i) {
    const std::string what =
        c.name + " " + dtype_name(t) + (i == 0 ? " output" : " gradient " + std::to_string(i));
    ASSERT_TRUE(low[i].defined()) << what;
    EXPECT_EQ(low[i].dtype(), t) << what;
    EXPECT_EQ(low[i].shape(), ref[i].shape()) << what;
    expect_close(low[i], ref[i].to_vector<double>(), scaled, what);
  }
}

std::vector<Case> cases() {
  using V = std::vector<Tensor>;
  return {
      {"add (broadcast)",
       [](const V& v) { return v[0] + v[1]; },
       {input({4, 5}, -1, 1, 1), input({5}, -1, 1, 2)}},
      {"mul", [](const V& v) { return v[0] * v[1]; }, {input({4, 5}, -1, 1, 3), input({4, 5}, -1, 1, 4)}},
      {"div", [](const V& v) { return v[0] / v[1]; }, {input({4, 5}, -1, 1, 5), input({4, 5}, 0.5, 2, 6)}},
      {"exp", [](const V& v) { return exp(v[0]); }, {input({3, 7}, -2, 2, 7)}},
      {"log", [](const V& v) { return log(v[0]); }, {input({3, 7}, 0.5, 4, 8)}},
      {"sqrt", [](const V& v) { return sqrt(v[0]); }, {input({3, 7}, 0.5, 4, 9)}},
      {"tanh", [](const V& v) { return tanh(v[0]); }, {input({3, 7}, -2, 2, 10)}},
      {"sigmoid", [](const V& v) { return sigmoid(v[0]); }, {input({3, 7}, -3, 3, 11)}},
      {"gelu", [](const V& v) { return gelu(v[0]); }, {input({3, 7}, -3, 3, 12)}, 2},
      {"silu", [](const V& v) { return silu(v[0]); }, {input({3, 7}, -3, 3, 13)}, 2},
      {"pow 2", [](const V& v) { return pow(v[0], 2.0); }, {input({3, 7}, -2, 2, 14)}},
      {"sum over a dim", [](const V& v) { return sum(v[0], {1}); }, {input({4, 6, 3}, -1, 1, 15)}, 2},
      {"mean",
       [](const V& v) {
         return mean(v[0], {0, 2});
       },
       {input({4, 6, 3}, -1, 1, 16)}},
      {"var", [](const V& v) { return var(v[0], {1}); }, {input({4, 9}, -1, 1, 17)}, 2},
      {"max over a dim", [](const V& v) { return max(v[0], {1}); }, {input({4, 9}, -1, 1, 18)}},
      {"matmul (batched)",
       [](const V& v) { return matmul(v[0], v[1]); },
       {input({3, 8, 16}, -1, 1, 19), input({16, 5}, -1, 1, 20)},
       4},
      {"linear",
       [](const V& v) { return F::linear(v[0], v[1], v[2]); },
       {input({6, 12}, -1, 1, 21), input({4, 12}, -1, 1, 22), input({4}, -1, 1, 23)},
       4},
      {"softmax", [](const V& v) { return softmax(v[0], -1); }, {input({5, 9}, -3, 3, 24)}},
      {"log_softmax", [](const V& v) { return log_softmax(v[0], 0); }, {input({5, 9}, -3, 3, 25)}, 2},
      {"log_softmax (last dim)",
       [](const V& v) { return log_softmax(v[0], -1); },
       {input({5, 9}, -3, 3, 40)},
       2},
      {"cross_entropy",
       [](const V& v) { return F::cross_entropy(v[0], v[1]); },
       {input({6, 10}, -3, 3, 26), indices({0, 9, 3, 3, 7, 1})}},
      {"layer_norm",
       [](const V& v) { return F::layer_norm(v[0], {16}, v[1], v[2]); },
       {input({4, 16}, -2, 2, 27), input({16}, 0.5, 1.5, 28), input({16}, -0.5, 0.5, 29)},
       4},
      {"embedding",
       [](const V& v) { return F::embedding(v[1], v[0]); },
       {input({10, 8}, -1, 1, 30), indices({1, 4, 4, 9, 0})}},
      {"gather",
       [](const V& v) { return gather(v[0], 1, v[1]); },
       {input({2, 5}, -1, 1, 31), indices({0, 4, 4, 1, 2, 2}).reshape({2, 3})}},
      {"conv2d",
       [](const V& v) { return conv2d(v[0], v[1], v[2], 1, 1); },
       {input({2, 3, 8, 8}, -1, 1, 32), input({4, 3, 3, 3}, -1, 1, 33), input({4}, -1, 1, 34)},
       4},
      {"max_pool2d", [](const V& v) { return max_pool2d(v[0], 3, 2, 1); }, {input({2, 3, 9, 9}, -1, 1, 35)}},
      {"avg_pool2d", [](const V& v) { return avg_pool2d(v[0], 3, 2, 1); }, {input({2, 3, 9, 9}, -1, 1, 36)}},
      {"attention_scores_softmax",
       [](const V& v) { return F::attention_scores_softmax(v[0], 0.25, true); },
       {input({2, 6, 6}, -3, 3, 37)}},
      {"mse_loss",
       [](const V& v) { return F::mse_loss(v[0], v[1]); },
       {input({4, 5}, -1, 1, 38), input({4, 5}, -1, 1, 39)}},
  };
}

TEST(LowPrecision, OpsMatchF32InF16) {
  for (const Case& c : cases()) expect_matches_f32(c, DType::F16);
}

TEST(LowPrecision, OpsMatchF32InBf16) {
  for (const Case& c : cases()) expect_matches_f32(c, DType::BF16);
}

// matmul of a batch [B, M, K] by a matrix [K, N]: the matrix's gradient sums over the batch and the rows in
// one accumulation, rounded to bf16 once. Here batch 0's products are 256 + 1 and batch 1's -256: 1 exactly,
// where rounding each batch's sum first (257 to 256 in bf16) gave 0.
// An index repeated 300 times, each with gradient 1: the row's gradient is 300 in bf16 and f16 (Note [16-bit
// index gradients]), where adding in bf16 stopped at 256.
TEST(LowPrecision, IndexGradientsAccumulateOnceForARepeatedIndex) {
  const Tensor index = zeros({300}, DType::I64);
  for (DType t : {DType::BF16, DType::F16}) {
    const Tensor w = zeros({2, 3}, t).requires_grad_();
    F::embedding(index, w).backward(ones({300, 3}, t));
    EXPECT_EQ(w.grad().dtype(), t);
    EXPECT_EQ(w.grad().to(DType::F32).to_vector<float>(), std::vector<float>({300, 300, 300, 0, 0, 0}))
        << dtype_name(t);
    const Tensor x = zeros({2}, t).requires_grad_();
    gather(x, 0, index).backward(ones({300}, t));
    EXPECT_EQ(x.grad().to(DType::F32).to_vector<float>(), std::vector<float>({300, 0})) << dtype_name(t);
  }
}

TEST(LowPrecision, MatmulOfABatchByAMatrixRoundsTheMatrixGradientOnce) {
  const Tensor a = ones({2, 2, 1}, DType::BF16);
  const Tensor b = ones({1, 1}, DType::BF16).requires_grad_();
  matmul(a, b).backward(tensor<float>({256, 1, -256, 0}, {2, 2, 1}).to(DType::BF16));
  EXPECT_EQ(b.grad().dtype(), DType::BF16);
  EXPECT_EQ(b.grad().to(DType::F32).item<float>(), 1.0f);
}

}  // namespace
}  // namespace frugal
