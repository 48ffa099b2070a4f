// im2col for the CPU convolutions: the f32 path's fallback (kernels/cpu/conv.cpp) and the int8 one
// (kernels/cpu/quant.cpp, whose padding is the zero point's code rather than 0).
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/op_table_conv.h"

namespace frugal::cpu {

// The columns of one image x [c, h, w]: row (c, i, j), at col + ((c * kh + i) * kw + j) * row_stride, holds
// for each of the oh * ow output positions the input it reads through tap (i, j), `pad` where that falls in
// the padding. row_stride >= oh * ow (larger: several images side by side in one row).
template <typename T>
void im2col(const ConvArgs& a, const T* x, T* col, int64_t row_stride, T pad) {
  const int64_t ohw = a.oh * a.ow;
  for (int64_t c = 0; c < a.c; ++c)
    for (int64_t i = 0; i < a.kh; ++i)
      for (int64_t j = 0; j < a.kw; ++j) {
        T* row = col + ((c * a.kh + i) * a.kw + j) * row_stride;
        const T* plane = x + c * a.h * a.w;
        const int64_t off_w = j * a.dil_w - a.pad_w,
                      off_h = i * a.dil_h - a.pad_h;  // iw = ow * stride + off_w
        // The output columns whose iw lies in [0, w): [ow_lo, ow_hi).
        const int64_t ow_lo = std::min(a.ow, off_w >= 0 ? 0 : (-off_w + a.stride_w - 1) / a.stride_w);
        const int64_t ow_hi = std::max(
            ow_lo, std::min(a.ow, a.w - off_w > 0 ? (a.w - off_w + a.stride_w - 1) / a.stride_w : 0));
        if (a.stride_h == 1 && a.stride_w == 1 && a.ow == a.w && ow_lo < ow_hi) {
          // Consecutive output rows read consecutive input rows: one copy of the valid rows' span, then the
          // padding (the rows above and below, the few columns at each row's ends).
          const int64_t oh_lo = std::clamp<int64_t>(-off_h, 0, a.oh),
                        oh_hi = std::clamp<int64_t>(a.h - off_h, oh_lo, a.oh);
          std::fill_n(row, oh_lo * a.ow, pad);
          if (oh_lo < oh_hi) {
            std::copy(plane + (oh_lo + off_h) * a.w + ow_lo + off_w,
                      plane + (oh_hi - 1 + off_h) * a.w + ow_hi + off_w, row + oh_lo * a.ow + ow_lo);
            for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
              std::fill(row + oh * a.ow, row + oh * a.ow + ow_lo, pad);
              std::fill(row + oh * a.ow + ow_hi, row + (oh + 1) * a.ow, pad);
            }
          }
          std::fill(row + oh_hi * a.ow, row + ohw, pad);
          continue;
        }
        for (int64_t oh = 0; oh < a.oh; ++oh) {
          const int64_t ih = oh * a.stride_h + off_h;
          T* out = row + oh * a.ow;
          if (ih < 0 || ih >= a.h) {
            std::fill(out, out + a.ow, pad);
            continue;
          }
          const T* in = plane + ih * a.w + off_w;
          std::fill(out, out + ow_lo, pad);
          for (int64_t ow = ow_lo; ow < ow_hi; ++ow) out[ow] = in[ow * a.stride_w];
          std::fill(out + ow_hi, out + a.ow, pad);
        }
      }
}

}  // namespace frugal::cpu
