// The layer-norm-then-linear op (frugal::layer_norm_linear, behind F::layer_norm_linear: the transformer
// block's norms before their Linears and nn::GPT's head) against the layers it replaces,
// F::linear(F::layer_norm(x)): outputs and gradients bit for bit in f32, bf16 and f64, with and without the
// norm's affine parameters and the Linear's bias, leading dims, transposed views of x and the weight, some
// gradients not needed; finite differences in f64; what it keeps (x, not the norm's output); the layers
// themselves under autocast; bad inputs.
#include <any>
#include <sstream>

#include "amp/autocast.h"
#include "tests/autograd/gradcheck_helpers.h"

namespace frugal {
namespace {

namespace F = nn::functional;
using testing::expect_error;
using testing::uniform;

struct Case {
  Shape x;
  int64_t out;
  bool affine, bias;
  bool transposed_x = false, transposed_w = false;  // x [M, d] or the weight as transposed views
};
const Case kCases[] = {{{5, 7}, 3, true, true},
                       {{5, 7}, 3, false, false},
                       {{2, 3, 16}, 6, true, false},
                       {{300, 64}, 96, true, true},
                       {{1, 9}, 1, false, true},
                       {{2048, 128}, 384, true, true},
                       {{6, 5}, 4, true, true, true, false},
                       {{6, 5}, 4, true, false, false, true}};

// y and the gradients of x, the norm's weight and bias, the Linear's weight and bias (those defined).
std::vector<Tensor> run(const Case& c, DType t, bool fused) {
  const int64_t d = c.x.back();
  Tensor x = c.transposed_x ? uniform({c.x[1], c.x[0]}, -2, 2, t, 1).t() : uniform(c.x, -2, 2, t, 1);
  x = x.detach().requires_grad_();
  Tensor lw = c.affine ? uniform({d}, 0.5, 1.5, t, 2).requires_grad_() : Tensor();
  Tensor lb = c.affine ? uniform({d}, -0.5, 0.5, t, 3).requires_grad_() : Tensor();
  Tensor w = c.transposed_w ? uniform({d, c.out}, -1, 1, t, 4).t() : uniform({c.out, d}, -1, 1, t, 4);
  w = w.detach().requires_grad_();
  Tensor b = c.bias ? uniform({c.out}, -1, 1, t, 5).requires_grad_() : Tensor();
  const Tensor y = fused ? F::layer_norm_linear(x, {d}, lw, lb, 1e-5, w, b)
                         : F::linear(F::layer_norm(x, {d}, lw, lb, 1e-5), w, b);
  y.backward(uniform(y.shape(), -1, 1, t, 6));
  std::vector<Tensor> out = {y.detach(), x.grad(), w.grad()};
  for (const Tensor& p : {lw, lb, b})
    if (p.defined()) out.push_back(p.grad());
  return out;
}

TEST(LayerNormLinear, IsLinearOfLayerNormBitForBit) {
  for (DType t : {DType::F32, DType::BF16, DType::F64})
    for (const Case& c : kCases) {
      const auto got = run(c, t, true), ref = run(c, t, false);
      ASSERT_EQ(got.size(), ref.size());
      for (size_t i = 0; i < got.size(); ++i) {
        std::ostringstream what_s;
        what_s << c.x << (c.transposed_x ? " x^T view" : "") << (c.transposed_w ? " w^T view" : "") << " "
               << dtype_name(t) << " output " << i;
        const std::string what = what_s.str();
        ASSERT_TRUE(got[i].defined()) << what;
        EXPECT_EQ(got[i].dtype(), t) << what;
        EXPECT_EQ(got[i].to_vector<double>(), ref[i].to_vector<double>()) << what;
      }
    }
}

TEST(LayerNormLinear, OnlySomeGradients) {
  for (int need = 1; need < 32; ++need) {
    std::vector<Tensor> in = {uniform({6, 8}, -2, 2, DType::F32, 1), uniform({8}, 0.5, 1.5, DType::F32, 2),
                              uniform({8}, -1, 1, DType::F32, 3), uniform({5, 8}, -1, 1, DType::F32, 4),
                              uniform({5}, -1, 1, DType::F32, 5)};
    std::vector<Tensor> in2;
    for (size_t i = 0; i < in.size(); ++i) {
      in2.push_back(in[i].detach().clone());
      if (need & (1 << i)) {
        in[i].requires_grad_();
        in2[i].requires_grad_();
      }
    }
    F::layer_norm_linear(in[0], {8}, in[1], in[2], 1e-5, in[3], in[4]).sum().backward();
    F::linear(F::layer_norm(in2[0], {8}, in2[1], in2[2], 1e-5), in2[3], in2[4]).sum().backward();
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_EQ(in[i].grad().defined(), bool(need & (1 << i))) << need << " " << i;
      if (in[i].grad().defined()) {
        EXPECT_EQ(in[i].grad().to_vector<float>(), in2[i].grad().to_vector<float>()) << need << " " << i;
      }
    }
  }
}

TEST(LayerNormLinear, Gradcheck) {
  testing::expect_grads_ok(
      [](const std::vector<Tensor>& in) {
        return F::layer_norm_linear(in[0], {5}, in[1], in[2], 1e-5, in[3], in[4]);
      },
      {testing::leaf({4, 5}, -2, 2, 5), testing::leaf({5}, 0.5, 1.5, 6), testing::leaf({5}, -1, 1, 7),
       testing::leaf({3, 5}, -1, 1, 8), testing::leaf({3}, -1, 1, 9)},
      "layer_norm_linear");
  testing::expect_grads_ok(
      [](const std::vector<Tensor>& in) { return F::layer_norm_linear(in[0], {4}, {}, {}, 1e-5, in[1]); },
      {testing::leaf({2, 3, 4}, -2, 2, 10), testing::leaf({2, 4}, -1, 1, 11)}, "layer_norm_linear 3-d plain");
}

// It keeps x (and the parameters), not the norm's output; under autocast it runs the two layers.
TEST(LayerNormLinear, KeepsTheNormsInputOnly) {
  const Tensor x = uniform({16, 32}, -2, 2).requires_grad_(), lw = uniform({32}, 0.5, 1.5).requires_grad_(),
               w = uniform({8, 32}, -1, 1).requires_grad_();
  testing::SavedTensors saved;
  const std::vector<Tensor>& kept = saved.kept;
  const Tensor y = F::layer_norm_linear(x, {32}, lw, {}, 1e-5, w);
  EXPECT_EQ(y.grad_fn_name(), std::string("layer_norm_linear"));
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0].raw_data(), x.raw_data()) << "x itself, not the norm's output";
  EXPECT_EQ(kept[1].raw_data(), lw.raw_data());
  EXPECT_EQ(kept[2].raw_data(), w.raw_data());
  amp::Autocast autocast(DType::BF16);
  EXPECT_EQ(F::layer_norm_linear(x, {32}, lw, {}, 1e-5, w).grad_fn_name(), std::string("linear"));
}

TEST(LayerNormLinear, BadInputsGetTheLayersErrors) {
  const Tensor x = uniform({4, 3}, -1, 1), w = uniform({2, 3}, -1, 1);
  expect_error<ShapeError>([&] { F::layer_norm_linear(x, {3}, uniform({4}, 1, 2), {}, 1e-5, w); },
                           {"layer_norm", "weight", "[4]"});
  expect_error<ShapeError>(
      [&] {
        F::layer_norm_linear(x, {3}, {}, {}, 1e-5, uniform({2, 4}, -1, 1));
      },
      {"linear", "[4, 3]", "[2, 4]"});
  expect_error<ShapeError>([&] { F::layer_norm_linear(x, {4}, {}, {}, 1e-5, w); },
                           {"layer_norm", "[4, 3]", "[4]"});
  expect_error<DTypeError>([&] { F::layer_norm_linear(x.to(DType::I64), {3}, {}, {}, 1e-5, w); }, {"i64"});
}

}  // namespace
}  // namespace frugal
