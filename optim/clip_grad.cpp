// clip_grad_norm_ and clip_grad_value_: per-gradient norms with frugal::ops, combined in f64.
#include "optim/clip_grad.h"

#include <cmath>

#include "autograd/graph.h"
#include "core/estimate.h"
#include "core/ops.h"

namespace frugal::optim {

namespace {

// A gradient is reduced kNormChunk elements at a time, each chunk's sum (or max) taken on its own and the
// chunks' combined in f64: the temporaries (a 16-bit chunk in f32, its |x|^p) are then a chunk's size, not
// the gradient's. clip_grad_norm_ runs when every gradient is live, often near the step's peak, where a
// temporary as large as the largest gradient (twice that for a 16-bit one) would add to it. A gradient of
// at most one chunk (or a strided one) is reduced in one piece.
constexpr int64_t kNormChunk = int64_t(1) << 20;

// sum |g|^p (max |g| for p = inf) of one piece, as a 0-d f64 tensor on the gradient's device; 16-bit values
// are summed in f32 so that squares cannot overflow.
Tensor piece_sum(const Tensor& piece, double p) {
  const Tensor g = piece.dtype() == DType::F16 || piece.dtype() == DType::BF16 ? piece.to(DType::F32) : piece;
  Tensor s;
  if (std::isinf(p))
    s = ops::max(ops::abs(g));
  else if (p == 1)
    s = ops::sum(ops::abs(g));
  else if (p == 2)
    s = ops::sum(ops::mul(g, g));
  else
    s = ops::sum(ops::pow(ops::abs(g), p));
  return s.to(DType::F64);
}

// ||g||_p of one gradient. The pieces' results are combined on the device, so that the value is read once
// a gradient (one synchronisation on a GPU).
double grad_norm(const Tensor& grad, double p) {
  Tensor total;
  if (grad.numel() <= kNormChunk || !grad.is_contiguous()) {
    total = piece_sum(grad, p);
  } else {
    const Tensor flat = grad.reshape({-1});
    for (int64_t at = 0; at < flat.numel(); at += kNormChunk) {
      const Tensor s = piece_sum(flat.narrow(0, at, std::min(kNormChunk, flat.numel() - at)), p);
      total = !total.defined() ? s : std::isinf(p) ? ops::maximum(total, s) : ops::add(total, s);
    }
  }
  // A dry run makes the same reductions and takes the norm as large, so that the gradients are clipped: the
  // case that allocates more (Note [data-dependent sizes in a dry run], core/estimate.cpp).
  const double v = memory::item_or(total, 1e30);
  if (std::isinf(p) || p == 1) return v;
  return p == 2 ? std::sqrt(v) : std::pow(v, 1 / p);
}

}  // namespace

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  FRUGAL_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be > 0 or INFINITY, got ", norm_type);
  FRUGAL_CHECK(max_norm >= 0, "clip_grad_norm_: max_norm must be >= 0, got ", max_norm);
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    // Note [stepping in backward] (optim/step_in_backward.h): such a gradient is gone once backward returns.
    FRUGAL_CHECK(!(p.defined() && p.autograd_meta() && p.autograd_meta()->has_updating_hook()),
                 "clip_grad_norm_: a parameter (shape ", p.shape(),
                 ") is updated in backward (optim::StepInBackward): the global norm needs every gradient "
                 "before any update; clip per parameter inside the step, or no StepInBackward");
    if (p.defined() && p.grad().defined() && p.grad().numel() > 0) grads.push_back(p.grad());
  }
  if (grads.empty()) return 0;
  // As PyTorch: the norm of the per-gradient norms.
  double total = 0;
  for (const Tensor& g : grads) {
    const double n = grad_norm(g, norm_type);
    total = std::isinf(norm_type) ? std::max(total, n) : total + std::pow(n, norm_type);
  }
  if (!std::isinf(norm_type)) total = norm_type == 2 ? std::sqrt(total) : std::pow(total, 1 / norm_type);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1)
    for (Tensor& g : grads) ops::mul_(g, coef);
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  FRUGAL_CHECK(clip_value >= 0, "clip_grad_value_: clip_value must be >= 0, got ", clip_value);
  NoGradGuard no_grad;
  for (const Tensor& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    Tensor g = p.grad();
    ops::clamp_(g, -clip_value, clip_value);
  }
}

}  // namespace frugal::optim
