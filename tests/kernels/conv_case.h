// One convolution's shapes and arguments for the conv tests (tests/kernels/test_conv.cpp on the CPU,
// tests/cuda/test_conv.cpp on the GPU).
#pragma once

#include <string>

#include "core/op_table_conv.h"
#include "core/ops.h"

namespace frugal::testing {

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw;
  Size2 stride = 1, pad = 0, dil = 1;
  int64_t groups = 1;
  bool bias = true;
  std::string str() const {
    return ::frugal::detail::str_cat("x [", n, ", ", c, ", ", h, ", ", w, "] w [", o, ", ", c / groups, ", ",
                                     kh, ", ", kw, "] stride (", stride.h, ", ", stride.w, ") pad (", pad.h,
                                     ", ", pad.w, ") dil (", dil.h, ", ", dil.w, ") groups ", groups,
                                     bias ? " bias" : " no bias");
  }
  Shape x_shape() const { return {n, c, h, w}; }
  Shape w_shape() const { return {o, c / groups, kh, kw}; }
  int64_t oh() const { return (h + 2 * pad.h - dil.h * (kh - 1) - 1) / stride.h + 1; }
  int64_t ow() const { return (w + 2 * pad.w - dil.w * (kw - 1) - 1) / stride.w + 1; }
  Shape y_shape() const { return {n, o, oh(), ow()}; }
  ConvArgs args() const {
    ConvArgs a;
    a.n = n, a.c = c, a.h = h, a.w = w, a.o = o, a.kh = kh, a.kw = kw, a.oh = oh(), a.ow = ow();
    a.stride_h = stride.h, a.stride_w = stride.w, a.pad_h = pad.h, a.pad_w = pad.w;
    a.dil_h = dil.h, a.dil_w = dil.w, a.groups = groups;
    return a;
  }
};

}  // namespace frugal::testing
