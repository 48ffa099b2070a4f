// The op tables of one family, with their argument structs. 2-D convolution and pooling (core/ops_conv.cpp,
// kernels/*/conv*, kernels/*/pool.*). The tables themselves are core/op_table.h's OpTable; a family's header
// is included only by its ops, its kernels and their tests, so a new op of one family recompiles only that
// family.
#pragma once

#include <atomic>

#include "op_table.h"

namespace frugal {

// 2-D convolution over contiguous NCHW tensors, PyTorch semantics. With ih = oh * stride_h - pad_h + kh *
// dil_h (iw likewise; positions outside the input read as zero) and c running over input channel group
// g = o / (out_channels / groups):
//   forward:         y[n, o, oh, ow]   = bias[o] + sum_{c, kh, kw} x[n, c, ih, iw] * weight[o, c', kh, kw]
//   backward_data:   dx[n, c, ih, iw]  = sum_{o, kh, kw} dy[n, o, oh, ow] * weight[o, c', kh, kw]
//   backward_weight: dweight[o, c', kh, kw] = sum_{n, oh, ow} dy[n, o, oh, ow] * x[n, c, ih, iw];
//                    dbias[o] = sum_{n, oh, ow} dy[n, o, oh, ow] (when dbias is not null)
// Each direction reads the pointers it names and overwrites its output(s) entirely.
//   backward (both directions in one call, conv2d's rule): dx when dx is not null (weight read), dweight and
//                    dbias (when not null) from x; with relu_y (conv2d_relu's output y) not null, every dy
//                    above reads as relu_y > 0 ? dy : 0 (relu_backward's select). The same values as
//                    relu_backward and the two directions' kernels.
struct ConvArgs {
  int64_t n = 0, c = 0, h = 0, w = 0;  // x: [n, c, h, w]
  int64_t o = 0, kh = 0, kw = 0;       // weight: [o, c / groups, kh, kw]
  int64_t oh = 0, ow = 0;              // y: [n, o, oh, ow]
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1, groups = 1;
  const void* x = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;  // forward: null when there is no bias
  const void* dy = nullptr;
  void* y = nullptr;
  void* dx = nullptr;
  void* dweight = nullptr;
  void* dbias = nullptr;  // backward_weight: null when there is no bias
  bool relu = false;  // forward: y = max(0, y) as y is stored (conv2d_relu); every forward kernel obeys it
  const void* relu_y = nullptr;  // backward: dy masked by relu_y > 0 (conv2d_relu's rule); null: none
};
using ConvKernel = void(const ConvArgs& args);
extern OpTable<ConvKernel> op_conv2d;
extern OpTable<ConvKernel> op_conv2d_backward_data;
extern OpTable<ConvKernel> op_conv2d_backward_weight;
extern OpTable<ConvKernel> op_conv2d_backward;  // both directions; where a device has no kernel, the ops
                                                // compose relu_backward and the two above
// The forward, then max_pool2d over 2 x 2 windows at stride 2 (no padding or dilation; floor): y is the
// pooled [n, o, oh / 2, ow / 2], and relu is always set (ops::conv2d_relu_pool2). Where a device has no
// kernel, the op composes conv2d_relu and max_pool2d.
extern OpTable<ConvKernel> op_conv2d_relu_pool2;

// 2-D pooling over the n * c planes of contiguous NCHW tensors, PyTorch semantics. Window (oh, ow) covers
// ih = oh * stride_h - pad_h + i * dil_h for i < kh (iw likewise); padding never wins a max and counts in
// an average only with count_include_pad.
//   max:     y = the largest element of the window (the first one on ties; NaN propagates);
//            indices[n, c, oh, ow] = ih * w + iw of that element (PyTorch's convention)
//   max backward: dx (zeroed by the kernel) gets dy at each index, summed where windows overlap
//   avg:     y = sum of the window / (window size, or count of in-range elements without count_include_pad)
//   avg backward: dx (zeroed by the kernel) gets dy / divisor at every in-range window element
struct PoolArgs {
  int64_t planes = 0, h = 0, w = 0, oh = 0,
          ow = 0;  // x, dx: [planes, h, w]; y, dy, indices: [planes, oh, ow]
  int64_t kh = 1, kw = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  bool count_include_pad = true;
  const void* x = nullptr;
  const void* dy = nullptr;
  void* y = nullptr;
  void* dx = nullptr;
  int64_t* indices = nullptr;           // max forward: written, unless null (no backward will read them)
  const int64_t* indices_in = nullptr;  // max backward: read; -1 (a window with no tap) adds nothing
  // max backward: where a kernel that checks its indices stores one outside [-1, h w) (and skips it); null
  // for none. The CPU's kernels check; the CUDA ones skip such an index without saying so.
  std::atomic<int64_t>* bad_index = nullptr;
};
using PoolKernel = void(const PoolArgs& args);
extern OpTable<PoolKernel> op_max_pool2d;
extern OpTable<PoolKernel> op_max_pool2d_backward;
extern OpTable<PoolKernel> op_avg_pool2d;
extern OpTable<PoolKernel> op_avg_pool2d_backward;

}  // namespace frugal
