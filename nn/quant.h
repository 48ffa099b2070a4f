// int8 quantisation (dynamic post-training): nn::quant::quantize_dynamic replaces every Linear of a model by
// a QuantizedLinear, whose weight is int8 with one symmetric scale per output row and whose input is
// quantised per batch to u8 with a zero point; the GEMM is int8 (kernels/cpu/quant.cpp, oneDNN's u8 x s8 ->
// s32 matmul). A QuantizedLinear also runs on a GPU, with the same output bit for bit (cuBLASLt's s8 GEMM:
// Note [an int8 layer on a GPU] in nn/quant.cpp); the other int8 layers run on the cpu only.
//
//   nn::quant::quantize_dynamic(*model);   // every Linear -> QuantizedLinear; the f32 weights are freed
//   NoGradGuard ng;  Tensor y = model->forward(x);
//
// Note [quantised state_dict]: a QuantizedLinear holds, as buffers (so they are in state_dict):
//   <path>.weight        [out, in]  int8 values, held in a U8 tensor (frugal has no I8 dtype yet: the bytes
//                                   are two's complement int8); saved as safetensors "I8" when its name is
//                                   passed in int8_names (quant::int8_names, Note [int8 as I8] in
//                                   io/safetensors.h)
//   <path>.weight_scale  [out]      f32, w ~= weight[o, :] * weight_scale[o], weight_scale = max|w[o, :]| /
//                                   127
//   <path>.bias          [out]      f32 (absent for Linear without bias)
// The input scale/zero point are computed per forward (dynamic), so they are not stored; a static one
// (quant::convert) also holds <path>.input_scale (f32 [1]) and <path>.input_zero_point (i32 [1]). A
// QuantizedConv2d holds the same names, its weight [out, in, kH, kW].
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../core/tensor.h"
#include "conv.h"
#include "module.h"
#include "module_holder.h"

namespace frugal::nn {

class LinearImpl;
namespace quant {
// A per-tensor u8 activation quantisation: code = clamp(round(x / scale) + zero_point, 0, kInputQMax).
struct InputQuant {
  float scale;
  int32_t zero_point;
};
}  // namespace quant

class QuantizedLinearImpl : public Module {
 public:
  // Quantises `weight` (f32 [out, in]) per output row; `bias` (f32 [out]) may be undefined.
  QuantizedLinearImpl(const Tensor& weight, const Tensor& bias);
  // Static activation quantisation: the input's scale and zero point fixed (from QAT or calibration), held
  // as buffers "input_scale" (f32 [1]) and "input_zero_point" (i32 [1]).
  QuantizedLinearImpl(const Tensor& weight, const Tensor& bias, float input_scale, int32_t input_zero_point);
  // An empty one of this size (weights zero, scales one) for load_state_dict; `static_input` adds the input
  // buffers (scale 1, zero point 0 until loaded), as QuantizedConv2d's.
  QuantizedLinearImpl(int64_t in_features, int64_t out_features, bool bias = true, bool static_input = false);
  // x [..., in] f32, not requiring grad (inference only) -> [..., out] f32.
  Tensor forward(const Tensor& x) override;
  // relu(forward(x)) in one pass over the output (Sequential runs a QuantizedLinear directly followed by a
  // ReLU this way, as it runs Linear + ReLU as one F::linear_relu).
  Tensor forward_relu(const Tensor& x);
  // forward (relu: forward_relu) of the input's codes, u8 [N, in], made with this layer's static input
  // quantisation (QuantizedConv2d::forward_staged's codes_out): the result of the f32 input they stand for,
  // bit for bit. Throws Error for a dynamic layer.
  Tensor forward_codes(const Tensor& codes, bool relu);
  // The static input quantisation (input_scale, input_zero_point), or none for a dynamic layer.
  std::optional<quant::InputQuant> static_input() const;
  // The weight this layer multiplies by, dequantised: weight[o, i] * weight_scale[o] (f32 [out, in]).
  Tensor dequantized_weight() const;
  int64_t in_features, out_features;
  Tensor weight, weight_scale, bias;     // U8 (int8 bytes) [out, in], f32 [out], f32 [out] or undefined
  Tensor input_scale, input_zero_point;  // static only (else undefined)

 private:
  Tensor run(const Tensor& x, bool relu);
  // y = the int8 GEMM of the input's codes [m, in] made with qp, on their device.
  void multiply(const Tensor& codes, quant::InputQuant qp, bool relu, Tensor& y) const;
};
FRUGAL_MODULE(QuantizedLinear);

// int8 Conv2d (groups 1; any stride, padding and dilation): weight int8 with one symmetric scale per output
// channel, held as QuantizedLinear's (Note [quantised state_dict]); the input quantised to 7-bit u8 as
// QuantizedLinear's, with its scale fixed (quant::convert) or chosen per batch (dynamic). forward lays each
// chunk of images out as u8 patches (im2col, the padding at the zero point, which is the value 0), multiplies
// them by the weights with QuantizedLinear's int8 GEMM (cpu::int8_linear) and writes NCHW f32. On the meta
// device (a dry run, memory::estimate) every form takes the blocks the cpu's takes, in the same order.
class QuantizedConv2dImpl : public Module {
 public:
  // Quantises the weight (f32 [out, in, kH, kW]) and copies the bias (f32 [out] or undefined) of a Conv2d
  // with these options; `input` fixes the input's scale and zero point (nullptr: dynamic).
  QuantizedConv2dImpl(const Conv2dOptions& options, const Tensor& weight, const Tensor& bias,
                      const quant::InputQuant* input = nullptr);
  // An empty one (weights zero, scales one) for load_state_dict; `static_input` adds the input buffers.
  QuantizedConv2dImpl(const Conv2dOptions& options, bool static_input);
  // x [N, in, H, W] f32, not requiring grad -> [N, out, OH, OW] f32.
  Tensor forward(const Tensor& x) override;
  Tensor forward_relu(const Tensor& x);  // relu(forward(x)) in the same pass (Sequential uses it)
  // max_pool2d(relu(forward(x)), 2) bit for bit, in the same pass: only the pooled quarter of the output is
  // ever written (Sequential uses it for a QuantizedConv2d, a ReLU and a MaxPool2d(2)).
  Tensor forward_relu_pool2(const Tensor& x);
  // Sequential's inference of this layer and what follows it (Note [an int8 convolution's input as codes],
  // nn/quant.cpp): the input as f32 values [N, in, H, W], or with codes_in as this layer's input codes
  // [N, H, W, in] (channels last, made with its static input quantisation by quant::conv2d_relu_pool2_codes);
  // relu and pool2 as in forward_relu and forward_relu_pool2; with codes_out (pool2 only), the pooled output
  // as the codes of that quantisation, u8 [N, out * OH/2 * OW/2] in the flattened output's order, for a
  // static QuantizedLinear after a Flatten. Each is bit for bit the modules one by one. Throws Error for
  // codes_in on a dynamic layer.
  Tensor forward_staged(const Tensor& input, bool codes_in, bool relu, bool pool2,
                        const quant::InputQuant* codes_out = nullptr);
  std::optional<quant::InputQuant> static_input() const;  // as QuantizedLinear's
  // The features of forward_relu_pool2's output for an input of H x W pixels, out * (OH / 2) * (OW / 2); 0
  // where the kernel does not fit or the output has no 2 x 2 window.
  int64_t pooled_features(int64_t H, int64_t W) const;
  Tensor dequantized_weight() const;  // weight * weight_scale per output channel, f32 [out, in, kH, kW]
  const Conv2dOptions& options() const { return options_; }
  Tensor weight, weight_scale, bias;     // U8 (int8 bytes), f32 [out], f32 [out] or undefined
  Tensor input_scale, input_zero_point;  // static only (else undefined)

 private:
  Tensor run(const Tensor& x, bool relu, bool pool2 = false);
  // input: f32 values [N, in, H, W], or codes [N, H, W, in].
  Tensor convolve(const Tensor& input, int64_t H, int64_t W, quant::InputQuant qp, bool codes, bool relu,
                  bool pool2, const quant::InputQuant* codes_out);
  Conv2dOptions options_;
};
FRUGAL_MODULE(QuantizedConv2d);

// int8 Embedding (quant::quantize_dynamic): weight int8 with one symmetric scale per row (Note [quantised
// state_dict]: weight [num, dim], weight_scale [num]); forward gathers the rows and dequantises them, so the
// table is a quarter of the f32 one and only the looked-up rows ever exist in f32.
class QuantizedEmbeddingImpl : public Module {
 public:
  explicit QuantizedEmbeddingImpl(const Tensor& weight);                  // f32 [num, dim]
  QuantizedEmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim);  // empty, for load_state_dict
  // indices (i64 or i32, any shape, each in [0, num)) -> f32 [..., dim]. On the meta device the same blocks,
  // and no range check (the indices have no values there).
  Tensor forward(const Tensor& indices) override;
  Tensor dequantized_weight() const;
  int64_t num_embeddings, embedding_dim;
  Tensor weight, weight_scale;  // U8 (int8 bytes) [num, dim], f32 [num]
};
FRUGAL_MODULE(QuantizedEmbedding);

// Quantisation-aware training's Linear (quant::prepare_qat): forward fake-quantises the weight (per output
// row, symmetric, as QuantizedLinear stores it) and the input (per tensor, 7-bit u8 as QuantizedLinear,
// from a moving-average min-max observer updated in training mode, PyTorch's averaging constant 0.01), then
// runs F::linear; gradients pass straight through (F::fake_quantize). weight and bias are the Linear's own.
class QatLinearImpl : public Module {
 public:
  explicit QatLinearImpl(const LinearImpl& linear);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  Tensor observed_min, observed_max;  // f32 [1] buffers; observed_ once a batch has been seen
  bool observed = false;
};
FRUGAL_MODULE(QatLinear);

// Quantisation-aware training's Conv2d (quant::prepare_qat, for the convolutions quant::prepare takes): the
// weight fake-quantised per output channel, the input as QatLinear's, then conv2d; convert gives a
// QuantizedConv2d.
class QatConv2dImpl : public Module {
 public:
  explicit QatConv2dImpl(const Conv2dImpl& conv);
  Tensor forward(const Tensor& x) override;
  const Conv2dOptions& options() const { return options_; }
  Tensor weight, bias;
  Tensor observed_min, observed_max;  // as QatLinear's
  bool observed = false;

 private:
  Conv2dOptions options_;
};
FRUGAL_MODULE(QatConv2d);

// Static post-training quantisation's observers (quant::prepare): ObservedLinear and ObservedConv2d run the
// layer in f32 and observe its inputs, from which quant::convert fixes the input's scale and zero point.
// MinMax keeps the smallest and largest value seen. Histogram also counts |x| into 2048 bins over [0, 2
// max|x| of the first batch] (values beyond go into the last bin) and clips the range at the 99.99th
// percentile of |x|, so that a few outliers do not spend the 128 levels.
namespace quant {
enum class Observer { MinMax, Histogram };
class RangeObserver {
 public:
  explicit RangeObserver(Observer kind) : observer(kind) {}
  void observe(const Tensor& x);  // f32, any shape
  // The range convert quantises: [min, max] seen, or clipped at the percentile (Histogram).
  std::pair<float, float> range() const;
  Observer observer;
  int64_t batches = 0;

 private:
  float min_ = 0, max_ = 0, bin_width_ = 0;
  std::vector<int64_t> histogram_;
};
}  // namespace quant
class ObservedLinearImpl : public Module, public quant::RangeObserver {
 public:
  ObservedLinearImpl(const LinearImpl& linear, quant::Observer observer);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
};
FRUGAL_MODULE(ObservedLinear);
class ObservedConv2dImpl : public Module, public quant::RangeObserver {
 public:
  ObservedConv2dImpl(const Conv2dImpl& conv, quant::Observer observer);
  Tensor forward(const Tensor& x) override;
  const Conv2dOptions& options() const { return options_; }
  Tensor weight, bias;

 private:
  Conv2dOptions options_;
};
FRUGAL_MODULE(ObservedConv2d);

namespace functional {
// Fake quantisation, per tensor: q = clamp(round(x / scale) + zero_point, qmin, qmax) (rounding half to
// even), y = (q - zero_point) * scale, in x's dtype (f32 or f64). Backward is the straight-through estimator
// of PyTorch's fake_quantize_per_tensor_affine: dy/dx = 1 where round(x / scale) + zero_point lies in [qmin,
// qmax], 0 outside. Throws Error for scale <= 0 (or not finite) or qmin >= qmax.
Tensor fake_quantize(const Tensor& x, double scale, int64_t zero_point, int64_t qmin, int64_t qmax);
// Per output row of a 2-D weight: row o uses scale[o] (zero point 0, symmetric), the same STE rule.
Tensor fake_quantize_per_row(const Tensor& w, const std::vector<double>& scale, int64_t qmin, int64_t qmax);
}  // namespace functional

namespace quant {

// Per-tensor asymmetric u8 quantisation of x as QuantizedLinear's forward does it: scale = (max - min) / 127
// over min(x, 0) .. max(x, 0), zero_point = round(-min / scale), q = clamp(round(x / scale) + zero_point, 0,
// 127) (rounding half to even, as PyTorch). All zeros give scale 1, zero point 0.
// Note [reduced range]: activations use 7 bits (0..127, PyTorch's reduce_range=True on x86), because without
// VNNI oneDNN's u8 x s8 kernel multiplies with vpmaddubsw, which sums pairs of products in saturating s16:
// 255 * 127 * 2 overflows it, 127 * 127 * 2 does not (the exactness test finds the full range wrong on AVX2).
inline constexpr int32_t kInputQMax = 127;
InputQuant choose_input_qparams(const float* x, int64_t n);
// The input quantisation of an observed range [lo, hi] (widened to hold 0), as choose_input_qparams makes it
// for a batch: what convert fixes from an observer's or a QAT layer's range.
InputQuant input_qparams_of_range(float lo, float hi);
// The symmetric int8 scale of one weight row: max|row| / 127, 1 for an all-zero row.
float weight_row_scale(const float* row, int64_t cols);
void quantize_input(const float* x, int64_t n, InputQuant q, uint8_t* out);
// max_pool2d(relu(conv(x)), 2) of an f32 Conv2d, made straight into the input codes of `next` (a
// QuantizedConv2d with static input quantisation), u8 [N, OH / 2, OW / 2, out] channels last, for
// next->forward_staged with codes_in (Note [an int8 convolution's input as codes], nn/quant.cpp); a NaN as
// conv2d_relu_pool2 takes it (its fused ReLU maps a NaN to 0). Undefined where that path
// is not there: a dynamic `next`, tensors not f32 on the cpu, shapes that do not fit together (the modules
// one by one then say how), an output without a 2 x 2 window, a build without oneDNN. Inference only: it
// records nothing.
Tensor conv2d_relu_pool2_codes(const Tensor& x, const Conv2dImpl& conv, const QuantizedConv2dImpl& next);

// Replaces every Linear below `model` (recursively) by a QuantizedLinear of its weights, and every Embedding
// by a QuantizedEmbedding; the modules (and their f32 weights, unless the caller holds them) are released.
// Conv2d stays f32, as in PyTorch's quantize_dynamic (its int8 form is static: prepare, convert). Throws
// Error for a non-f32 layer, or when `model` is itself one (it cannot replace itself: wrap it). Returns how
// many it replaced.
int quantize_dynamic(Module& model);

// The state_dict names of `model`'s int8 tensors (every QuantizedLinear's, QuantizedConv2d's and
// QuantizedEmbedding's "<path>.weight"), for
// io::save_safetensors(path, model.state_dict(), {}, int8_names(model)), which writes them as "I8".
std::set<std::string> int8_names(const Module& model);

// Replaces every Linear below `model` by a QatLinear, and every Conv2d that quant::prepare would take by a
// QatConv2d (sharing their weights and biases: build the optimizer after this). Returns how many.
int prepare_qat(Module& model);
// Static post-training quantisation: replaces every Linear below `model` by an ObservedLinear and every
// Conv2d (groups 1, patches of at least kMinConvPatch values) by an ObservedConv2d; calibrate by running a
// few batches through the model (forward, in any mode, no gradient needed), then convert. Returns how many it
// replaced.
// A convolution over fewer input values a pixel (W2's first, 1 channel x 3 x 3) stays f32: its int8 GEMM,
// with K = 9, ran 1.75x slower than the f32 convolution on a 2-core Zen 3, and its weights are a few
// hundred bytes.
inline constexpr int64_t kMinConvPatch = 16;
int prepare(Module& model, Observer observer = Observer::MinMax);
// Replaces every QatLinear and ObservedLinear below `model` by a QuantizedLinear, and every QatConv2d and
// ObservedConv2d by a QuantizedConv2d, with the observed input scale fixed (static activation quantisation).
// Throws Error for one that has seen no batch. Returns how many.
int convert(Module& model);

}  // namespace quant
}  // namespace frugal::nn
