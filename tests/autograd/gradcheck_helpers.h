// Shared by the gradcheck tests (test_gradcheck_*.cpp): f64 leaves laid out contiguously or not, a gtest
// assertion around autograd::gradcheck, and a check of the gradients of f32 / bf16 leaves against f64.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tests/test_util.h"

namespace frugal::testing {

using GradFn = std::function<Tensor(const std::vector<Tensor>&)>;

// How a leaf's elements sit in memory. Gradients must not depend on it.
enum class Layout {
  Contiguous,
  Transposed,  // a transposed view of a contiguous tensor (last two dims; Strided when either is 1)
  Strided,     // every second element along the last dim of a tensor twice as wide
};
inline constexpr Layout kLayouts[] = {Layout::Contiguous, Layout::Transposed, Layout::Strided};
inline const char* layout_name(Layout l) {
  return l == Layout::Contiguous ? "contiguous" : l == Layout::Transposed ? "transposed" : "strided";
}

namespace detail {
inline bool transposable(const Shape& s) { return s.size() >= 2 && s[s.size() - 2] > 1 && s.back() > 1; }

// The shape of the contiguous tensor the leaf is a view of.
inline Shape base_shape(Shape s, Layout layout) {
  if (layout == Layout::Transposed && transposable(s)) {
    std::swap(s[s.size() - 2], s[s.size() - 1]);
  } else if (layout != Layout::Contiguous && s.size() > 0) {
    s[s.size() - 1] *= 2;
  }
  return s;
}

// base viewed as the leaf, marked as requiring grad (a view of a tensor outside the graph is a leaf).
inline Tensor arrange(const Tensor& base, const Shape& shape, Layout layout) {
  Tensor t = base;
  if (layout == Layout::Transposed && transposable(shape)) {
    t = base.transpose(-2, -1);
  } else if (layout != Layout::Contiguous && shape.size() > 0) {
    t = base.slice(-1, 0, base.shape().back(), 2);
  }
  EXPECT_EQ(t.shape(), shape);
  if (layout != Layout::Contiguous && shape.size() > 0 && shape.back() > 1) {
    EXPECT_FALSE(t.is_contiguous()) << layout_name(layout) << " leaf of shape " << shape;
  }
  t.requires_grad_();
  return t;
}
}  // namespace detail

// An f64 leaf of `shape` with values in [lo, hi), drawn from `seed`.
inline Tensor leaf(const Shape& shape, double lo, double hi, uint64_t seed,
                   Layout layout = Layout::Contiguous) {
  return detail::arrange(uniform(detail::base_shape(shape, layout), lo, hi, DType::F64, seed), shape, layout);
}

// An f64 leaf whose magnitudes lie in [lo, hi) with random signs: away from the kinks at 0 of relu, abs,
// clamp, maximum and minimum, and from the poles of div.
inline Tensor signed_leaf(const Shape& shape, uint64_t seed, Layout layout = Layout::Contiguous,
                          double lo = 0.1, double hi = 2) {
  const Shape bs = detail::base_shape(shape, layout);
  const Tensor magnitude = uniform(bs, lo, hi, DType::F64, seed);
  const Tensor sign = uniform(bs, -1, 1, DType::F64, seed + 7919);
  return detail::arrange(where(gt(sign, 0.0), magnitude, neg(magnitude)), shape, layout);
}

// Expects gradcheck to pass on fn at inputs (default tolerances unless given).
inline void expect_grads_ok(const GradFn& fn, const std::vector<Tensor>& inputs, const std::string& what,
                            const autograd::GradcheckOptions& options = {}) {
  const autograd::GradcheckResult r = autograd::gradcheck(fn, inputs, options);
  EXPECT_TRUE(r.ok) << what << ": " << r.message;
}

// Runs sum(fn(inputs) * w) backward for a fixed random w (a plain sum would hide errors that sum to zero,
// as softmax's do), w's values rounded to `round_to`, and returns each input's gradient.
inline std::vector<Tensor> grads_of(const GradFn& fn, const std::vector<Tensor>& inputs,
                                    DType round_to = DType::F64) {
  for (const Tensor& t : inputs) t.zero_grad();
  const Tensor y = fn(inputs);
  const Tensor w = uniform(y.shape(), -1, 1, round_to, 99).to(y.dtype());
  sum(mul(y, w)).backward();
  std::vector<Tensor> grads;
  for (const Tensor& t : inputs) grads.push_back(t.grad());
  return grads;
}

// Expects the gradients fn gives leaves of dtype t to have each leaf's dtype and shape and to match those of
// the f64 leaves `inputs` (same values) within tol.
inline void expect_grads_match_f64(const GradFn& fn, const std::vector<Tensor>& inputs, DType t, Tol tol,
                                   const std::string& what) {
  std::vector<Tensor> low;
  for (const Tensor& x : inputs) {
    Tensor c = x.detach().to(t);
    if (x.requires_grad()) c.requires_grad_();
    low.push_back(c);
  }
  // Reference from the rounded values, so only the computation's precision is compared.
  std::vector<Tensor> ref;
  for (size_t i = 0; i < low.size(); ++i) {
    Tensor c = low[i].detach().to(DType::F64);
    if (inputs[i].requires_grad()) c.requires_grad_();
    ref.push_back(c);
  }
  const std::vector<Tensor> expected = grads_of(fn, ref, t);
  const std::vector<Tensor> actual = grads_of(fn, low, t);
  for (size_t i = 0; i < low.size(); ++i) {
    if (!low[i].requires_grad()) continue;
    const std::string where = what + " " + dtype_name(t) + " input " + std::to_string(i);
    ASSERT_TRUE(actual[i].defined()) << where;
    EXPECT_EQ(actual[i].dtype(), t) << where;
    EXPECT_EQ(actual[i].shape(), low[i].shape()) << where;
    expect_close(actual[i], expected[i].to_vector<double>(), tol, where);
  }
}

}  // namespace frugal::testing
