// nn::quant (nn/quant.h): the int8 layers (QuantizedLinear, QuantizedConv2d, QuantizedEmbedding), their
// input quantisation, and the codes an f32 convolution block makes for the next int8 one. Fake quantisation,
// the QAT layers, the observers and the model rewrites are nn/quant_prepare.cpp; the int8 kernels are
// kernels/cpu/quant.cpp.
#include "nn/quant.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "autograd/graph.h"
#include "core/error.h"
#include "core/memory_history.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "core/quant_kernels.h"
#include "nn/functional.h"
#include "nn/layers.h"

namespace frugal::nn {

namespace {

// Symmetric int8 per row of w (f32, contiguous, [rows, ...]): scale[r] = max|w[r, :]| / 127 (1 for an
// all-zero row), q[r, i] = clamp(round(w[r, i] / scale[r]), -127, 127), into q's bytes (U8, w's numel) and
// scale (f32 [rows]).
void quantize_rows(const Tensor& w, Tensor& q, Tensor& scale) {
  const int64_t rows = w.size(0), cols = w.numel() / rows;
  const float* src = w.data<float>();
  auto* dst = static_cast<int8_t*>(q.raw_data());
  float* sc = scale.data<float>();
  for (int64_t o = 0; o < rows; ++o) {
    const float* row = src + o * cols;
    sc[o] = quant::weight_row_scale(row, cols);
    for (int64_t i = 0; i < cols; ++i)
      dst[o * cols + i] = int8_t(std::clamp(std::nearbyint(row[i] / sc[o]), -127.0f, 127.0f));
  }
}

// weight[o, ...] * weight_scale[o], f32 of weight's shape.
Tensor dequantize_rows(const Tensor& weight, const Tensor& weight_scale) {
  Tensor w = empty(weight.shape(), kF32);
  const int64_t rows = weight.size(0), cols = weight.numel() / rows;
  const auto* q = static_cast<const int8_t*>(weight.raw_data());
  const float* scale = weight_scale.data<float>();
  float* dst = w.data<float>();
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t i = 0; i < cols; ++i) dst[o * cols + i] = float(q[o * cols + i]) * scale[o];
  return w;
}

// The layer's input (or its codes) on the layer's device: the cpu, the meta device in a dry run (Note [the
// meta device]), where nothing is read, or (QuantizedLinear only) a GPU.
void check_same_device(const char* who, const Tensor& x, const Tensor& weight) {
  FRUGAL_CHECK_T(DeviceError, x.device() == weight.device(), who, ": the input is on ", x.device(),
                 " but the layer's weights on ", weight.device());
}

// Where the int8 layers run: every one on the cpu and the meta device; QuantizedLinear on a GPU too, through
// the op tables of core/quant_kernels.h (Note [an int8 layer on a GPU]).
void check_layer_device(const char* who, Device device, bool gpu_too) {
  FRUGAL_CHECK_T(DeviceError,
                 device == kCPU || device.is_meta() || (gpu_too && device.type == DeviceType::CUDA), who,
                 " runs on the cpu", gpu_too ? " or a GPU" : " only (QuantizedLinear runs on a GPU too)",
                 ", not on ", device);
}

void check_inference_input(const char* who, const Tensor& x, const Tensor& weight, bool gpu_too = false) {
  FRUGAL_CHECK_DTYPE(x.dtype() == kF32, who, ": expected an f32 input, got ", x.dtype(), " on ", x.device());
  check_same_device(who, x, weight);
  check_layer_device(who, x.device(), gpu_too);
  FRUGAL_CHECK(!(autograd::grad_mode_enabled() && x.requires_grad()), who,
               ": inference only, but the input requires grad (run it under NoGradGuard, or use "
               "nn::quant::prepare_qat for quantisation-aware training)");
}

// A convolution's output size along one axis for an input of `in`: 0 where the dilated kernel does not fit
// in the padded input.
int64_t conv_out_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t span = dilation * (kernel - 1) + 1;
  return in + 2 * pad < span ? 0 : (in + 2 * pad - span) / stride + 1;
}

// A layer's static input quantisation from its buffers, or none (dynamic). Buffers on the meta device hold
// no values: a dry run takes scale 1 and zero point 0, which change no block it takes.
std::optional<quant::InputQuant> static_input_of(const Tensor& input_scale, const Tensor& input_zero_point) {
  if (!input_scale.defined()) return std::nullopt;
  if (input_scale.device().is_meta()) return quant::InputQuant{1.0f, 0};
  // A GPU layer's buffers are read on the host (to(kCPU) is the tensor itself on the cpu).
  return quant::InputQuant{input_scale.to(kCPU).data<float>()[0],
                           input_zero_point.to(kCPU).data<int32_t>()[0]};
}

// The static input quantisation a layer's codes were made with (forward_codes, forward_staged), after
// checking that it has one and that the codes are u8.
quant::InputQuant codes_quant(const char* who, const std::optional<quant::InputQuant>& qp,
                              const Tensor& codes) {
  FRUGAL_CHECK(qp.has_value(), who,
               ": the layer's input quantisation is dynamic (chosen for each input), so it takes f32 values, "
               "not codes");
  FRUGAL_CHECK_DTYPE(codes.dtype() == kU8, who, ": expected u8 codes, got ", codes.dtype(), " on ",
                     codes.device());
  return *qp;
}

// The layer's fixed input quantisation (static), or one chosen for x (dynamic).
quant::InputQuant layer_input_qparams(const Tensor& xc, const Tensor& input_scale,
                                      const Tensor& input_zero_point) {
  if (const auto qp = static_input_of(input_scale, input_zero_point)) return *qp;
  if (xc.device().is_meta()) return {1.0f, 0};  // a dry run: no values to choose from, and no block either
  return quant::choose_input_qparams(xc.data<float>(), xc.numel());
}

// x's u8 codes (into xq, x's numel) under layer_input_qparams; returns the quantisation used.
quant::InputQuant quantize_layer_input(const Tensor& xc, const Tensor& input_scale,
                                       const Tensor& input_zero_point, Tensor& xq) {
  const quant::InputQuant qp = layer_input_qparams(xc, input_scale, input_zero_point);
  quant::quantize_input(xc.data<float>(), xc.numel(), qp, xq.data<uint8_t>());
  return qp;
}

// The GEMM's scale of each output column: the input's times the weight row's; on `device` (the layer's
// input's: a dry run's block is on the meta device, and computes nothing; a GPU's are computed on the host).
Tensor output_scales(quant::InputQuant qp, const Tensor& weight_scale, Device device) {
  if (device != kCPU && !device.is_meta()) return output_scales(qp, weight_scale.to(kCPU), kCPU).to(device);
  Tensor scale = empty(weight_scale.shape(), TensorOptions(kF32).device(device));
  if (device.is_meta()) return scale;
  const float* ws = weight_scale.data<float>();  // data<T>() checks the dtype: once, not per element
  float* out = scale.data<float>();
  for (int64_t o = 0; o < weight_scale.numel(); ++o) out[o] = qp.scale * ws[o];
  return scale;
}

// Note [an int8 layer on a GPU]
// QuantizedLinear runs on a GPU (model->to(cuda(0)) moves its buffers) with the cpu's arithmetic, so that its
// output is the cpu's bit for bit: the same codes (op_quantize_u8: one f32 product, the clamps, rounding half
// to even), the same s32 sums (an s8 x s8 GEMM through cuBLASLt, where codes of at most 127 read as s8 are
// the same numbers, less the zero point's term), the same scales (qp.scale x weight_scale[o], on the host)
// and the same float operations after (kernels/cuda/quant.cu). A dynamic layer chooses its quantisation on
// the host from the input's range (op_value_range, 8 bytes read back: a wait for the stream), so it gets the
// cpu's scale and zero point; a static one reads its two buffers back once a call. QuantizedConv2d and
// QuantizedEmbedding run on the cpu only (a DeviceError elsewhere).
quant::InputQuant quantize_on_device(const Tensor& xc, const Tensor& input_scale,
                                     const Tensor& input_zero_point, Tensor& xq) {
  std::optional<quant::InputQuant> qp = static_input_of(input_scale, input_zero_point);
  if (!qp) {
    const Tensor range = empty({2}, TensorOptions(kF32).device(xc.device()));
    op_value_range.get(xc.device(), kF32)({xc.data<float>(), xc.numel(), range.data<float>()});
    const Tensor lo_hi = range.to(kCPU);
    qp = quant::input_qparams_of_range(lo_hi.data<float>()[0], lo_hi.data<float>()[1]);
  }
  op_quantize_u8.get(xc.device(), kF32)({xc.data<float>(), xc.numel(), 1.0f / qp->scale, qp->zero_point,
                                         quant::kInputQMax, xq.data<uint8_t>()});
  return *qp;
}

void check_input_quant(const char* who, quant::InputQuant q) {
  FRUGAL_CHECK(
      std::isfinite(q.scale) && q.scale > 0 && q.zero_point >= 0 && q.zero_point <= quant::kInputQMax, who,
      ": the input scale must be positive and the zero point in [0, ", quant::kInputQMax, "], got ", q.scale,
      " and ", q.zero_point);
}

}  // namespace

QuantizedLinearImpl::QuantizedLinearImpl(int64_t in, int64_t out, bool has_bias, bool static_input)
    : Module("QuantizedLinear"), in_features(in), out_features(out) {
  FRUGAL_CHECK(in > 0 && out > 0, "QuantizedLinear: in_features and out_features must be positive, got ", in,
               " and ", out);
  weight = register_buffer("weight", zeros({out, in}, kU8));
  weight_scale = register_buffer("weight_scale", ones({out}, kF32));  // ones(): also on the meta device
  if (has_bias) bias = register_buffer("bias", zeros({out}, kF32));
  if (static_input) {
    input_scale = register_buffer("input_scale", tensor<float>({1.0f}, Shape({1})));
    input_zero_point = register_buffer("input_zero_point", tensor<int32_t>({0}, Shape({1})));
  }
}

QuantizedLinearImpl::QuantizedLinearImpl(const Tensor& w, const Tensor& b)
    : QuantizedLinearImpl(w.dim() == 2 ? w.size(1) : 0, w.dim() == 2 ? w.size(0) : 0, b.defined()) {
  FRUGAL_CHECK_DTYPE(w.dtype() == kF32 && (!b.defined() || b.dtype() == kF32) && w.device() == kCPU,
                     "QuantizedLinear: expected an f32 cpu weight (and bias), got weight ", w.dtype(), " on ",
                     w.device(), b.defined() ? " and bias " : "", b.defined() ? dtype_name(b.dtype()) : "");
  FRUGAL_CHECK_SHAPE(!b.defined() || (b.dim() == 1 && b.size(0) == out_features),
                     "QuantizedLinear: bias must be [", out_features, "], got ", b.shape());
  quantize_rows(contiguous(w), weight, weight_scale);
  if (b.defined()) std::copy_n(contiguous(b).data<float>(), out_features, bias.data<float>());
}

QuantizedLinearImpl::QuantizedLinearImpl(const Tensor& w, const Tensor& b, float in_scale, int32_t in_zp)
    : QuantizedLinearImpl(w, b) {
  check_input_quant("QuantizedLinear", {in_scale, in_zp});
  input_scale = register_buffer("input_scale", tensor<float>({in_scale}, Shape({1})));
  input_zero_point = register_buffer("input_zero_point", tensor<int32_t>({in_zp}, Shape({1})));
}

Tensor QuantizedLinearImpl::dequantized_weight() const { return dequantize_rows(weight, weight_scale); }

Tensor QuantizedLinearImpl::forward(const Tensor& x) { return run(x, false); }
Tensor QuantizedLinearImpl::forward_relu(const Tensor& x) { return run(x, true); }

Tensor QuantizedLinearImpl::run(const Tensor& x, bool relu) {
  check_inference_input("QuantizedLinear", x, weight, true);
  FRUGAL_CHECK_SHAPE(x.dim() >= 1 && x.size(-1) == in_features,
                     "QuantizedLinear: expected an input of shape [...,", in_features, "], got ", x.shape());
  FRUGAL_CHECK_DTYPE(
      weight.dtype() == kU8 && weight_scale.dtype() == kF32 && (!bias.defined() || bias.dtype() == kF32),
      "QuantizedLinear: expected weight U8 (int8 bytes) and f32 weight_scale and bias, got ", weight.dtype(),
      ", ", weight_scale.dtype());
  const Tensor xc = contiguous(x);
  const int64_t m = x.numel() / in_features;
  std::vector<int64_t> dims(x.shape().begin(), x.shape().end());
  dims.back() = out_features;
  Tensor y = empty(Shape(dims), TensorOptions(kF32).device(x.device()));
  Tensor xq = empty({m, in_features}, TensorOptions(kU8).device(x.device()));
  if (x.device().is_meta()) {  // a dry run: the blocks below, in their order, without the values
    const Tensor scale = output_scales({1.0f, 0}, weight_scale, x.device());
    cpu::int8_linear_meta(m, in_features, out_features);
    return y;
  }
  const quant::InputQuant qp = x.device() == kCPU
                                   ? quantize_layer_input(xc, input_scale, input_zero_point, xq)
                                   : quantize_on_device(xc, input_scale, input_zero_point, xq);
  multiply(xq, qp, relu, y);
  return y;
}

void QuantizedLinearImpl::multiply(const Tensor& codes, quant::InputQuant qp, bool relu, Tensor& y) const {
  const Tensor scale = output_scales(qp, weight_scale, codes.device());
  Int8LinearArgs a;
  a.x = codes.data<uint8_t>();
  a.x_zero_point = qp.zero_point;
  a.w = static_cast<const int8_t*>(weight.raw_data());
  a.scale = scale.data<float>();
  a.bias = bias.defined() ? bias.data<float>() : nullptr;
  a.out = y.data<float>();
  a.m = codes.size(0), a.k = in_features, a.n = out_features;
  a.relu = relu;
  op_int8_linear.get(codes.device(), kU8)(a);  // the cpu's: cpu::int8_linear
}

std::optional<quant::InputQuant> QuantizedLinearImpl::static_input() const {
  return static_input_of(input_scale, input_zero_point);
}

Tensor QuantizedLinearImpl::forward_codes(const Tensor& codes, bool relu) {
  const quant::InputQuant qp = codes_quant("QuantizedLinear::forward_codes", static_input(), codes);
  check_same_device("QuantizedLinear::forward_codes", codes, weight);
  check_layer_device("QuantizedLinear::forward_codes", codes.device(), true);
  FRUGAL_CHECK_SHAPE(codes.dim() == 2 && codes.size(1) == in_features,
                     "QuantizedLinear::forward_codes: expected codes of shape [N, ", in_features, "], got ",
                     codes.shape());
  const Tensor cc = contiguous(codes);
  const int64_t m = codes.size(0);
  Tensor y = empty({m, out_features}, TensorOptions(kF32).device(codes.device()));
  if (codes.device().is_meta()) {  // a dry run
    const Tensor scale = output_scales(qp, weight_scale, codes.device());
    cpu::int8_linear_meta(m, in_features, out_features);
    return y;
  }
  multiply(cc, qp, relu, y);
  return y;
}

QuantizedConv2dImpl::QuantizedConv2dImpl(const Conv2dOptions& o, bool static_input)
    : Module("QuantizedConv2d"), options_(o) {
  FRUGAL_CHECK(o.groups() == 1, "QuantizedConv2d: only groups 1 is supported, got groups ", o.groups());
  FRUGAL_CHECK(o.in_channels() > 0 && o.out_channels() > 0 && o.kernel_size().h > 0 && o.kernel_size().w > 0,
               "QuantizedConv2d: channels and kernel size must be positive");
  const Size2 k = o.kernel_size();
  weight = register_buffer("weight", zeros({o.out_channels(), o.in_channels(), k.h, k.w}, kU8));
  weight_scale = register_buffer("weight_scale", ones({o.out_channels()}, kF32));
  if (o.bias()) bias = register_buffer("bias", zeros({o.out_channels()}, kF32));
  if (static_input) {
    input_scale = register_buffer("input_scale", tensor<float>({1.0f}, Shape({1})));
    input_zero_point = register_buffer("input_zero_point", tensor<int32_t>({0}, Shape({1})));
  }
}

QuantizedConv2dImpl::QuantizedConv2dImpl(const Conv2dOptions& o, const Tensor& w, const Tensor& b,
                                         const quant::InputQuant* input)
    : QuantizedConv2dImpl(Conv2dOptions(o).bias(b.defined()), input != nullptr) {
  const Shape want = weight.shape();
  FRUGAL_CHECK_DTYPE(w.dtype() == kF32 && (!b.defined() || b.dtype() == kF32) && w.device() == kCPU,
                     "QuantizedConv2d: expected an f32 cpu weight (and bias), got weight ", w.dtype(), " on ",
                     w.device());
  FRUGAL_CHECK_SHAPE(w.shape() == want && (!b.defined() || b.shape() == Shape({want[0]})),
                     "QuantizedConv2d: expected weight ", want, " and bias [", want[0], "], got ", w.shape(),
                     " and ", b.defined() ? b.shape() : Shape{});
  quantize_rows(contiguous(w), weight, weight_scale);
  if (b.defined()) std::copy_n(contiguous(b).data<float>(), want[0], bias.data<float>());
  if (input) {
    check_input_quant("QuantizedConv2d", *input);
    input_scale.data<float>()[0] = input->scale;
    input_zero_point.data<int32_t>()[0] = input->zero_point;
  }
}

Tensor QuantizedConv2dImpl::dequantized_weight() const { return dequantize_rows(weight, weight_scale); }

Tensor QuantizedConv2dImpl::forward(const Tensor& x) { return run(x, false); }
Tensor QuantizedConv2dImpl::forward_relu(const Tensor& x) { return run(x, true); }
Tensor QuantizedConv2dImpl::forward_relu_pool2(const Tensor& x) { return run(x, true, true); }

Tensor QuantizedConv2dImpl::run(const Tensor& x, bool relu, bool pool2) {
  return forward_staged(x, false, relu, pool2);
}

std::optional<quant::InputQuant> QuantizedConv2dImpl::static_input() const {
  return static_input_of(input_scale, input_zero_point);
}

int64_t QuantizedConv2dImpl::pooled_features(int64_t H, int64_t W) const {
  const Conv2dOptions& o = options_;
  const Size2 k = o.kernel_size(), st = o.stride(), pd = o.padding(), dl = o.dilation();
  return o.out_channels() * (conv_out_size(H, k.h, st.h, pd.h, dl.h) / 2) *
         (conv_out_size(W, k.w, st.w, pd.w, dl.w) / 2);
}

Tensor QuantizedConv2dImpl::forward_staged(const Tensor& input, bool codes_in, bool relu, bool pool2,
                                           const quant::InputQuant* codes_out) {
  const int64_t C = options_.in_channels();
  FRUGAL_CHECK(!codes_out || pool2,
               "QuantizedConv2d::forward_staged: codes out are made from a pooled output");
  if (codes_out) check_input_quant("QuantizedConv2d::forward_staged's codes_out", *codes_out);
  if (!codes_in) {
    check_inference_input("QuantizedConv2d", input, weight);
    FRUGAL_CHECK_SHAPE(input.dim() == 4 && input.size(1) == C,
                       "QuantizedConv2d: expected an input of shape [N, ", C, ", H, W], got ", input.shape());
    const Tensor xc = contiguous(input);
    // int8_conv2d makes the codes a chunk of images at a time (no copy of the whole input in u8).
    return convolve(xc, input.size(2), input.size(3), layer_input_qparams(xc, input_scale, input_zero_point),
                    false, relu, pool2, codes_out);
  }
  const quant::InputQuant qp = codes_quant("QuantizedConv2d::forward_staged", static_input(), input);
  check_same_device("QuantizedConv2d::forward_staged", input, weight);
  check_layer_device("QuantizedConv2d::forward_staged", input.device(), false);
  FRUGAL_CHECK_SHAPE(input.dim() == 4 && input.size(3) == C,
                     "QuantizedConv2d::forward_staged: expected codes of shape [N, H, W, ", C, "], got ",
                     input.shape());
  return convolve(contiguous(input), input.size(1), input.size(2), qp, true, relu, pool2, codes_out);
}

Tensor QuantizedConv2dImpl::convolve(const Tensor& input, int64_t H, int64_t W, quant::InputQuant qp,
                                     bool codes, bool relu, bool pool2, const quant::InputQuant* codes_out) {
  const Conv2dOptions& o = options_;
  const int64_t N = input.size(0), C = o.in_channels(), O = o.out_channels();
  const Size2 k = o.kernel_size(), st = o.stride(), pd = o.padding(), dl = o.dilation();
  const int64_t OH = conv_out_size(H, k.h, st.h, pd.h, dl.h), OW = conv_out_size(W, k.w, st.w, pd.w, dl.w);
  FRUGAL_CHECK_SHAPE(OH > 0 && OW > 0, "QuantizedConv2d: the input ", input.shape(),
                     " is smaller than the dilated kernel");
  // An output too small for a 2 x 2 window: max_pool2d's own refusal.
  if (pool2 && (OH < 2 || OW < 2)) {
    FRUGAL_CHECK(!codes_out, "QuantizedConv2d: no codes out of an output too small to pool");
    return max_pool2d(convolve(input, H, W, qp, codes, relu, false, nullptr), 2);
  }
  const Device device = input.device();
  const Tensor scale = output_scales(qp, weight_scale, device);
  Tensor y = codes_out ? empty({N, O * (OH / 2) * (OW / 2)}, TensorOptions(kU8).device(device))
             : pool2   ? empty({N, O, OH / 2, OW / 2}, TensorOptions(kF32).device(device))
                       : empty({N, O, OH, OW}, TensorOptions(kF32).device(device));
  ConvArgs args;
  args.n = N, args.c = C, args.h = H, args.w = W, args.o = O, args.kh = k.h, args.kw = k.w, args.oh = OH,
  args.ow = OW;
  args.stride_h = st.h, args.stride_w = st.w, args.pad_h = pd.h, args.pad_w = pd.w, args.dil_h = dl.h,
  args.dil_w = dl.w;
  args.x = input.raw_data(), args.weight = weight.raw_data(), args.y = codes_out ? nullptr : y.raw_data();
  args.bias = bias.defined() ? bias.raw_data() : nullptr;
  const cpu::Int8ConvInput in{1.0f / qp.scale, qp.zero_point, quant::kInputQMax, codes};
  if (device.is_meta()) {  // a dry run: the kernel's blocks, in their order, without the values
    cpu::int8_conv2d_meta(args, in, pool2, codes_out != nullptr);
    return y;
  }
  const cpu::Int8ConvCodes out = codes_out ? cpu::Int8ConvCodes{y.data<uint8_t>(), 1.0f / codes_out->scale,
                                                                codes_out->zero_point, quant::kInputQMax}
                                           : cpu::Int8ConvCodes{};
  cpu::int8_conv2d(args, in, scale.data<float>(), relu, pool2, codes_out ? &out : nullptr);
  return y;
}

QuantizedEmbeddingImpl::QuantizedEmbeddingImpl(int64_t num, int64_t dim)
    : Module("QuantizedEmbedding"), num_embeddings(num), embedding_dim(dim) {
  FRUGAL_CHECK(num > 0 && dim > 0,
               "QuantizedEmbedding: num_embeddings and embedding_dim must be positive, got ", num, " and ",
               dim);
  weight = register_buffer("weight", zeros({num, dim}, kU8));
  weight_scale = register_buffer("weight_scale", ones({num}, kF32));
}

QuantizedEmbeddingImpl::QuantizedEmbeddingImpl(const Tensor& w)
    : QuantizedEmbeddingImpl(w.dim() == 2 ? w.size(0) : 0, w.dim() == 2 ? w.size(1) : 0) {
  FRUGAL_CHECK_DTYPE(w.dtype() == kF32 && w.device() == kCPU,
                     "QuantizedEmbedding: expected an f32 cpu weight, got ", w.dtype(), " on ", w.device());
  quantize_rows(contiguous(w), weight, weight_scale);
}

Tensor QuantizedEmbeddingImpl::dequantized_weight() const { return dequantize_rows(weight, weight_scale); }

Tensor QuantizedEmbeddingImpl::forward(const Tensor& indices) {
  const bool meta = indices.device().is_meta();
  FRUGAL_CHECK_DTYPE(indices.dtype() == kI64 || indices.dtype() == kI32,
                     "QuantizedEmbedding: the indices must be i64 or i32, got ", indices.dtype(), " on ",
                     indices.device());
  check_same_device("QuantizedEmbedding", indices, weight);
  check_layer_device("QuantizedEmbedding", indices.device(), false);
  const Tensor flat = contiguous(indices.reshape({-1})).to(kI64);
  const int64_t n = flat.numel(), dim = embedding_dim;
  Shape out_shape = indices.shape();
  out_shape.push_back(dim);
  // A dry run takes the same blocks; the indices' range is checked where they have values.
  if (meta) return empty(out_shape, TensorOptions(kF32).device(kMeta));
  const int64_t* idx = flat.data<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    FRUGAL_CHECK_INDEX(idx[i] >= 0 && idx[i] < num_embeddings, "QuantizedEmbedding: index ", idx[i],
                       " is out of range for ", num_embeddings, " embeddings; valid indices are [0, ",
                       num_embeddings - 1, "]");
  Tensor y = empty(out_shape, kF32);
  const auto* q = static_cast<const int8_t*>(weight.raw_data());
  const float* scale = weight_scale.data<float>();
  float* dst = y.data<float>();
  parallel_for(0, n, items_per_grain(dim), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int8_t* row = q + idx[i] * dim;
      const float s = scale[idx[i]];
      for (int64_t j = 0; j < dim; ++j) dst[i * dim + j] = float(row[j]) * s;
    }
  });
  return y;
}

namespace quant {

float weight_row_scale(const float* row, int64_t cols) {
  float amax = 0;
  for (int64_t i = 0; i < cols; ++i) amax = std::max(amax, std::fabs(row[i]));
  return amax > 0 ? amax / 127.0f : 1.0f;
}

InputQuant input_qparams_of_range(float lo, float hi) {
  const float mn = std::min(lo, 0.0f), mx = std::max(hi, 0.0f);
  const float s = mx > mn ? (mx - mn) / float(kInputQMax) : 1.0f;
  const auto zp = int32_t(std::clamp(std::nearbyint(-mn / s), 0.0f, float(kInputQMax)));
  return {s, zp};
}

InputQuant choose_input_qparams(const float* x, int64_t n) {
  float lo, hi;
  cpu::value_range(x, n, lo, hi);
  return input_qparams_of_range(lo, hi);  // lo <= 0 <= hi: the range's own scale and zero point
}

void quantize_input(const float* x, int64_t n, InputQuant q, uint8_t* out) {
  cpu::quantize_u8(x, n, 1.0f / q.scale, q.zero_point, kInputQMax, out);
}

// Note [an int8 convolution's input as codes]
// In a statically quantised CNN (W2's: a Conv2d kept in f32, a ReLU, a MaxPool2d(2), then a QuantizedConv2d,
// a ReLU, a MaxPool2d(2), a Flatten and a QuantizedLinear), each block's pooled output exists only to be
// quantised by the next layer, which for a convolution then transposes the codes channels last for oneDNN's
// int8 convolution. Sequential's inference makes the codes instead:
// - the f32 block pools its convolution's output straight from oneDNN's blocked layout into the next layer's
//   codes, channels last (cpu::conv2d_relu_pool2_codes), which the int8 convolution reads as they are
//   (QuantizedConv2d::forward_staged with codes_in): no f32 pooled output, no quantisation pass, no
//   transposes;
// - the int8 block quantises its pooled values (pixel-major, in the cache) into the codes of the
//   QuantizedLinear after the Flatten, in the flattened order (codes_out, QuantizedLinear::forward_codes): a
//   byte transpose instead of an f32 one, and no f32 output.
// Each code is quantize_u8's of the same pooled value, so the result is the modules' one by one, bit for bit,
// a NaN included (the ReLU keeps it, the pool passes it on, and its code is 0, as quantize_u8 gives it;
// Note [conv2d_relu keeps a NaN], kernels/cpu/conv.cpp). Only a static layer can take codes: a dynamic
// one chooses its scale from the whole f32 input. W2's int8 forward of 256 images held 12.05 MiB at its peak
// before, and 3.57 MiB with both.
Tensor conv2d_relu_pool2_codes(const Tensor& x, const Conv2dImpl& conv, const QuantizedConv2dImpl& next) {
  const Conv2dOptions& o = conv.options();
  const Tensor& w = conv.weight;
  const Tensor& b = conv.bias;
  // On the cpu, or all on the meta device in a dry run.
  const bool meta = x.device().is_meta();
  auto f32_cpu = [&](const Tensor& t) { return t.dtype() == kF32 && t.device() == (meta ? kMeta : kCPU); };
  const std::optional<InputQuant> q = next.static_input();
  if (!q || x.dim() != 4 || !f32_cpu(x) || !f32_cpu(w) || (b.defined() && !f32_cpu(b)) || w.dim() != 4 ||
      x.size(1) != w.size(1) * o.groups() || w.size(0) != next.options().in_channels() ||
      (b.defined() && b.shape() != Shape({w.size(0)})))
    return {};  // the modules then run one by one, and say what is wrong with the shapes if anything is
  const Size2 k{w.size(2), w.size(3)}, st = o.stride(), pd = o.padding(), dl = o.dilation();
  ConvArgs a;
  a.n = x.size(0), a.c = x.size(1), a.h = x.size(2), a.w = x.size(3), a.o = w.size(0), a.kh = k.h, a.kw = k.w;
  a.stride_h = st.h, a.stride_w = st.w, a.pad_h = pd.h, a.pad_w = pd.w, a.dil_h = dl.h, a.dil_w = dl.w;
  a.groups = o.groups();
  a.oh = conv_out_size(a.h, k.h, st.h, pd.h, dl.h);
  a.ow = conv_out_size(a.w, k.w, st.w, pd.w, dl.w);
  if (a.oh < 2 || a.ow < 2) return {};  // no 2 x 2 window, or a kernel that does not fit
  memory::OpScope op_scope("conv2d_relu_pool2_codes", x, w);  // Note [op names in the history]
  const Tensor xc = contiguous(x), wc = contiguous(w), bc = b.defined() ? contiguous(b) : b;
  // The pointers also on the meta device, where they point nowhere: a kernel's plan depends on which are set.
  a.x = xc.raw_data(), a.weight = wc.raw_data(), a.bias = bc.defined() ? bc.raw_data() : nullptr;
  Tensor codes = empty({a.n, a.oh / 2, a.ow / 2, a.o}, TensorOptions(kU8).device(x.device()));
  if (meta) return cpu::conv2d_relu_pool2_codes_meta(a) ? codes : Tensor();
  if (!cpu::conv2d_relu_pool2_codes(a, codes.data<uint8_t>(), 1.0f / q->scale, q->zero_point, kInputQMax))
    return {};
  return codes;
}

}  // namespace quant
}  // namespace frugal::nn
