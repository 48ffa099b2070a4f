// The Tensor methods that compute: each is its free function of autograd/functions.h, recorded as that is
// (one hop of dispatch). Those of core/op_list.h are generated from its lists; the rest are written below.
#include "autograd/functions.h"
#include "autograd/graph.h"

namespace frugal {

// The elementwise lists: x.exp(), x.clamp(-1, 1), x.add(y), x.add(2.0), x.relu_(), x.eq(y) (comparisons are
// core's: bool results are not recorded).
#define FRUGAL_METHOD_UNARY(name, F, dtypes, autocast_class, method, inplace)     \
  FRUGAL_IF_##method(Tensor Tensor::name() const { return frugal::name(*this); }) \
      FRUGAL_IF_##inplace(Tensor& Tensor::name##_() { return frugal::name##_(*this); })
#define FRUGAL_METHOD_UNARY_PARAM(name, F, dtypes, autocast_class, method, inplace, p1, d1, p2, d2, ...) \
  FRUGAL_IF_##method(Tensor Tensor::name(Scalar p1, Scalar p2) const {                                   \
    return frugal::name(*this, p1, p2);                                                                  \
  }) FRUGAL_IF_##inplace(Tensor& Tensor::name##_(Scalar p1, Scalar p2) {                                 \
    return frugal::name##_(*this, p1, p2);                                                               \
  })
#define FRUGAL_METHOD_BINARY(name, F, dtypes, autocast_class, method, inplace)          \
  FRUGAL_IF_##method(                                                                   \
      Tensor Tensor::name(const Tensor& other) const {                                  \
        return frugal::name(*this, other);                                              \
      } Tensor Tensor::name(Scalar other) const { return frugal::name(*this, other); }) \
      FRUGAL_IF_##inplace(                                                              \
          Tensor& Tensor::name##_(const Tensor& other) {                                \
            return frugal::name##_(*this, other);                                       \
          } Tensor& Tensor::name##_(Scalar other) { return frugal::name##_(*this, other); })
#define FRUGAL_METHOD_COMPARE(name, F)                                               \
  Tensor Tensor::name(const Tensor& other) const { return ops::name(*this, other); } \
  Tensor Tensor::name(Scalar other) const { return ops::name(*this, other); }
FRUGAL_UNARY_OP_LIST(FRUGAL_METHOD_UNARY)
FRUGAL_UNARY_PARAM_OP_LIST(FRUGAL_METHOD_UNARY_PARAM)
FRUGAL_BINARY_OP_LIST(FRUGAL_METHOD_BINARY)
FRUGAL_COMPARE_OP_LIST(FRUGAL_METHOD_COMPARE)
#undef FRUGAL_METHOD_UNARY
#undef FRUGAL_METHOD_UNARY_PARAM
#undef FRUGAL_METHOD_BINARY
#undef FRUGAL_METHOD_COMPARE

Tensor Tensor::operator-() const { return frugal::neg(*this); }
Tensor Tensor::clamp_min(Scalar min) const { return frugal::clamp_min(*this, min); }
Tensor Tensor::clamp_max(Scalar max) const { return frugal::clamp_max(*this, max); }
Tensor Tensor::where(const Tensor& cond, const Tensor& other) const {
  return frugal::where(cond, *this, other);
}

Tensor Tensor::t() const {
  FRUGAL_CHECK_SHAPE(dim() <= 2, "t: expected a tensor of at most 2 dims, got shape ", shape(),
                     "; use transpose(dim0, dim1)");
  return dim() < 2 ? *this : transpose(0, 1);
}
Tensor Tensor::as_strided(const Shape& shape, const Shape& strides, int64_t element_offset) const {
  const auto& m = autograd_meta();
  FRUGAL_CHECK(!(autograd::grad_mode_enabled() && m && (m->requires_grad || m->grad_fn)),
               "as_strided: not differentiable; the tensor (shape ", this->shape(),
               ") requires grad: use view, reshape, slice or expand, or detach() first");
  return ops::as_strided(*this, shape, strides, element_offset);
}
Tensor Tensor::to(DType t) const { return t == dtype() ? *this : cast(*this, t); }
Tensor Tensor::to(Device d) const { return frugal::to(*this, d); }

// FRUGAL_TENSOR_OP_LIST: x.view({2, -1}), x.sum({0}, true), x.argmax(1), x.matmul(w), ... A definition
// repeats no default (the declarations in core/tensor.h have them), so FRUGAL_DEFAULT expands to nothing
// from here to the end of this file.
#undef FRUGAL_DEFAULT
#define FRUGAL_DEFAULT(...)
#define FRUGAL_METHOD_TENSOR_OP(name, params, args, grad, method) \
  FRUGAL_IF_##method(Tensor Tensor::name params const { return frugal::name FRUGAL_WITH_THIS args; })
FRUGAL_TENSOR_OP_LIST(FRUGAL_METHOD_TENSOR_OP)
#undef FRUGAL_METHOD_TENSOR_OP

}  // namespace frugal
