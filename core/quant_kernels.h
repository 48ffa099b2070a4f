// The int8 GEMM behind nn::quant's QuantizedLinear and QuantizedConv2d (kernels/cpu/quant.cpp): u8
// activations with a zero point times s8 weights, accumulated in s32. The CPU's kernels are plain
// declarations, which nn/quant.cpp (their one caller) calls directly for the convolution and the CPU's input
// quantisation; QuantizedLinear's GEMM on every device, and its input quantisation on a GPU, go through the
// three op tables first below, whose CPU kernels are these same functions.
#pragma once

#include <cstdint>

#include "core/op_table_conv.h"

namespace frugal {

// nn::quant's input quantisation and int8 GEMM as op tables, for QuantizedLinear on a GPU
// (kernels/cuda/quant.cu; the CPU kernels in kernels/cpu/quant.cpp are cpu::quantize_u8 and cpu::int8_linear
// below, and stand in for the GPU's on the tests' stand-in GPU). Pointers are in the device's memory.
//
// The range a dynamic quantisation is chosen from: lo_hi[0] = min(0, every x[i]), lo_hi[1] = max(0, every
// x[i]), a NaN passed over (quant::choose_input_qparams's rule: an order-independent result). Keyed by F32.
struct ValueRangeArgs {
  const float* x = nullptr;
  int64_t n = 0;
  float* lo_hi = nullptr;  // 2 floats
};
using ValueRangeKernel = void(const ValueRangeArgs& args);
extern OpTable<ValueRangeKernel> op_value_range;
// out[i] = cpu::quantize_u8's code of x[i] (below), bit for bit. Keyed by F32.
struct QuantizeU8Args {
  const float* x = nullptr;
  int64_t n = 0;
  float inv_scale = 1;
  int32_t zero_point = 0, qmax = 127;
  uint8_t* out = nullptr;
};
using QuantizeU8Kernel = void(const QuantizeU8Args& args);
extern OpTable<QuantizeU8Kernel> op_quantize_u8;
// out = cpu::int8_linear's (below) of codes x (m, k) at most 127 (nn::quant's 7-bit codes, which a GPU reads
// as s8), bit for bit. Keyed by U8.
struct Int8LinearArgs {
  const uint8_t* x = nullptr;
  int32_t x_zero_point = 0;
  const int8_t* w = nullptr;     // (n, k)
  const float* scale = nullptr;  // (n)
  const float* bias = nullptr;   // (n) or null
  float* out = nullptr;          // (m, n)
  int64_t m = 0, k = 0, n = 0;
  bool relu = false;
};
using Int8LinearKernel = void(const Int8LinearArgs& args);
extern OpTable<Int8LinearKernel> op_int8_linear;

}  // namespace frugal

namespace frugal::cpu {

// acc[i, j] = sum_p (x[i, p] - x_zero_point) * w[j, p]                        x (m, k) u8, w (n, k) s8
// out[i, j] = float(acc[i, j]) * scale[j] (+ bias[j] when bias is non-null)  out (m, n) f32, scale (n)
//             then max(out[i, j], 0) when relu
// All dense row-major. oneDNN's int8 matmul when built with it, the reference loops otherwise (or where
// oneDNN declines the shape).
void int8_linear(const uint8_t* x, int32_t x_zero_point, const int8_t* w, const float* scale,
                 const float* bias, float* out, int64_t m, int64_t k, int64_t n, bool relu = false);
// int8_linear with x given as its transpose, xt (k, m) row-major (x[i, p] = xt[p * m + i]): a convolution's
// patches laid out one row per (channel, kernel offset), each contiguous over the output pixels.
void int8_linear_xt(const uint8_t* xt, int32_t x_zero_point, const int8_t* w, const float* scale,
                    const float* bias, float* out, int64_t m, int64_t k, int64_t n, bool relu = false);
// The u8 codes of f32 activations: out[i] = clamp(round(x[i] * inv_scale) + zero_point, 0, qmax), rounding
// half to even (as PyTorch); inv_scale is 1 / the scale, computed by the caller. A NaN gets code 0, the
// bottom of the range. nn::quant's input quantisation (quant::quantize_input) and the convolution below both
// take it.
void quantize_u8(const float* x, int64_t n, float inv_scale, int32_t zero_point, int32_t qmax, uint8_t* out);
// lo = min(0, every x[i]), hi = max(0, every x[i]), a NaN passed over: the range quant::choose_input_qparams
// chooses from.
void value_range(const float* x, int64_t n, float& lo, float& hi);
// The input of int8_conv2d: a.x is f32 values [n, c, h, w], quantised as quantize_u8 does (inv_scale,
// zero_point, qmax) a chunk of images at a time, never as a whole; or, with nhwc_codes, a.x is those codes
// already made, u8 [n, h, w, c] (channels last, as conv2d_relu_pool2_codes writes them).
struct Int8ConvInput {
  float inv_scale;
  int32_t zero_point, qmax;
  bool nhwc_codes = false;
};
// int8 convolution, groups 1, over a's geometry: a.x as `in` says, a.weight s8 [o, c, kh, kw], a.bias f32 [o]
// or null, a.y f32 [n, o, oh, ow]:
// y[n, o, p] = float(sum over the patch of (code(x) - zero_point) * w) * scale[o] (+ bias[o]), then the ReLU
// when relu; the padding counts as the zero point's code (the value 0.0). With pool2, a.y is instead
// [n, o, oh / 2, ow / 2]: that y max-pooled over 2 x 2 windows at stride 2, as max_pool2d(y, 2) gives it
// (only the pooled values are written). A chunk of images at a time, with working memory from the arena:
// oneDNN's int8 convolution over channels-last codes where it has a kernel for the shape, else im2col into
// int8_linear_xt.
// With `codes` (pool2 only), the pooled output goes there as the next layer's input codes instead of a.y:
// codes->y u8 [n, o * (oh / 2) * (ow / 2)] in y's NCHW order, each value quantised as quantize_u8 does.
struct Int8ConvCodes {
  uint8_t* y;
  float inv_scale;
  int32_t zero_point, qmax;
};
void int8_conv2d(const ConvArgs& a, const Int8ConvInput& in, const float* scale, bool relu = false,
                 bool pool2 = false, const Int8ConvCodes* codes = nullptr);
// int8_conv2d's twin on the meta device (Note [the meta device]): the working memory it takes from the arena
// for this geometry (codes, oneDNN's reordered weights and scratchpad or im2col's patches, the chunk's sums
// and pooled values), as meta blocks in its order, with nothing computed; codes_out stands for `codes`.
void int8_conv2d_meta(const ConvArgs& a, const Int8ConvInput& in, bool pool2, bool codes_out);
// ops::conv2d_relu_pool2 of a's f32 geometry (a.y unused), its pooled output written as the codes of the
// int8 layer after it instead: codes u8 [n, oh / 2, ow / 2, o] = quantize_u8 of the pooled values (inv_scale,
// zero_point, qmax), channels last, bit for bit, and no f32 pooled output is made. False, with nothing
// written, where the build has no oneDNN (the fused kernel's). In kernels/cpu/conv.cpp.
bool conv2d_relu_pool2_codes(const ConvArgs& a, uint8_t* codes, float inv_scale, int32_t zero_point,
                             int32_t qmax);
// Its twin on the meta device: the working memory it takes, as meta blocks in its order; false as it.
bool conv2d_relu_pool2_codes_meta(const ConvArgs& a);
// Whether int8_conv2d may take oneDNN's int8 convolution (the default); false runs the im2col path, for the
// tests that check both. A no-op without oneDNN.
void set_int8_conv_onednn(bool use);
// The s32 accumulators alone, acc (m, n); for the tests' exact comparison with the reference.
void int8_linear_s32(const uint8_t* x, int32_t x_zero_point, const int8_t* w, int32_t* acc, int64_t m,
                     int64_t k, int64_t n);
// The naive reference of both (plain loops).
void int8_linear_reference(const uint8_t* x, int32_t x_zero_point, const int8_t* w, const float* scale,
                           const float* bias, float* out, int64_t m, int64_t k, int64_t n, bool relu = false);
void int8_linear_s32_reference(const uint8_t* x, int32_t x_zero_point, const int8_t* w, int32_t* acc,
                               int64_t m, int64_t k, int64_t n);
// Whether int8_linear runs through oneDNN for this shape (false: the reference loops).
bool int8_linear_uses_onednn(int64_t m, int64_t k, int64_t n);
// int8_linear's twin on the meta device (Note [the meta device]): the working memory int8_linear takes from
// the arena for this shape (oneDNN's scratchpad, whose size depends on the ISA), as meta bytes, taken and
// given back as int8_linear does, so that a dry run of a quantised model sees it.
void int8_linear_meta(int64_t m, int64_t k, int64_t n);

}  // namespace frugal::cpu
