// The pooling kernels' entry points for other CPU kernels (kernels/cpu/pool.cpp). Internal to kernels/cpu.
#pragma once

#include <cstdint>

namespace frugal::cpu {

// max_pool2d over 2 x 2 windows at stride 2 (no padding or dilation) of a convolution's output left in
// oneDNN's blocked layout: x is [blocks][oh][ow][block] (aBcd8b or aBcd16b with blocks = n * o / block, so
// o a multiple of block), y NCHW [n, o, oh / 2, ow / 2]. The taps in the NCHW kernel's order under its rule
// (strictly greater wins, so ties keep the first; a NaN wins, and a later NaN replaces it): y is
// max_pool2d's of x reordered to NCHW, bit for bit, without that reorder or its buffer; relu: of relu(x)
// (each tap under relu's rule, v < 0 ? 0 : v), conv2d_relu_pool2's.
void max_pool2x2_blocked_to_nchw(const float* x, float* y, int64_t blocks, int64_t oh, int64_t ow,
                                 int64_t block, bool relu);
// The same windows of `images` images of `channels` channels (x: [images][channels / block][oh][ow][block]),
// each maximum then quantised as quantize_u8 does (core/quant_kernels.h: inv_scale, zero_point, qmax) and
// written channels last: y is u8 [images, oh / 2, ow / 2, channels], quantize_u8 of
// max_pool2x2_blocked_to_nchw's y transposed, bit for bit, with no f32 pooled output at all. For an int8
// convolution that reads the codes channels last (nn::quant's QuantizedConv2d after a Conv2d, a ReLU and a
// MaxPool2d(2)).
void max_pool2x2_blocked_to_nhwc_u8(const float* x, uint8_t* y, int64_t images, int64_t channels, int64_t oh,
                                    int64_t ow, int64_t block, bool relu, float inv_scale, int32_t zero_point,
                                    int32_t qmax);

}  // namespace frugal::cpu
