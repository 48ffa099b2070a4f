// The layer-norm-then-linear op (frugal::layer_norm_linear, behind F::layer_norm_linear: the transformer
// block's norms before their Linears and nn::GPT's head) against the layers it replaces,
// F::linear(F::layer_norm(x)): outputs and gradients bit for bit in f32, bf16 and f64, with and without the
// norm's affine parameters and the Linear's bias, leading dims, transposed views of x and the weight, some
// gradients not needed; finite differences in f64; what it keeps (x, not the norm's output); bad inputs.
// Under autocast, its rounded form (Note [layer norm before a Linear under autocast],
// autograd/grad_linear.cpp): the kernels (ops::layer_norm_rounded, ops::layer_norm_affine) against a plain
// loop and the x-hat form bit for bit; the op against the ops it runs, bit for bit, and against the two
// layers to the low dtype's rounding; what it keeps (one tensor of x's numel less than the layers); finite
// differences in f64; some gradients not needed; a GPT's selective recompute segments; bad inputs.
#include <any>
#include <cmath>
#include <sstream>

#include "amp/autocast.h"
#include "nn/gpt.h"
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

// It keeps x (and the parameters), not the norm's output.
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

// ---- under autocast: the rounded form ----

// a b + c as the CPU kernels compute it (kernels/cpu/norm.cpp's mul_add).
template <typename C>
C mul_add_as_the_kernels(C a, C b, C c) {
#if defined(__FMA__)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// The affine map of the rounded x-hat (s of dtype S, read into the compute type C), rounded to S: a plain
// loop.
template <typename C>
Tensor affine_plain(const Tensor& xhat, const Tensor& w, const Tensor& b) {
  const std::vector<double> xs = xhat.to_vector<double>();
  const std::vector<double> ws = w.defined() ? w.to_vector<double>() : std::vector<double>();
  const std::vector<double> bs = b.defined() ? b.to_vector<double>() : std::vector<double>();
  const int64_t cols = xhat.size(-1);
  std::vector<double> out(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    const size_t j = size_t(int64_t(i) % cols);
    const C xh = C(xs[i]);
    C v = xh;
    if (w.defined() && b.defined())
      v = mul_add_as_the_kernels(xh, C(ws[j]), C(bs[j]));
    else if (w.defined())
      v = xh * C(ws[j]);
    else if (b.defined())
      v = xh + C(bs[j]);
    out[i] = double(v);
  }
  // v is exact in f64, so rounding it from f64 to S is rounding it from C.
  return tensor(out, xhat.shape()).to(xhat.dtype());
}

// A dtype's relative rounding, f64 counted as f32 (the compute type of the rounded forms but for f64 x).
double looser_rtol(DType t) { return testing::tol_for(t == DType::F64 ? DType::F32 : t).rtol; }

TEST(LayerNormRounded, KernelsAreTheXhatFormsAndThePlainAffineBitForBit) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16})
    for (DType s : {DType::F32, DType::F64, DType::F16, DType::BF16})
      for (int64_t cols : {1, 37, 130, 600})  // 600: runs of 256, 256 and 88 (Note [16-bit x-hat in runs])
        for (int affine = 0; affine < 4; ++affine) {
          const std::string what = std::string(dtype_name(t)) + " x-hat " + dtype_name(s) + " cols " +
                                   std::to_string(cols) + " affine " + std::to_string(affine);
          const Tensor x = uniform({3, 5, cols}, -2, 3, t, 21);
          const DType c = t == DType::F64 ? DType::F64 : DType::F32;
          const Tensor w = affine & 1 ? uniform({cols}, 0.5, 1.5, c, 22) : Tensor();
          const Tensor b = affine & 2 ? uniform({cols}, -1, 1, c, 23) : Tensor();
          const ops::LayerNormResult r = ops::layer_norm_rounded(x, {cols}, w, b, 1e-5, s);
          const ops::LayerNormResult ref = ops::layer_norm(x, {cols}, w, b, 1e-5, s);
          ASSERT_EQ(r.y.dtype(), s) << what;
          ASSERT_EQ(r.y.shape(), x.shape()) << what;
          EXPECT_EQ(r.xhat.to_vector<double>(), ref.xhat.to_vector<double>()) << what;
          // Both the x-hat of the compute type, rounded to S.
          const Tensor wide = ops::layer_norm(x, {cols}, w, b, 1e-5, c).xhat;
          EXPECT_EQ(r.xhat.to_vector<double>(), wide.to(s).to_vector<double>()) << what;
          EXPECT_EQ(r.mean.to_vector<double>(), ref.mean.to_vector<double>()) << what;
          EXPECT_EQ(r.rstd.to_vector<double>(), ref.rstd.to_vector<double>()) << what;
          const Tensor plain =
              c == DType::F64 ? affine_plain<double>(r.xhat, w, b) : affine_plain<float>(r.xhat, w, b);
          EXPECT_EQ(r.y.to_vector<double>(), plain.to_vector<double>()) << what;
          EXPECT_EQ(ops::layer_norm_affine(r.xhat, t, w, b).to_vector<double>(), r.y.to_vector<double>())
              << what;
          // Near the unrounded norm (of T): one rounding to S more.
          const double tol = std::max(looser_rtol(t), looser_rtol(s));
          testing::expect_close(r.y, ref.y.to_vector<double>(), {2 * tol, 2 * tol}, what + " near the norm");
        }
}

// Rows whose x-hat and y hold f32 subnormals (which bf16 keeps, and the vectorised f32 -> bf16 conversion
// would flush; Note [the rounded row in registers]): still the x-hat form's x-hat and the plain affine map.
TEST(LayerNormRounded, SubnormalXhatValuesRoundAsTheScalarConversion) {
  const int64_t cols = 48;  // three blocks of 16
  std::vector<float> xs;
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t j = 0; j < cols; ++j)
      // +-1 and zeros, with one subnormal: the mean is about 1e-41, so every zero's x-hat is subnormal.
      xs.push_back(j == 20 + r ? 1e-39f : j % 3 == 0 ? 0.0f : (j % 3 == 1 ? 1.0f : -1.0f));
  const Tensor x = tensor(xs, Shape({2, cols}));
  for (int affine = 0; affine < 4; ++affine) {
    const Tensor w = affine & 1 ? ones({cols}) : Tensor();
    const Tensor b = affine & 2 ? zeros({cols}) : Tensor();
    const ops::LayerNormResult r = ops::layer_norm_rounded(x, {cols}, w, b, 1e-5, DType::BF16);
    const ops::LayerNormResult ref = ops::layer_norm(x, {cols}, w, b, 1e-5, DType::BF16);
    const std::vector<double> xh = r.xhat.to_vector<double>();
    EXPECT_TRUE(std::any_of(xh.begin(), xh.end(), [](double v) {
      return v != 0 && std::fabs(v) < double(std::numeric_limits<float>::min());
    })) << "the x-hat holds no subnormal";
    EXPECT_EQ(xh, ref.xhat.to_vector<double>()) << affine;
    EXPECT_EQ(r.y.to_vector<double>(), affine_plain<float>(r.xhat, w, b).to_vector<double>()) << affine;
  }
}

// Under autocast (dtype low), with the Linear's input x [rows, d]: the op's result and gradients, and those
// of the ops it runs called one by one (the Linear on layer_norm_rounded's y, then the x-hat backward).
struct RoundedRun {
  std::vector<Tensor> fused, by_hand;
};
// flags: 1 the norm's weight, 2 its bias, 4 the Linear's bias, 8 x a transposed view (2-D x only).
RoundedRun run_rounded(DType low, const Shape& xs, int flags) {
  const bool has_lw = flags & 1, has_lb = flags & 2, bias = flags & 4, transposed = flags & 8;
  const int64_t d = xs.back(), out = 24;
  const Tensor x =
      (transposed ? uniform({xs[1], xs[0]}, -2, 3, DType::F32, 31).t() : uniform(xs, -2, 3, DType::F32, 31))
          .detach()
          .requires_grad_();
  if (xs[0] > 1 && d > 1) {
    EXPECT_EQ(x.is_contiguous(), !transposed);
  }
  const Tensor lw = has_lw ? uniform({d}, 0.5, 1.5, DType::F32, 32).requires_grad_() : Tensor();
  const Tensor lb = has_lb ? uniform({d}, -0.5, 0.5, DType::F32, 33).requires_grad_() : Tensor();
  const Tensor w = uniform({out, d}, -1, 1, DType::F32, 34).requires_grad_();
  const Tensor b = bias ? uniform({out}, -1, 1, DType::F32, 35).requires_grad_() : Tensor();
  Shape ys = xs;
  ys[ys.size() - 1] = out;
  const Tensor dy = uniform(ys, -1, 1, low, 36);
  Tensor y;
  {
    amp::Autocast guard(low);
    y = F::layer_norm_linear(x, {d}, lw, lb, 1e-5, w, b);
  }
  EXPECT_EQ(y.grad_fn_name(), std::string(xs.size() == 2 ? "layer_norm_linear" : "reshape"));
  y.backward(dy);
  RoundedRun r;
  r.fused = {y.detach(), x.grad(), w.grad()};
  for (const Tensor& p : {lw, lb, b})
    if (p.defined()) r.fused.push_back(p.grad());
  // By hand.
  const ops::LayerNormResult n = ops::layer_norm_rounded(x.detach(), {d}, lw.defined() ? lw.detach() : lw,
                                                         lb.defined() ? lb.detach() : lb, 1e-5, low);
  const Tensor yl = n.y.detach().requires_grad_(), wl = w.detach().to(low).requires_grad_();
  const Tensor bl = bias ? b.detach().to(low).requires_grad_() : Tensor();
  const Tensor y2 = F::linear(yl, wl, bl);
  y2.backward(dy);
  const ops::LayerNormGrads g = ops::layer_norm_backward_xhat(
      yl.grad(), n.xhat, DType::F32, {d}, lw.defined() ? lw.detach() : lw, n.rstd, true, has_lw, has_lb);
  r.by_hand = {y2.detach(), g.dx, wl.grad().to(DType::F32)};
  if (has_lw) r.by_hand.push_back(g.dweight);
  if (has_lb) r.by_hand.push_back(g.dbias);
  if (bias) r.by_hand.push_back(bl.grad().to(DType::F32));
  return r;
}

TEST(LayerNormRounded, UnderAutocastIsTheOpsItRunsBitForBit) {
  for (DType low : {DType::BF16, DType::F16})
    for (const Shape& xs : {Shape{16, 32}, Shape{2, 5, 8}, Shape{1, 1}, Shape{300, 64}})
      for (int flags = 0; flags < (xs.size() == 2 ? 16 : 8); ++flags) {
        std::ostringstream what_s;
        what_s << dtype_name(low) << " " << xs << " flags " << flags;
        const std::string what = what_s.str();
        const RoundedRun r = run_rounded(low, xs, flags);
        ASSERT_EQ(r.fused.size(), r.by_hand.size()) << what;
        EXPECT_EQ(r.fused[0].dtype(), low) << what;
        for (size_t i = 0; i < r.fused.size(); ++i) {
          ASSERT_TRUE(r.fused[i].defined()) << what << " " << i;
          EXPECT_EQ(r.fused[i].dtype(), r.by_hand[i].dtype()) << what << " " << i;
          EXPECT_EQ(r.fused[i].to_vector<double>(), r.by_hand[i].to_vector<double>()) << what << " " << i;
        }
      }
}

TEST(LayerNormRounded, UnderAutocastIsNearTheTwoLayers) {
  for (DType low : {DType::BF16, DType::F16}) {
    auto run = [&](bool fused) {
      const Tensor x = uniform({64, 48}, -2, 3, DType::F32, 41).requires_grad_();
      const Tensor lw = uniform({48}, 0.5, 1.5, DType::F32, 42).requires_grad_();
      const Tensor lb = uniform({48}, -0.5, 0.5, DType::F32, 43).requires_grad_();
      const Tensor w = uniform({40, 48}, -0.3, 0.3, DType::F32, 44).requires_grad_();
      const Tensor b = uniform({40}, -1, 1, DType::F32, 45).requires_grad_();
      Tensor y;
      {
        amp::Autocast guard(low);
        y = fused ? F::layer_norm_linear(x, {48}, lw, lb, 1e-5, w, b)
                  : F::linear(F::layer_norm(x, {48}, lw, lb, 1e-5), w, b);
      }
      EXPECT_EQ(y.grad_fn_name(), std::string(fused ? "layer_norm_linear" : "linear"));
      y.backward(uniform({64, 40}, -1, 1, low, 46));
      return std::vector<Tensor>{y.detach(), x.grad(), lw.grad(), lb.grad(), w.grad(), b.grad()};
    };
    const auto got = run(true), ref = run(false);
    for (size_t i = 0; i < got.size(); ++i) {
      const std::string what = std::string(dtype_name(low)) + " output " + std::to_string(i);
      const std::vector<double> r = ref[i].to_vector<double>();
      if (i == 0 || i == 4) {
        // y and d weight, from the Linear's input: to the low dtype's rounding, each value against the
        // largest of its tensor (sums of products rounded to the low dtype), and not the same.
        double largest = 0;
        for (double v : r) largest = std::max(largest, std::fabs(v));
        testing::expect_close(got[i], r, {4 * testing::tol_for(low).rtol * largest, 0}, what);
        EXPECT_NE(got[i].to_vector<double>(), r) << what << ": the forms round differently";
      } else {
        // d x, d of the norm's parameters and d bias: the same x-hat and d x-hat in both, so bit for bit.
        EXPECT_EQ(got[i].to_vector<double>(), r) << what;
      }
    }
  }
}

// It keeps x-hat in the low dtype and rstd (and the parameters), not x and not the Linear's cast input: one
// tensor of x's numel in the low dtype less than the two layers keep.
TEST(LayerNormRounded, UnderAutocastKeepsXhatOnly) {
  const Tensor x = uniform({16, 32}, -2, 2).requires_grad_(), lw = uniform({32}, 0.5, 1.5).requires_grad_(),
               lb = uniform({32}, -1, 1).requires_grad_(), w = uniform({8, 32}, -1, 1).requires_grad_();
  for (DType low : {DType::BF16, DType::F16}) {
    auto kept_by = [&](bool fused) {
      testing::SavedTensors saved;
      amp::Autocast guard(low);
      const Tensor y = fused ? F::layer_norm_linear(x, {32}, lw, lb, 1e-5, w)
                             : F::linear(F::layer_norm(x, {32}, lw, lb, 1e-5), w);
      return saved.kept;
    };
    const std::vector<Tensor> kept = kept_by(true);
    ASSERT_EQ(kept.size(), 5u);
    EXPECT_EQ(kept[0].dtype(), low);
    EXPECT_EQ(kept[0].shape(), x.shape()) << "x-hat";
    EXPECT_EQ(kept[1].dtype(), DType::F32);
    EXPECT_EQ(kept[1].numel(), 16) << "rstd";
    EXPECT_EQ(kept[2].raw_data(), lw.raw_data());
    EXPECT_EQ(kept[3].raw_data(), lb.raw_data());
    EXPECT_EQ(kept[4].dtype(), low) << "the Linear's weight as cast";
    // What they keep but the norm's parameters (the op keeps its bias too, to make y again).
    auto bytes = [&](const std::vector<Tensor>& ts) {
      int64_t n = 0;
      for (const Tensor& t : ts)
        if (t.raw_data() != lw.raw_data() && t.raw_data() != lb.raw_data()) n += t.nbytes();
      return n;
    };
    EXPECT_EQ(bytes(kept_by(false)) - bytes(kept), x.numel() * 2) << dtype_name(low);
  }
}

TEST(LayerNormRounded, GradcheckF64) {
  // Rounded to f64, x-hat is x-hat: the op is the norm and the Linear, and its gradients theirs.
  testing::expect_grads_ok(
      [](const std::vector<Tensor>& in) {
        return layer_norm_linear(in[0], in[1], in[2], 1e-5, in[3], in[4], DType::F64);
      },
      {testing::leaf({4, 5}, -2, 2, 51), testing::leaf({5}, 0.5, 1.5, 52), testing::leaf({5}, -1, 1, 53),
       testing::leaf({3, 5}, -1, 1, 54), testing::leaf({3}, -1, 1, 55)},
      "layer_norm_linear rounded to f64");
  testing::expect_grads_ok(
      [](const std::vector<Tensor>& in) {
        return layer_norm_linear(in[0], {}, {}, 1e-5, in[1], {}, DType::F64);
      },
      {testing::leaf({6, 4}, -2, 2, 56), testing::leaf({2, 4}, -1, 1, 57)},
      "layer_norm_linear rounded plain");
}

// Each subset of gradients: those asked for, equal bit for bit to the two layers' (the Linear's weight: to
// its own when all are asked for; its input differs between the forms).
TEST(LayerNormRounded, OnlySomeGradientsUnderAutocast) {
  auto grads = [](int need, bool fused) {
    std::vector<Tensor> in = {uniform({6, 8}, -2, 2, DType::F32, 1), uniform({8}, 0.5, 1.5, DType::F32, 2),
                              uniform({8}, -1, 1, DType::F32, 3), uniform({5, 8}, -1, 1, DType::F32, 4),
                              uniform({5}, -1, 1, DType::F32, 5)};
    for (size_t i = 0; i < in.size(); ++i)
      if (need & (1 << i)) in[i].requires_grad_();
    Tensor y;
    {
      amp::Autocast guard(DType::BF16);
      y = fused ? F::layer_norm_linear(in[0], {8}, in[1], in[2], 1e-5, in[3], in[4])
                : F::linear(F::layer_norm(in[0], {8}, in[1], in[2], 1e-5), in[3], in[4]);
    }
    sum(y).backward();
    std::vector<Tensor> g;
    for (const Tensor& t : in) g.push_back(t.grad());
    return g;
  };
  const Tensor all_dw = grads(31, true)[3];
  for (int need = 1; need < 32; ++need) {
    const std::vector<Tensor> g = grads(need, true), ref = grads(need, false);
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_EQ(g[i].defined(), bool(need & (1 << i))) << need << " " << i;
      if (g[i].defined()) {
        EXPECT_EQ(g[i].to_vector<float>(), (i == 3 ? all_dw : ref[i]).to_vector<float>()) << need << " " << i;
      }
    }
  }
}

// A small GPT under autocast: whole and selective recompute segments (keeping layer_norm_linear's results,
// its x-hat and rstd with them) give the plain run's gradients bit for bit.
TEST(LayerNormRounded, GptRecomputeSegmentsBitIdenticalUnderAutocast) {
  auto grads = [](int64_t whole, int64_t selective) {
    manual_seed(3);
    nn::GPT gpt(nn::GPTConfig{.vocab = 13, .d_model = 32, .n_layers = 3, .n_heads = 2, .context = 16});
    gpt->recompute_blocks(whole, selective);
    Generator g(4);
    const Tensor tokens = randint(0, 13, {4, 16}, DType::I64, &g);
    Tensor loss;
    {
      amp::Autocast guard(DType::BF16);
      loss = F::cross_entropy(gpt->forward(tokens).view({-1, 13}), tokens.view({-1}));
    }
    loss.backward();
    std::vector<std::vector<float>> out{loss.to_vector<float>()};
    for (const Tensor& p : gpt->parameters()) out.push_back(p.grad().to_vector<float>());
    return out;
  };
  const auto plain = grads(0, 0);
  EXPECT_EQ(grads(3, 0), plain);
  EXPECT_EQ(grads(0, 3), plain);
  EXPECT_EQ(grads(1, 2), plain);
}

// Non-contiguous inputs of the two kernels' ops (x, and x-hat, as transposed views of the same values): the
// results of their contiguous copies, bit for bit.
TEST(LayerNormRounded, NonContiguousInputs) {
  const Tensor x = uniform({12, 20}, -2, 3, DType::F32, 71), w = uniform({20}, 0.5, 1.5, DType::F32, 72),
               b = uniform({20}, -1, 1, DType::F32, 73);
  const Tensor xt = x.t().contiguous().t();
  ASSERT_FALSE(xt.is_contiguous());
  for (DType low : {DType::BF16, DType::F16}) {
    const ops::LayerNormResult r = ops::layer_norm_rounded(x, {20}, w, b, 1e-5, low);
    const ops::LayerNormResult rt = ops::layer_norm_rounded(xt, {20}, w, b, 1e-5, low);
    EXPECT_EQ(rt.y.to_vector<double>(), r.y.to_vector<double>()) << dtype_name(low);
    EXPECT_EQ(rt.xhat.to_vector<double>(), r.xhat.to_vector<double>()) << dtype_name(low);
    const Tensor xhat_t = r.xhat.t().contiguous().t();
    ASSERT_FALSE(xhat_t.is_contiguous());
    EXPECT_EQ(ops::layer_norm_affine(xhat_t, DType::F32, w, b).to_vector<double>(), r.y.to_vector<double>())
        << dtype_name(low);
  }
}

TEST(LayerNormRounded, BadInputs) {
  const Tensor x = uniform({4, 6}, -1, 1);
  expect_error<DTypeError>([&] { ops::layer_norm_rounded(x, {6}, {}, {}, 1e-5, DType::I64); },
                           {"layer_norm_rounded", "x-hat", "floating", "i64"});
  expect_error<DTypeError>([&] { ops::layer_norm_rounded(x.to(DType::I32), {6}, {}, {}, 1e-5, DType::BF16); },
                           {"layer_norm_rounded", "floating", "i32"});
  expect_error<ShapeError>([&] { ops::layer_norm_rounded(x, {5}, {}, {}, 1e-5, DType::BF16); },
                           {"layer_norm_rounded", "[4, 6]", "[5]"});
  const ops::LayerNormResult r = ops::layer_norm_rounded(x, {6}, {}, {}, 1e-5, DType::BF16);
  expect_error<ShapeError>([&] { ops::layer_norm_affine(r.xhat, DType::F32, ones({5})); },
                           {"layer_norm_affine", "weight", "[5]", "[6]"});
  expect_error<DTypeError>([&] { ops::layer_norm_affine(r.xhat, DType::I64); },
                           {"layer_norm_affine", "floating", "i64"});
  expect_error<DTypeError>([&] { ops::layer_norm_affine(r.xhat.to(DType::I32), DType::F32); },
                           {"layer_norm_affine", "floating", "i32"});
  expect_error<Error>([&] { ops::layer_norm_affine(Tensor(), DType::F32); }, {"layer_norm_affine", "x-hat"});
  // Under autocast, bad inputs still get the two layers' errors.
  amp::Autocast guard(DType::BF16);
  const Tensor w = uniform({2, 6}, -1, 1);
  expect_error<ShapeError>([&] { F::layer_norm_linear(x, {6}, uniform({4}, 1, 2), {}, 1e-5, w); },
                           {"layer_norm", "weight", "[4]"});
  expect_error<ShapeError>(
      [&] {
        F::layer_norm_linear(x, {6}, {}, {}, 1e-5, uniform({2, 4}, -1, 1));
      },
      {"linear", "[2, 4]"});
  expect_error<DTypeError>([&] { F::layer_norm_linear(x.to(DType::I64), {6}, {}, {}, 1e-5, w); }, {"i64"});
}

}  // namespace
}  // namespace frugal
