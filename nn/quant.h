// int8 quantisation (dynamic post-training): nn::quant::quantize_dynamic replaces every Linear of a model by
// a QuantizedLinear, whose weight is int8 with one symmetric scale per output row and whose input is
// quantised per batch to u8 with a zero point; the GEMM is int8 (kernels/cpu/quant.cpp, oneDNN's u8 x s8 ->
// s32 matmul).
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
//   127 <path>.bias          [out]      f32 (absent for Linear without bias)
// The input scale/zero point are computed per forward (dynamic), so they are not stored.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../core/tensor.h"
#include "module.h"
#include "module_holder.h"

namespace frugal::nn {

class LinearImpl;

class QuantizedLinearImpl : public Module {
 public:
  // Quantises `weight` (f32 [out, in]) per output row; `bias` (f32 [out]) may be undefined.
  QuantizedLinearImpl(const Tensor& weight, const Tensor& bias);
  // Static activation quantisation: the input's scale and zero point fixed (from QAT or calibration), held
  // as buffers "input_scale" (f32 [1]) and "input_zero_point" (i32 [1]).
  QuantizedLinearImpl(const Tensor& weight, const Tensor& bias, float input_scale, int32_t input_zero_point);
  // An empty one of this size (weights zero, scales one) for load_state_dict.
  QuantizedLinearImpl(int64_t in_features, int64_t out_features, bool bias = true);
  // x [..., in] f32, not requiring grad (inference only) -> [..., out] f32.
  Tensor forward(const Tensor& x) override;
  // The weight this layer multiplies by, dequantised: weight[o, i] * weight_scale[o] (f32 [out, in]).
  Tensor dequantized_weight() const;
  int64_t in_features, out_features;
  Tensor weight, weight_scale, bias;     // U8 (int8 bytes) [out, in], f32 [out], f32 [out] or undefined
  Tensor input_scale, input_zero_point;  // static only (else undefined)
};
FRUGAL_MODULE(QuantizedLinear);

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

// Static post-training quantisation's Linear (quant::prepare): runs the Linear in f32 and observes its
// inputs, from which quant::convert fixes the input's scale and zero point. MinMax keeps the smallest and
// largest value seen. Histogram also counts |x| into 2048 bins over [0, 2 max|x| of the first batch] (values
// beyond go into the last bin) and clips the range at the 99.99th percentile of |x|, so that a few outliers
// do not spend the 128 levels.
namespace quant {
enum class Observer { MinMax, Histogram };
}
class ObservedLinearImpl : public Module {
 public:
  ObservedLinearImpl(const LinearImpl& linear, quant::Observer observer);
  Tensor forward(const Tensor& x) override;
  // The range convert quantises: [min, max] seen, or clipped at the percentile (Histogram).
  std::pair<float, float> range() const;
  Tensor weight, bias;
  quant::Observer observer;
  int64_t batches = 0;

 private:
  float min_ = 0, max_ = 0, bin_width_ = 0;
  std::vector<int64_t> histogram_;
};
FRUGAL_MODULE(ObservedLinear);

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
struct InputQuant {
  float scale;
  int32_t zero_point;
};
InputQuant choose_input_qparams(const float* x, int64_t n);
void quantize_input(const float* x, int64_t n, InputQuant q, uint8_t* out);

// Replaces every Linear below `model` (recursively) by a QuantizedLinear of its weights; the Linear modules
// (and their f32 weights, unless the caller holds them) are released. Throws Error for a non-f32 Linear, or
// when `model` is itself a Linear (it cannot replace itself: wrap it). Returns how many it replaced.
int quantize_dynamic(Module& model);

// The state_dict names of `model`'s int8 tensors (every QuantizedLinear's "<path>.weight"), for
// io::save_safetensors(path, model.state_dict(), {}, int8_names(model)), which writes them as "I8".
std::set<std::string> int8_names(const Module& model);

// Replaces every Linear below `model` by a QatLinear (sharing its weight and bias: build the optimizer after
// this). Returns how many.
int prepare_qat(Module& model);
// Static post-training quantisation: replaces every Linear below `model` by an ObservedLinear; calibrate by
// running a few batches through the model (forward, in any mode, no gradient needed), then convert.
int prepare(Module& model, Observer observer = Observer::MinMax);
// Replaces every QatLinear and ObservedLinear below `model` by a QuantizedLinear with the observed input
// scale fixed (static activation quantisation). Throws Error for one that has seen no batch. Returns how
// many.
int convert(Module& model);

}  // namespace quant
}  // namespace frugal::nn
