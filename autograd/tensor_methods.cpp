// The Tensor methods of the ops that are not elementwise (those are generated from core/op_list.h in
// autograd/grad_elementwise.cpp): reductions, softmax, argmax, ... Each is its free function of
// autograd/functions.h, recorded as that is.
#include "autograd/functions.h"

namespace frugal {

Tensor Tensor::max() const { return frugal::max(*this); }
Tensor Tensor::min() const { return frugal::min(*this); }
Tensor Tensor::max(const Shape& dims, bool keepdim) const { return frugal::max(*this, dims, keepdim); }
Tensor Tensor::min(const Shape& dims, bool keepdim) const { return frugal::min(*this, dims, keepdim); }
Tensor Tensor::var(const Shape& dims, int64_t correction, bool keepdim) const {
  return frugal::var(*this, dims, correction, keepdim);
}
Tensor Tensor::argmax() const { return frugal::argmax(*this); }
Tensor Tensor::argmin() const { return frugal::argmin(*this); }
Tensor Tensor::argmax(int64_t dim, bool keepdim) const { return frugal::argmax(*this, dim, keepdim); }
Tensor Tensor::argmin(int64_t dim, bool keepdim) const { return frugal::argmin(*this, dim, keepdim); }
Tensor Tensor::softmax(int64_t dim) const { return frugal::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return frugal::log_softmax(*this, dim); }

}  // namespace frugal
