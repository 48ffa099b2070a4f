// Naive reference kernels: the plainest loops, in f64, that the fast kernels are tested and benchmarked
// against.
#pragma once

#include <array>
#include <string>

#include "core/op_table_conv.h"
#include "core/op_table_linalg.h"
#include "core/op_table_optim.h"

namespace frugal::reference {

// C = alpha * A @ B + beta * C over GemmArgs, each element summed in f64.
template <typename T>
void gemm(const GemmArgs& g) {
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < g.k; ++p)
          s += double(static_cast<const T*>(g.a)[b * g.a_batch + i * g.a_row + p * g.a_col]) *
               double(static_cast<const T*>(g.b)[b * g.b_batch + p * g.b_row + j * g.b_col]);
        T& c = static_cast<T*>(g.c)[b * g.c_batch + i * g.c_row + j];
        c = T(g.alpha * s + (g.beta == 0 ? 0.0 : g.beta * double(c)));
      }
}

// Convolution straight from the definition in core/op_table.h (ConvArgs), each element summed in f64. Also
// the f64 kernel, so that gradcheck in f64 checks the autograd rules against the definition itself.
template <typename T>
void conv2d_forward(const ConvArgs& a) {
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.weight);
  const T* bias = static_cast<const T*>(a.bias);
  T* y = static_cast<T*>(a.y);
  const int64_t cg = a.c / a.groups, og = a.o / a.groups;
  for (int64_t n = 0; n < a.n; ++n)
    for (int64_t o = 0; o < a.o; ++o)
      for (int64_t oh = 0; oh < a.oh; ++oh)
        for (int64_t ow = 0; ow < a.ow; ++ow) {
          double s = bias ? double(bias[o]) : 0.0;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t kh = 0; kh < a.kh; ++kh)
              for (int64_t kw = 0; kw < a.kw; ++kw) {
                const int64_t ih = oh * a.stride_h - a.pad_h + kh * a.dil_h;
                const int64_t iw = ow * a.stride_w - a.pad_w + kw * a.dil_w;
                if (ih < 0 || ih >= a.h || iw < 0 || iw >= a.w) continue;
                const int64_t c = (o / og) * cg + ci;
                s += double(x[((n * a.c + c) * a.h + ih) * a.w + iw]) *
                     double(w[((o * cg + ci) * a.kh + kh) * a.kw + kw]);
              }
          y[((n * a.o + o) * a.oh + oh) * a.ow + ow] = T(s);
        }
}

template <typename T>
void conv2d_backward_data(const ConvArgs& a) {
  const T* dy = static_cast<const T*>(a.dy);
  const T* w = static_cast<const T*>(a.weight);
  T* dx = static_cast<T*>(a.dx);
  const int64_t cg = a.c / a.groups, og = a.o / a.groups;
  for (int64_t n = 0; n < a.n; ++n)
    for (int64_t c = 0; c < a.c; ++c)
      for (int64_t ih = 0; ih < a.h; ++ih)
        for (int64_t iw = 0; iw < a.w; ++iw) {
          double s = 0;
          const int64_t g = c / cg, ci = c % cg;
          for (int64_t o = g * og; o < (g + 1) * og; ++o)
            for (int64_t kh = 0; kh < a.kh; ++kh)
              for (int64_t kw = 0; kw < a.kw; ++kw) {
                // The output position that reads x[ih, iw] through tap (kh, kw), if any.
                const int64_t th = ih + a.pad_h - kh * a.dil_h, tw = iw + a.pad_w - kw * a.dil_w;
                if (th < 0 || tw < 0 || th % a.stride_h || tw % a.stride_w) continue;
                const int64_t oh = th / a.stride_h, ow = tw / a.stride_w;
                if (oh >= a.oh || ow >= a.ow) continue;
                s += double(dy[((n * a.o + o) * a.oh + oh) * a.ow + ow]) *
                     double(w[((o * cg + ci) * a.kh + kh) * a.kw + kw]);
              }
          dx[((n * a.c + c) * a.h + ih) * a.w + iw] = T(s);
        }
}

template <typename T>
void conv2d_backward_weight(const ConvArgs& a) {
  const T* dy = static_cast<const T*>(a.dy);
  const T* x = static_cast<const T*>(a.x);
  T* dw = static_cast<T*>(a.dweight);
  T* db = static_cast<T*>(a.dbias);
  const int64_t cg = a.c / a.groups, og = a.o / a.groups;
  for (int64_t o = 0; o < a.o; ++o) {
    for (int64_t ci = 0; ci < cg; ++ci)
      for (int64_t kh = 0; kh < a.kh; ++kh)
        for (int64_t kw = 0; kw < a.kw; ++kw) {
          double s = 0;
          const int64_t c = (o / og) * cg + ci;
          for (int64_t n = 0; n < a.n; ++n)
            for (int64_t oh = 0; oh < a.oh; ++oh)
              for (int64_t ow = 0; ow < a.ow; ++ow) {
                const int64_t ih = oh * a.stride_h - a.pad_h + kh * a.dil_h;
                const int64_t iw = ow * a.stride_w - a.pad_w + kw * a.dil_w;
                if (ih < 0 || ih >= a.h || iw < 0 || iw >= a.w) continue;
                s += double(dy[((n * a.o + o) * a.oh + oh) * a.ow + ow]) *
                     double(x[((n * a.c + c) * a.h + ih) * a.w + iw]);
              }
          dw[((o * cg + ci) * a.kh + kh) * a.kw + kw] = T(s);
        }
    if (db) {
      double s = 0;
      for (int64_t n = 0; n < a.n; ++n)
        for (int64_t p = 0; p < a.oh * a.ow; ++p) s += double(dy[(n * a.o + o) * a.oh * a.ow + p]);
      db[o] = T(s);
    }
  }
}

}  // namespace frugal::reference

namespace frugal {
// The registered f32 convolution kernels' layout policy for oneDNN: true lets oneDNN pick its blocked layout
// (format_tag::any, with reorders from and to NCHW; the default), false makes it compute on NCHW directly.
// For the tests and the benchmark that compares both; a no-op without oneDNN.
void set_conv_onednn_any_layout(bool any);
// Whether oneDNN may run a convolution with its Winograd kernel where it expects that to be faster, for a
// scratchpad of several MiB (Note [Winograd convolutions] in kernels/cpu/conv_onednn.cpp); false, the
// default, keeps every convolution direct.
void set_conv_onednn_winograd(bool winograd);
// oneDNN's names for the kernels the registered CPU convolution runs for `a` in `dtype` (f32 or bf16), as
// {forward, backward data, backward weight}: e.g. "jit:avx512_core" or "jit_wino_4x3:avx512_core"; empty
// where oneDNN declines the shape or the build has no oneDNN. The backward weight plan has a bias when
// a.dbias is set. The plans of a's whole batch: past 64 images a forward runs the plans of its chunks (Note
// [a large batch's forward in chunks] in kernels/cpu/conv.cpp).
std::array<std::string, 3> conv2d_onednn_implementations(const ConvArgs& a, DType dtype);
// The portable f32 convolution (im2col + the registered GEMM), the build's fallback when oneDNN is absent,
// callable beside the registered kernels.
void conv2d_forward_im2col_cpu(const ConvArgs& a);
void conv2d_backward_data_im2col_cpu(const ConvArgs& a);
void conv2d_backward_weight_im2col_cpu(const ConvArgs& a);
}  // namespace frugal

namespace frugal {
// The Eigen f32 GEMM (the build's fallback when oneDNN is absent), callable beside the registered kernel.
void gemm_f32_eigen_cpu(const GemmArgs& g);
// The 16-bit GEMMs that widen tiles to f32 for the registered f32 GEMM (f16's registered kernel; bf16's
// without oneDNN or for a layout oneDNN declines), callable beside the registered kernels.
void gemm_bf16_widened_cpu(const GemmArgs& g);
void gemm_f16_widened_cpu(const GemmArgs& g);
// The workspace the registered f32 GEMM takes for g: B's panels (Note [B's rows 2 KiB apart],
// kernels/cpu/gemm.cpp), 0 when it multiplies B as it lies.
int64_t gemm_f32_panel_bytes(const GemmArgs& g);
}  // namespace frugal

namespace frugal {
// The naive Adam8bit update (op_adam8bit_step's definition, kernels/cpu/optim8bit_reference.cpp) for a
// parameter of `dtype`: one element at a time, each code by a scan of every entry of its code (the dynamic
// code's or, with args.float8, the float8 code's). The registered kernel equals it bit for bit.
void adam8bit_step_reference_cpu(DType dtype, const Adam8bitStepArgs& a);
// The code of q in the signed or unsigned dynamic code (kernels/dynamic_code.h): the CPU kernel's bucket
// search and the reference's scan of every entry.
uint8_t dynamic_code_quantize_cpu(bool is_signed, float q);
uint8_t dynamic_code_quantize_reference(bool is_signed, float q);
// codes[i] = the code of q[i], i < n, by the CPU kernel's block quantiser (with AVX2, 32 at a time).
void dynamic_code_quantize_block_cpu(bool is_signed, const float* q, uint8_t* codes, int64_t n);
// The float8 codes (kernels/float8_code.h) from their definition: a code's value, and a value's code by a
// scan of every code for the nearest.
double float8_code_decode_reference(bool is_signed, uint8_t code);
uint8_t float8_code_encode_reference(bool is_signed, float q);
// codes1[i] = float8_code::encode_signed(m[i]), codes2[i] = encode_unsigned(root[i]), i < n, by the CPU
// kernel's block encoder (with AVX2, 32 at a time).
void float8_code_encode_block_cpu(const float* m, uint8_t* codes1, const float* root, uint8_t* codes2,
                                  int64_t n);
}  // namespace frugal
