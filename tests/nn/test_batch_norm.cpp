// The fused batch norm (core/batch_norm.h, kernels/cpu/batch_norm.cpp, run by nn::functional::batch_norm)
// against the composite of mean, var and elementwise ops it replaced, computed in f64: outputs, running
// statistics and every gradient, training and eval, with and without weight and bias, 2-D to 4-D inputs,
// f64/f32/f16/bf16; gradcheck in f64; bad inputs. (tests/nn/test_layers.cpp checks the BatchNorm2d module.)
#include "autograd/functions.h"
#include "core/batch_norm.h"
#include "tests/autograd/gradcheck_helpers.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

namespace F = nn::functional;
using testing::expect_close;
using testing::expect_error;
using testing::uniform;

// The composite nn::functional::batch_norm computed before the fused op, in f64 (differentiable).
Tensor composite(const Tensor& x, Tensor rm, Tensor rv, const Tensor& w, const Tensor& b, bool training,
                 double momentum, double eps) {
  const int64_t c = x.size(1);
  Shape dims{0}, bshape = Shape::filled(x.dim(), 1);
  for (int d = 2; d < x.dim(); ++d) dims.push_back(d);
  bshape[1] = c;
  Tensor mu, v;
  if (training) {
    const int64_t n = x.numel() / c;
    mu = mean(x, dims, true);
    v = var(x, dims, 0, true);
    if (rm.defined()) {
      NoGradGuard no_grad;
      ops::mul_(rm, 1 - momentum);
      ops::add_(rm, ops::mul(mu.detach().reshape({c}).to(rm.dtype()), momentum));
      ops::mul_(rv, 1 - momentum);
      ops::add_(rv, ops::mul(v.detach().reshape({c}).to(rv.dtype()), momentum * double(n) / double(n - 1)));
    }
  } else {
    mu = rm.reshape(bshape).to(x.dtype());
    v = rv.reshape(bshape).to(x.dtype());
  }
  Tensor y = mul(sub(x, mu), rsqrt(add(v, eps)));
  if (w.defined()) y = mul(y, w.reshape(bshape));
  if (b.defined()) y = add(y, b.reshape(bshape));
  return y;
}

struct Case {
  Shape x;
  bool weight, bias;
};

const std::vector<Case> kCases = {
    {{4, 3, 5, 7}, true, true},   {{6, 5}, true, false},      {{3, 4, 9}, false, true},
    {{2, 7, 3, 3}, false, false}, {{1, 2, 1, 9}, true, true},
};

TEST(BatchNorm, FusedMatchesTheCompositeInEveryDtype) {
  for (DType t : {DType::F64, DType::F32, DType::F16, DType::BF16})
    for (const Case& cc : kCases)
      for (bool training : {true, false}) {
        const std::string what = detail::str_cat(dtype_name(t), " x ", cc.x, cc.weight ? " weight" : "",
                                                 cc.bias ? " bias" : "", training ? " training" : " eval");
        const int64_t c = cc.x[1];
        const Tensor x0 = uniform(cc.x, -2, 3, DType::F64, 1);
        const Tensor w0 = cc.weight ? uniform({c}, 0.5, 1.5, DType::F64, 2) : Tensor();
        const Tensor b0 = cc.bias ? uniform({c}, -1, 1, DType::F64, 3) : Tensor();
        const Tensor rm0 = uniform({c}, -1, 1, DType::F64, 4), rv0 = uniform({c}, 0.5, 2, DType::F64, 5);
        const Tensor dy0 = uniform(cc.x, -1, 1, DType::F64, 6);
        // The reference in f64 from the inputs as rounded to t.
        auto leaf = [](const Tensor& v, DType d) {
          return v.defined() ? v.to(d).detach().requires_grad_() : v;
        };
        const Tensor xr = leaf(x0.to(t), DType::F64), wr = leaf(w0, DType::F64), br = leaf(b0, DType::F64);
        Tensor rmr = rm0.clone(), rvr = rv0.clone();
        const Tensor yr = composite(xr, rmr, rvr, wr, br, training, 0.1, 1e-5);
        (yr * dy0).sum().backward();
        // The fused op in t (f32 parameters and running statistics for the 16-bit types, as under autocast).
        const DType pt = t == DType::F64 ? DType::F64 : DType::F32;
        const Tensor x = leaf(x0, t), w = leaf(w0, pt), b = leaf(b0, pt);
        Tensor rm = rm0.to(pt), rv = rv0.to(pt);
        const Tensor y = F::batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5);
        EXPECT_EQ(y.dtype(), t) << what;
        EXPECT_EQ(std::string(y.grad_fn_name()), "batch_norm") << what << ": the fused op ran";
        (y * dy0.to(t)).sum().backward();
        const testing::Tol tol = t == DType::F64   ? testing::Tol{1e-12, 1e-10}
                                 : t == DType::F32 ? testing::Tol{2e-5, 2e-5}
                                                   : testing::tol_for(t);
        // Gradient sums over many values: the 16-bit dy and dx round once each, the sums do not.
        const testing::Tol sum_tol = t == DType::F64 ? tol : testing::Tol{tol.atol * 4, tol.rtol * 2};
        expect_close(y, yr.to_vector<double>(), tol, "y " + what);
        expect_close(rm, rmr.to_vector<double>(), tol, "running_mean " + what);
        expect_close(rv, rvr.to_vector<double>(), tol, "running_var " + what);
        expect_close(x.grad(), xr.grad().to_vector<double>(), sum_tol, "dx " + what);
        if (cc.weight) expect_close(w.grad(), wr.grad().to_vector<double>(), sum_tol, "dweight " + what);
        if (cc.bias) expect_close(b.grad(), br.grad().to_vector<double>(), sum_tol, "dbias " + what);
        if (::testing::Test::HasFailure()) return;
      }
}

TEST(BatchNorm, Gradcheck) {
  for (bool training : {true, false}) {
    const Tensor rm = uniform({3}, -1, 1, DType::F64, 7), rv = uniform({3}, 0.5, 2, DType::F64, 8);
    testing::expect_grads_ok(
        [&](const std::vector<Tensor>& in) {
          return F::batch_norm(in[0], training ? Tensor() : rm, training ? Tensor() : rv, in[1], in[2],
                               training);
        },
        {testing::leaf({4, 3, 5}, -2, 2, 9), testing::leaf({3}, 0.5, 1.5, 10), testing::leaf({3}, -1, 1, 11)},
        training ? "batch_norm training [N, C, L]" : "batch_norm eval [N, C, L]");
    testing::expect_grads_ok(
        [&](const std::vector<Tensor>& in) { return F::batch_norm(in[0], rm, rv, {}, {}, training); },
        {testing::leaf({5, 3}, -2, 2, 12)}, "batch_norm without weight and bias [N, C]");
  }
}

// A non-contiguous input (channels-last memory seen as [N, C, H, W], and every second column) gives what its
// contiguous copy gives, outputs and gradients, in training and eval.
TEST(BatchNorm, NonContiguousInputs) {
  const Tensor nhwc = uniform({4, 5, 6, 3}, -2, 3, DType::F32, 16);
  const Tensor wide = uniform({4, 3, 5, 12}, -2, 3, DType::F32, 17);
  for (const Tensor& view : {nhwc.permute({0, 3, 1, 2}), wide.narrow(3, 1, 6)}) {
    ASSERT_FALSE(view.is_contiguous());
    for (bool training : {true, false}) {
      const Tensor dy = uniform(view.shape(), -1, 1, DType::F32, 18);
      auto run = [&](const Tensor& input) {
        const Tensor x = input.detach().requires_grad_();
        const Tensor w = uniform({3}, 0.5, 1.5, DType::F32, 19).requires_grad_();
        Tensor rm = uniform({3}, -1, 1, DType::F32, 20), rv = uniform({3}, 0.5, 2, DType::F32, 21);
        const Tensor y = F::batch_norm(x, rm, rv, w, {}, training, 0.1, 1e-5);
        (y * dy).sum().backward();
        return std::vector<Tensor>{y.detach(), x.grad(), w.grad(), rm, rv};
      };
      const std::vector<Tensor> strided = run(view), dense = run(view.contiguous());
      for (size_t i = 0; i < dense.size(); ++i)
        expect_close(strided[i], dense[i].to_vector<double>(), {1e-6, 1e-6},
                     detail::str_cat("output ", i, training ? " training " : " eval ", view.shape()));
    }
  }
}

TEST(BatchNorm, OnlyTheWantedGradients) {
  const Tensor x = uniform({4, 3, 2, 2}, -1, 1, DType::F64, 13);
  const Tensor w = uniform({3}, 0.5, 1.5, DType::F64, 14).requires_grad_();
  const Tensor b = uniform({3}, -1, 1, DType::F64, 15);
  F::batch_norm(x, {}, {}, w, b, true).sum().backward();
  ASSERT_TRUE(w.grad().defined());
  // sum(y) does not depend on the weight in training (the normalised values sum to zero per channel).
  expect_close(w.grad(), {0, 0, 0}, {1e-12, 0}, "dweight of sum(y)");
  const ops::BatchNormResult r = ops::batch_norm(x, w.detach(), b, {}, {}, true, 1e-5);
  const ops::BatchNormGrads g =
      ops::batch_norm_backward(ones_like(x), x, w.detach(), r.mean, r.invstd, true, 1e-5, false, false, true);
  EXPECT_FALSE(g.dx.defined());
  EXPECT_FALSE(g.dweight.defined());
  expect_close(g.dbias, {16, 16, 16}, {1e-12, 0}, "dbias of ones");
}

TEST(BatchNorm, BadInputs) {
  const Tensor x = uniform({4, 3, 2, 2}, -1, 1);
  expect_error<ShapeError>([&] { ops::batch_norm(x, uniform({4}, 0, 1), {}, {}, {}, true, 1e-5); },
                           {"batch_norm", "weight", "[3]"});
  expect_error<Error>([&] { ops::batch_norm(x, {}, {}, {}, {}, false, 1e-5); },
                      {"batch_norm", "running_mean and running_var must be defined"});
  expect_error<ShapeError>(
      [&] {
        ops::batch_norm(uniform({1, 3}, 0, 1), {}, {}, {}, {}, true, 1e-5);
      },
      {"batch_norm", "more than 1 value per channel"});
  expect_error<DTypeError>([&] { ops::batch_norm(x.to(DType::I64), {}, {}, {}, {}, true, 1e-5); },
                           {"batch_norm", "floating"});
  expect_error<ShapeError>([&] { ops::batch_norm(uniform({4}, 0, 1), {}, {}, {}, {}, true, 1e-5); },
                           {"batch_norm", "at least 2 dims"});
  const ops::BatchNormResult r = ops::batch_norm(x, {}, {}, {}, {}, true, 1e-5);
  expect_error<ShapeError>(
      [&] {
        ops::batch_norm_backward(uniform({4, 3}, 0, 1), x, {}, r.mean, r.invstd, true, 1e-5, true, false,
                                 false);
      },
      {"batch_norm_backward", "output gradient has shape"});
}

}  // namespace
}  // namespace frugal
