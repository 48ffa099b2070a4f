// The Tensor methods of autograd (requires_grad_, grad, backward, ...) and the in-place data methods, which
// refuse to write into a tensor autograd tracks.
#include "autograd/functions.h"

namespace frugal {

namespace {
AutogradMeta& meta_of(const Tensor& t) {
  if (!t.autograd_meta()) t.set_autograd_meta(std::make_shared<AutogradMeta>());
  return *t.autograd_meta();
}
}  // namespace

bool Tensor::requires_grad() const {
  const auto& m = autograd_meta();
  return m && (m->requires_grad || m->grad_fn);
}

Tensor& Tensor::requires_grad_(bool on) {
  FRUGAL_CHECK(is_leaf(), "requires_grad_: only leaves can change requires_grad; this tensor (shape ",
               shape(), ") was produced by ", grad_fn_name(), "; detach() it first to make a new leaf");
  FRUGAL_CHECK_DTYPE(!on || is_floating(dtype()),
                     "requires_grad_: only floating tensors can require grad, got ", dtype_name(dtype()),
                     " (shape ", shape(), ")");
  meta_of(*this).requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const { return !autograd_meta() || !autograd_meta()->grad_fn; }

Tensor Tensor::grad() const { return autograd_meta() ? autograd_meta()->grad : Tensor(); }

void Tensor::set_grad(const Tensor& grad) const {
  if (grad.defined()) {
    FRUGAL_CHECK_SHAPE(grad.shape() == shape() && grad.dtype() == dtype() && grad.device() == device(),
                       "set_grad: the gradient (shape ", grad.shape(), ", ", dtype_name(grad.dtype()), ", ",
                       grad.device(), ") must match the tensor (shape ", shape(), ", ", dtype_name(dtype()),
                       ", ", device(), ")");
  }
  meta_of(*this).grad = grad;
}

void Tensor::zero_grad(bool set_to_none) const {
  if (!autograd_meta()) return;
  // A sparse gradient is dropped either way: zero rows and no rows mean the same (as a zeroed torch sparse
  // tensor, which keeps no values).
  autograd_meta()->sparse_grad = SparseGrad();
  if (!autograd_meta()->grad.defined()) return;
  if (set_to_none) {
    autograd_meta()->grad = Tensor();
  } else {
    ops::fill_(autograd_meta()->grad, 0);
  }
}

void Tensor::retain_grad() const {
  FRUGAL_CHECK(requires_grad(), "retain_grad: the tensor (shape ", shape(), ") does not require grad");
  meta_of(*this).retains_grad = true;
}

Tensor Tensor::detach() const { return Tensor(storage(), byte_offset(), shape(), strides(), dtype()); }

const char* Tensor::grad_fn_name() const {
  return autograd_meta() && autograd_meta()->grad_fn ? autograd_meta()->grad_fn->name : "";
}

void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  autograd::backward(*this, grad, retain_graph);
}

Tensor& Tensor::copy_(const Tensor& src) {
  autograd::check_inplace(*this, "copy_");
  return ops::copy_(*this, src);
}

Tensor& Tensor::fill_(Scalar value) {
  autograd::check_inplace(*this, "fill_");
  return ops::fill_(*this, value);
}

}  // namespace frugal
