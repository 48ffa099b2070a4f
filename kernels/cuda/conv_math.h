// The index math of the CUDA convolution and pooling kernels (kernels/cuda/conv.cu, pool.cu), callable from
// host and device so that tests/cuda/test_conv_math.cpp checks it on the host against the CPU kernels'
// loops. Geometry comes in the op tables' own argument structs (ConvArgs, PoolArgs in core/op_table.h).
//
// The im2col fallback's column buffer holds a chunk of images side by side: col [c * kh * kw, images * oh *
// ow], row (c, i, j) and column (image, oh, ow) reading x[image, c, ih, iw] through tap (i, j). The adjoint
// (col2im) is a gather: each input element sums the column entries that read it, in the order the CPU's
// col2im_add adds them (taps i, j ascending), so no atomics are needed.
#pragma once

#include <cstdint>

#include "core/op_table_conv.h"
#include "kernels/cuda/math.h"

namespace frugal::math {

// Floor and ceiling of a / b for b > 0, a of any sign.
FRUGAL_HOST_DEVICE inline int64_t floor_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}
FRUGAL_HOST_DEVICE inline int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

// The offset in x (images of [c, h, w] from the chunk's first) that column entry (row, q) reads, or -1 where
// the tap falls in the padding (the entry is zero).
FRUGAL_HOST_DEVICE inline int64_t im2col_source(const ConvArgs& a, int64_t row, int64_t q) {
  const int64_t ohw = a.oh * a.ow;
  const int64_t image = q / ohw, p = q - image * ohw, oh = p / a.ow, ow = p - oh * a.ow;
  const int64_t t = row / a.kw, j = row - t * a.kw, c = t / a.kh, i = t - c * a.kh;
  const int64_t ih = oh * a.stride_h - a.pad_h + i * a.dil_h, iw = ow * a.stride_w - a.pad_w + j * a.dil_w;
  if (ih < 0 || ih >= a.h || iw < 0 || iw >= a.w) return -1;
  return ((image * a.c + c) * a.h + ih) * a.w + iw;
}

// Calls f(i, j, oh, ow) for every tap (i, j) of every output position (oh, ow) that reads input (ih, iw),
// taps in ascending order.
template <typename F>
FRUGAL_HOST_DEVICE void for_each_reader(const ConvArgs& a, int64_t ih, int64_t iw, F f) {
  for (int64_t i = 0; i < a.kh; ++i) {
    const int64_t th = ih + a.pad_h - i * a.dil_h;
    if (th < 0 || th % a.stride_h != 0 || th / a.stride_h >= a.oh) continue;
    for (int64_t j = 0; j < a.kw; ++j) {
      const int64_t tw = iw + a.pad_w - j * a.dil_w;
      if (tw < 0 || tw % a.stride_w != 0 || tw / a.stride_w >= a.ow) continue;
      f(i, j, th / a.stride_h, tw / a.stride_w);
    }
  }
}

// The offset of column entry (channel c, tap (i, j); image, output (oh, ow)) in a buffer of `images` images.
FRUGAL_HOST_DEVICE inline int64_t col_offset(const ConvArgs& a, int64_t images, int64_t image, int64_t c,
                                             int64_t i, int64_t j, int64_t oh, int64_t ow) {
  const int64_t row = (c * a.kh + i) * a.kw + j;
  return row * images * a.oh * a.ow + (image * a.oh + oh) * a.ow + ow;
}

// ---- pooling
// -----------------------------------------------------------------------------------------------

// Max over the window of output (oh, ow) in one plane, load(k) giving element k = ih * w + iw in the compute
// type C. As the CPU kernel (and PyTorch): strictly greater wins, so ties keep the first; a NaN wins, and a
// later NaN wins over an earlier one.
template <typename C, typename Load>
FRUGAL_HOST_DEVICE void max_window(const PoolArgs& a, int64_t oh, int64_t ow, Load load, C& best,
                                   int64_t& best_at) {
  const int64_t h0 = oh * a.stride_h - a.pad_h, w0 = ow * a.stride_w - a.pad_w;
  const int64_t h_end = h0 + (a.kh - 1) * a.dil_h + 1 < a.h ? h0 + (a.kh - 1) * a.dil_h + 1 : a.h;
  const int64_t w_end = w0 + (a.kw - 1) * a.dil_w + 1 < a.w ? w0 + (a.kw - 1) * a.dil_w + 1 : a.w;
  // The first in-range tap along each dim.
  const int64_t hs = h0 < 0 ? h0 + ceil_div(-h0, a.dil_h) * a.dil_h : h0;
  const int64_t ws = w0 < 0 ? w0 + ceil_div(-w0, a.dil_w) * a.dil_w : w0;
  best = lowest_<C>();
  best_at =
      hs < h_end && ws < w_end ? hs * a.w + ws : -1;  // Note [a window with no tap] (kernels/cpu/pool.cpp)
  for (int64_t ih = hs; ih < h_end; ih += a.dil_h)
    for (int64_t iw = ws; iw < w_end; iw += a.dil_w) {
      const C v = load(ih * a.w + iw);
      if (v > best || isnan_(v)) {
        best = v;
        best_at = ih * a.w + iw;
      }
    }
}

// An average window's rows [h0, h1) and columns [w0, w1) clipped to the input, and its divisor. As the CPU
// kernel (and PyTorch): the window is clipped to the padded input first (its size is the divisor with
// count_include_pad), then to the input itself.
struct AvgWindow {
  int64_t h0, h1, w0, w1, divisor;
  FRUGAL_HOST_DEVICE AvgWindow(const PoolArgs& a, int64_t oh, int64_t ow) {
    h0 = oh * a.stride_h - a.pad_h;
    w0 = ow * a.stride_w - a.pad_w;
    h1 = h0 + a.kh < a.h + a.pad_h ? h0 + a.kh : a.h + a.pad_h;
    w1 = w0 + a.kw < a.w + a.pad_w ? w0 + a.kw : a.w + a.pad_w;
    const int64_t padded = (h1 - h0) * (w1 - w0);
    h0 = h0 < 0 ? 0 : h0;
    w0 = w0 < 0 ? 0 : w0;
    h1 = h1 < a.h ? h1 : a.h;
    w1 = w1 < a.w ? w1 : a.w;
    divisor = a.count_include_pad ? padded : (h1 - h0) * (w1 - w0);
  }
  FRUGAL_HOST_DEVICE bool contains(int64_t ih, int64_t iw) const {
    return ih >= h0 && ih < h1 && iw >= w0 && iw < w1;
  }
};

// The output rows [first, last] whose average windows can cover input row ih (columns likewise with the _w
// fields): windows start at o * stride - pad and span kernel elements.
FRUGAL_HOST_DEVICE inline void covering_outputs(int64_t i, int64_t kernel, int64_t stride, int64_t pad,
                                                int64_t outputs, int64_t& first, int64_t& last) {
  first = ceil_div(i + pad - kernel + 1, stride);
  first = first < 0 ? 0 : first;
  last = floor_div(i + pad, stride);
  last = last < outputs - 1 ? last : outputs - 1;
}

// Average-pooling backward at input (ih, iw) of one plane: the sum of dy / divisor over the windows that
// cover it, in the CPU kernel's order (outputs ascending), dy(k) giving output k = oh * ow_size + ow in C.
template <typename C, typename Dy>
FRUGAL_HOST_DEVICE C avg_pool_input_grad(const PoolArgs& a, int64_t ih, int64_t iw, Dy dy) {
  int64_t oh0, oh1, ow0, ow1;
  covering_outputs(ih, a.kh, a.stride_h, a.pad_h, a.oh, oh0, oh1);
  covering_outputs(iw, a.kw, a.stride_w, a.pad_w, a.ow, ow0, ow1);
  C s = 0;
  for (int64_t oh = oh0; oh <= oh1; ++oh)
    for (int64_t ow = ow0; ow <= ow1; ++ow) {
      const AvgWindow win(a, oh, ow);
      if (win.divisor > 0 && win.contains(ih, iw)) s += dy(oh * a.ow + ow) / C(win.divisor);
    }
  return s;
}

}  // namespace frugal::math
