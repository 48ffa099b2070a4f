// Layer norm keeping x-hat for backward instead of x (Note [layer norm saves x-hat], autograd/grad_norm.cpp):
// finite differences of the x-hat backward in f64; the same y bit for bit and the same gradients as the
// backward from x (tight with x-hat in f32, within bf16/f16 tolerance with x-hat rounded), also where x has a
// large offset; what autocast makes it keep; recompute segments bit-identical under autocast; non-contiguous
// inputs; bad inputs.
#include <algorithm>
#include <any>
#include <cmath>

#include "nn/gpt.h"
#include "tests/autograd/gradcheck_helpers.h"

namespace frugal {
namespace {

namespace F = nn::functional;
using testing::expect_close;
using testing::expect_error;
using testing::expect_grads_ok;
using testing::Layout;
using testing::uniform;

TEST(LayerNormXhat, GradcheckF64) {
  for (Layout layout : testing::kLayouts) {
    const std::string l = testing::layout_name(layout);
    expect_grads_ok(
        [](const std::vector<Tensor>& in) {
          return autograd::layer_norm_saving_xhat(in[0], {5}, in[1], in[2], 1e-5, DType::F64);
        },
        {testing::leaf({3, 5}, -2, 2, 41, layout), testing::leaf({5}, 0.5, 1.5, 42),
         testing::leaf({5}, -1, 1, 43)},
        "weight bias " + l);
    expect_grads_ok(
        [](const std::vector<Tensor>& in) {
          return autograd::layer_norm_saving_xhat(in[0], {2, 3}, in[1], {}, 1e-5, DType::F64);
        },
        {testing::leaf({4, 2, 3}, -2, 2, 44, layout), testing::leaf({2, 3}, 0.5, 1.5, 45)},
        "over two dims " + l);
    expect_grads_ok(
        [](const std::vector<Tensor>& in) {
          return autograd::layer_norm_saving_xhat(in[0], {6}, {}, {}, 1e-5, DType::F64);
        },
        {testing::leaf({2, 6}, -2, 2, 46, layout)}, "no affine " + l);
  }
  const Tensor x = testing::leaf({3, 4}, -2, 2, 47).detach();
  expect_grads_ok(
      [x](const std::vector<Tensor>& in) {
        return autograd::layer_norm_saving_xhat(x, {4}, in[0], in[1], 1e-5, DType::F64);
      },
      {testing::leaf({4}, 0.5, 1.5, 48), testing::leaf({4}, -1, 1, 49)}, "params only");
}

struct Case {
  Shape x_shape, normalized;
  bool weight, bias;
};
const Case kCases[] = {
    {{4, 7, 32}, {32}, true, true}, {{5, 3, 4}, {3, 4}, true, true}, {{6, 16}, {16}, true, false},
    {{6, 16}, {16}, false, true},   {{2, 7}, {7}, false, false},     {{600, 256}, {256}, true, true},
};

// y, dx, dweight, dbias of an f32 layer norm keeping x (no xhat_dtype) or x-hat in xhat_dtype; x is offset
// by `offset` (a residual stream far from zero makes x - mean cancel).
std::vector<Tensor> run(const Case& c, std::optional<DType> xhat_dtype, Layout layout = Layout::Contiguous,
                        double offset = 0) {
  Tensor x = testing::leaf(c.x_shape, -2, 3, 21, layout).detach();  // f32 below, as laid out
  if (offset != 0) x = add(x, offset);
  x = x.to(DType::F32).requires_grad_();
  Tensor w, b;
  if (c.weight) w = uniform(c.normalized, 0.5, 1.5, DType::F32, 22).requires_grad_();
  if (c.bias) b = uniform(c.normalized, -1, 1, DType::F32, 23).requires_grad_();
  const Tensor y = xhat_dtype ? autograd::layer_norm_saving_xhat(x, c.normalized, w, b, 1e-5, *xhat_dtype)
                              : F::layer_norm(x, c.normalized, w, b, 1e-5);
  const Tensor dy = uniform(c.x_shape, -1, 1, DType::F32, 24);
  sum(mul(y, dy)).backward();
  return {y.detach(), x.grad(), w.defined() ? w.grad() : Tensor(), b.defined() ? b.grad() : Tensor()};
}

std::string name(const Case& c) {
  std::ostringstream s;
  s << c.x_shape << " over " << c.normalized << (c.weight ? " weight" : "") << (c.bias ? " bias" : "");
  return s.str();
}

// y bit for bit; gradients within tol, d weight and d bias (sums over the rows of terms with independent
// rounding errors) within tol times the square root of the number of rows.
void expect_same(const std::vector<Tensor>& got, const std::vector<Tensor>& ref, testing::Tol tol,
                 const std::string& what) {
  EXPECT_EQ(got[0].to_vector<float>(), ref[0].to_vector<float>()) << what << " y";
  const char* names[] = {"y", "dx", "dweight", "dbias"};
  const double rows = double(got[0].numel()) / double(got[0].size(-1));
  for (size_t i = 1; i < got.size(); ++i) {
    ASSERT_EQ(got[i].defined(), ref[i].defined()) << what << " " << names[i];
    if (!got[i].defined()) continue;
    EXPECT_EQ(got[i].dtype(), ref[i].dtype()) << what << " " << names[i];
    const double k = i == 1 ? 1 : std::max(1.0, std::sqrt(rows / 16));
    expect_close(got[i], ref[i].to_vector<double>(), {tol.atol * k, tol.rtol}, what + " " + names[i]);
  }
}

TEST(LayerNormXhat, MatchesTheBackwardFromX) {
  for (const Case& c : kCases)
    for (Layout layout : {Layout::Contiguous, Layout::Transposed}) {
      const auto ref = run(c, std::nullopt, layout);
      const std::string what = name(c) + " " + testing::layout_name(layout);
      expect_same(run(c, DType::F32, layout), ref, {2e-6, 2e-6}, what + " x-hat f32");
      // x-hat rounded once: a relative error of the dtype's epsilon in each term of the gradient sums.
      expect_same(run(c, DType::BF16, layout), ref, {3e-2, 3e-2}, what + " x-hat bf16");
      expect_same(run(c, DType::F16, layout), ref, {4e-3, 4e-3}, what + " x-hat f16");
    }
}

// The backward from a 16-bit x-hat reads a row back into f32 at once where it fits the kernel's buffer, and
// value by value in longer rows (Note [16-bit x-hat in runs], kernels/cpu/norm.cpp): both are the backward
// from the same values held in f32 (converted here by way of f64, not by the kernel's conversion), the first
// bit for bit, the second to f32 rounding (its row sums run in another order). So is a 16-bit gradient.
TEST(LayerNormXhat, SixteenBitXhatIsReadAsItsValues) {
  for (DType s : {DType::F16, DType::BF16})
    for (int64_t cols : {7, 4096, 4097}) {
      const std::string what = std::string(dtype_name(s)) + " cols " + std::to_string(cols);
      const Tensor x = uniform({5, cols}, -2, 3, DType::F32, 61),
                   w = uniform({cols}, 0.5, 1.5, DType::F32, 62);
      const Tensor g = uniform({5, cols}, -1, 1, DType::F32, 63);
      const ops::LayerNormResult r = ops::layer_norm(x, {cols}, w, {}, 1e-5, s);
      const ops::LayerNormGrads got =
          ops::layer_norm_backward_xhat(g, r.xhat, DType::F32, {cols}, w, r.rstd, true, true, true);
      const Tensor values = tensor(r.xhat.to_vector<double>(), r.xhat.shape()).to(DType::F32);
      const ops::LayerNormGrads ref =
          ops::layer_norm_backward_xhat(g, values, DType::F32, {cols}, w, r.rstd, true, true, true);
      for (const auto& [a, b] :
           {std::pair{got.dx, ref.dx}, {got.dweight, ref.dweight}, {got.dbias, ref.dbias}}) {
        if (cols <= 4096)
          EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>()) << what;
        else
          expect_close(a, b.to_vector<double>(), {1e-5, 1e-5}, what);
      }
      // A gradient in x-hat's dtype (d x-hat under autocast) is read as it is, the same way: the results of
      // the same values cast to f32 first.
      const Tensor g16 = g.to(s);
      const ops::LayerNormGrads got16 =
          ops::layer_norm_backward_xhat(g16, r.xhat, DType::F32, {cols}, w, r.rstd, true, true, true);
      const ops::LayerNormGrads ref16 = ops::layer_norm_backward_xhat(g16.to(DType::F32), r.xhat, DType::F32,
                                                                      {cols}, w, r.rstd, true, true, true);
      EXPECT_EQ(got16.dx.dtype(), DType::F32) << what;
      for (const auto& [a, b] :
           {std::pair{got16.dx, ref16.dx}, {got16.dweight, ref16.dweight}, {got16.dbias, ref16.dbias}}) {
        if (cols <= 4096)
          EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>()) << what << " 16-bit gradient";
        else
          expect_close(a, b.to_vector<double>(), {1e-5, 1e-5}, what + " 16-bit gradient");
      }
    }
}

TEST(LayerNormXhat, LargeOffsetCostsNoMoreThanTheDtypesRounding) {
  // x = 1000 + O(1): a bf16 x would have lost everything below 4 (its spacing at 1000); x-hat has not.
  const Case c{{64, 128}, {128}, true, true};
  const auto ref = run(c, std::nullopt, Layout::Contiguous, 1000);
  expect_same(run(c, DType::BF16, Layout::Contiguous, 1000), ref, {3e-2, 3e-2}, "offset 1000, x-hat bf16");
  // The rounded x the Note rejects: its normalised values are far off.
  const Tensor x = add(testing::leaf(c.x_shape, -2, 3, 21).detach(), 1000.0).to(DType::F32);
  const Tensor from_rounded = ops::layer_norm(x.to(DType::BF16).to(DType::F32), {128}).y;
  const Tensor exact = ops::layer_norm(x, {128}).y;
  EXPECT_GT(ops::max(ops::abs(ops::sub(from_rounded, exact))).item<double>(), 0.1);
}

// The dtypes and sizes of the tensors fn's graph keeps (through saved-tensor hooks).
std::vector<std::pair<DType, int64_t>> saved_by(const std::function<Tensor()>& fn) {
  auto saved = std::make_shared<std::vector<std::pair<DType, int64_t>>>();
  autograd::SavedTensorHooks hooks(
      [saved](const Tensor& t) -> std::any {
        saved->push_back({t.dtype(), t.numel()});
        return t;
      },
      [](const std::any& a) { return std::any_cast<Tensor>(a); });
  fn();
  return *saved;
}

TEST(LayerNormXhat, AutocastKeepsXhatInItsDtype) {
  const Tensor x = uniform({32, 64}, -1, 1, DType::F32, 5).requires_grad_();
  const Tensor w = uniform({64}, 0.5, 1.5, DType::F32, 6).requires_grad_();
  const Tensor b = uniform({64}, -1, 1, DType::F32, 7).requires_grad_();
  using Saved = std::vector<std::pair<DType, int64_t>>;
  // Outside autocast: x, mean, rstd and the weight, as before.
  EXPECT_EQ(saved_by([&] { return F::layer_norm(x, {64}, w, b); }),
            (Saved{{DType::F32, 2048}, {DType::F32, 32}, {DType::F32, 32}, {DType::F32, 64}}));
  for (DType low : {DType::BF16, DType::F16}) {
    Tensor y;
    EXPECT_EQ(saved_by([&] {
                amp::Autocast guard(low);
                y = F::layer_norm(x, {64}, w, b);
                return y;
              }),
              (Saved{{low, 2048}, {DType::F32, 32}, {DType::F32, 64}}))
        << dtype_name(low);
    // The same y as without recording (which keeps nothing) and as outside autocast.
    Tensor y_no_grad;
    {
      NoGradGuard no_grad;
      amp::Autocast guard(low);
      y_no_grad = F::layer_norm(x, {64}, w, b);
    }
    EXPECT_EQ(y.dtype(), DType::F32);
    EXPECT_EQ(y.to_vector<float>(), y_no_grad.to_vector<float>());
    EXPECT_EQ(y.to_vector<float>(), F::layer_norm(x, {64}, w, b).to_vector<float>());
  }
  // A bf16 input under autocast: cast to f32 for the op, bf16 x-hat kept (not the f32 copy).
  const Tensor xb = x.detach().to(DType::BF16).requires_grad_();
  EXPECT_EQ(saved_by([&] {
              amp::Autocast guard(DType::BF16);
              return F::layer_norm(xb, {64}, w, b);
            }),
            (Saved{{DType::BF16, 2048}, {DType::F32, 32}, {DType::F32, 64}}));
}

TEST(LayerNormXhat, XChangedInPlaceAfterwardsDoesNotMatter) {
  // Keeping x-hat, the backward no longer reads x: changing x after the forward is allowed.
  const Tensor base = uniform({8, 16}, -1, 1, DType::F32, 8);
  const Tensor w = uniform({16}, 0.5, 1.5, DType::F32, 9).requires_grad_();
  auto grad_of_w = [&](bool change) {
    w.zero_grad();
    Tensor x = base.clone();
    Tensor y;
    {
      amp::Autocast guard(DType::BF16);
      y = F::layer_norm(x, {16}, w);
    }
    if (change) ops::mul_(x, 3.0);
    sum(mul(y, y)).backward();
    return w.grad().to_vector<float>();
  };
  EXPECT_EQ(grad_of_w(true), grad_of_w(false));
}

// The GPT of nn/gpt.h, small, one forward and backward under autocast with and without recompute segments:
// the gradients bit for bit.
TEST(LayerNormXhat, RecomputeSegmentsBitIdenticalUnderAutocast) {
  for (DType low : {DType::BF16, DType::F16}) {
    auto grads = [&](bool segments) {
      manual_seed(3);
      nn::GPT gpt(nn::GPTConfig{.vocab = 13, .d_model = 32, .n_layers = 3, .n_heads = 2, .context = 16});
      gpt->recompute(segments);
      Generator g(4);
      const Tensor tokens = randint(0, 13, {4, 16}, DType::I64, &g);
      const Tensor targets = randint(0, 13, {4, 16}, DType::I64, &g);
      Tensor loss;
      {
        amp::Autocast guard(low);
        loss = F::cross_entropy(gpt->forward(tokens).view({-1, 13}), targets.view({-1}));
      }
      loss.backward();
      std::vector<std::vector<float>> out{loss.to_vector<float>()};
      for (const Tensor& p : gpt->parameters()) out.push_back(p.grad().to_vector<float>());
      return out;
    };
    EXPECT_EQ(grads(true), grads(false)) << dtype_name(low);
  }
}

TEST(LayerNormXhat, NonContiguousInputUnderAutocast) {
  // A transposed view and its contiguous copy: the same y and gradients bit for bit.
  const Tensor base = uniform({24, 10}, -2, 2, DType::F32, 11);
  const Tensor w = uniform({10}, 0.5, 1.5, DType::F32, 12).requires_grad_();
  const Tensor b = uniform({10}, -1, 1, DType::F32, 13).requires_grad_();
  const Tensor dy = uniform({24, 10}, -1, 1, DType::F32, 14);
  auto run_on = [&](bool transposed) {
    w.zero_grad();
    b.zero_grad();
    Tensor x = transposed ? base.t().contiguous().t() : base.clone();
    EXPECT_EQ(x.is_contiguous(), !transposed);
    x.requires_grad_();
    Tensor y;
    {
      amp::Autocast guard(DType::BF16);
      y = F::layer_norm(x, {10}, w, b);
    }
    sum(mul(y, dy)).backward();
    return std::vector<std::vector<float>>{y.to_vector<float>(), x.grad().to_vector<float>(),
                                           w.grad().to_vector<float>(), b.grad().to_vector<float>()};
  };
  EXPECT_EQ(run_on(true), run_on(false));
}

TEST(LayerNormXhat, BadInputs) {
  const Tensor x = uniform({4, 6}, -1, 1);
  expect_error<DTypeError>([&] { ops::layer_norm(x, {6}, {}, {}, 1e-5, DType::I64); },
                           {"layer_norm", "x-hat", "floating", "i64"});
  expect_error<DTypeError>([&] { autograd::layer_norm_saving_xhat(x, {6}, {}, {}, 1e-5, DType::Bool); },
                           {"layer_norm", "x-hat", "bool"});
  const ops::LayerNormResult r = ops::layer_norm(x, {6}, {}, {}, 1e-5, DType::BF16);
  ASSERT_TRUE(r.xhat.defined());
  EXPECT_EQ(r.xhat.dtype(), DType::BF16);
  EXPECT_EQ(r.xhat.shape(), x.shape());
  const Tensor g = uniform({4, 6}, -1, 1);
  auto backward = [&](const Tensor& grad, const Tensor& xhat, DType x_dtype, const Tensor& weight,
                      const Tensor& rstd) {
    ops::layer_norm_backward_xhat(grad, xhat, x_dtype, {6}, weight, rstd, true, true, true);
  };
  expect_error<Error>(
      [&] {
        backward(uniform({4, 5}, -1, 1), r.xhat, DType::F32, {}, r.rstd);
      },
      {"layer_norm_backward_xhat", "[4, 5]", "[4, 6]"});
  expect_error<Error>([&] { backward(g, r.xhat, DType::F32, {}, r.rstd.slice(0, 0, 3)); },
                      {"layer_norm_backward_xhat", "rstd", "[4]"});
  expect_error<Error>([&] { backward(g, r.xhat, DType::F32, {}, r.rstd.to(DType::F64)); },
                      {"layer_norm_backward_xhat", "rstd", "f32", "f64"});
  expect_error<Error>([&] { backward(g, r.xhat, DType::F32, {}, Tensor()); },
                      {"layer_norm_backward_xhat", "rstd", "undefined"});
  expect_error<DTypeError>([&] { backward(g, r.xhat, DType::I32, {}, r.rstd); },
                           {"layer_norm_backward_xhat", "floating", "i32"});
  expect_error<ShapeError>([&] { backward(g, r.xhat, DType::F32, ones({5}), r.rstd); },
                           {"layer_norm_backward_xhat", "weight", "[5]", "[6]"});
  expect_error<DTypeError>([&] { backward(g, r.xhat.to(DType::I64), DType::F32, {}, r.rstd); },
                           {"layer_norm_backward_xhat", "floating", "i64"});
  // A failed call leaves its inputs untouched.
  const auto before = r.xhat.to_vector<float>();
  const auto rstd_before = r.rstd.to_vector<float>();
  expect_error<Error>(
      [&] {
        backward(uniform({4, 5}, -1, 1), r.xhat, DType::F32, {}, r.rstd);
      },
      {"layer_norm_backward_xhat"});
  EXPECT_EQ(r.xhat.to_vector<float>(), before);
  EXPECT_EQ(r.rstd.to_vector<float>(), rstd_before);
}

}  // namespace
}  // namespace frugal
