// make_loop: broadcast strides, drop size-1 dims, merge dims that are contiguous in every operand.
#include "core/loop.h"

#include "core/tensor.h"

namespace frugal {

Loop make_loop(std::initializer_list<const Tensor*> operands) {
  Loop L;
  L.nops = int(operands.size());
  FRUGAL_ASSERT(L.nops >= 1 && L.nops <= kMaxOperands, "make_loop: ", L.nops, " operands");
  const Tensor& out = **operands.begin();
  const Shape& shape = out.shape();
  L.numel = shape.numel();
  const int nd = shape.size();

  // Byte strides of each operand aligned to the output's dims (0 where broadcast or missing).
  std::array<std::array<int64_t, kMaxDims>, kMaxOperands> st{};
  int k = 0;
  for (const Tensor* t : operands) {
    L.data[k] = static_cast<char*>(t->raw_data());
    const int lead = nd - t->dim();
    FRUGAL_ASSERT(lead >= 0, "make_loop: operand of shape ", t->shape(), " does not broadcast to ", shape);
    for (int d = 0; d < t->dim(); ++d) {
      const int64_t s = t->shape()[d];
      FRUGAL_ASSERT(s == shape[d + lead] || s == 1, "make_loop: operand of shape ", t->shape(),
                    " does not broadcast to ", shape);
      st[k][d + lead] = s == 1 ? 0 : t->strides()[d] * t->element_size();
    }
    ++k;
  }

  // Keep dims of size > 1, merging a dim into the previous kept one when every operand steps through both as
  // one run (stride[prev] == stride[d] * size[d]).
  int n = 0;
  for (int d = 0; d < nd; ++d) {
    if (shape[d] == 1) continue;
    bool merge = n > 0;
    for (int j = 0; merge && j < L.nops; ++j) merge = L.strides[j][n - 1] == st[j][d] * shape[d];
    if (merge) {
      L.sizes[n - 1] *= shape[d];
      for (int j = 0; j < L.nops; ++j) L.strides[j][n - 1] = st[j][d];
    } else {
      L.sizes[n] = shape[d];
      for (int j = 0; j < L.nops; ++j) L.strides[j][n] = st[j][d];
      ++n;
    }
  }
  if (n == 0) {  // a single element (or a 0-d tensor)
    L.sizes[0] = 1;
    n = 1;
  }
  L.ndim = n;
  return L;
}

}  // namespace frugal
