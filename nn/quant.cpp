// nn::quant: QuantizedLinear and quantize_dynamic (nn/quant.h). The int8 GEMM is kernels/cpu/quant.cpp.
#include "nn/quant.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>
#include <vector>

#include "autograd/functions.h"
#include "autograd/graph.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/quant_kernels.h"
#include "nn/functional.h"
#include "nn/layers.h"

namespace frugal::nn {

using autograd::Grads;
using autograd::Node;
using autograd::recorded;

QuantizedLinearImpl::QuantizedLinearImpl(int64_t in, int64_t out, bool has_bias)
    : Module("QuantizedLinear"), in_features(in), out_features(out) {
  FRUGAL_CHECK(in > 0 && out > 0, "QuantizedLinear: in_features and out_features must be positive, got ", in,
               " and ", out);
  weight = register_buffer("weight", zeros({out, in}, kU8));
  Tensor s = empty({out}, kF32);
  std::fill_n(s.data<float>(), out, 1.0f);
  weight_scale = register_buffer("weight_scale", s);
  if (has_bias) bias = register_buffer("bias", zeros({out}, kF32));
}

QuantizedLinearImpl::QuantizedLinearImpl(const Tensor& w, const Tensor& b)
    : QuantizedLinearImpl(w.dim() == 2 ? w.size(1) : 0, w.dim() == 2 ? w.size(0) : 0, b.defined()) {
  FRUGAL_CHECK_DTYPE(w.dtype() == kF32 && (!b.defined() || b.dtype() == kF32) && w.device() == kCPU,
                     "QuantizedLinear: expected an f32 cpu weight (and bias), got weight ", w.dtype(), " on ",
                     w.device(), b.defined() ? " and bias " : "", b.defined() ? dtype_name(b.dtype()) : "");
  FRUGAL_CHECK_SHAPE(!b.defined() || (b.dim() == 1 && b.size(0) == out_features),
                     "QuantizedLinear: bias must be [", out_features, "], got ", b.shape());
  const Tensor wc = contiguous(w);
  const float* src = wc.data<float>();
  auto* q = static_cast<int8_t*>(weight.raw_data());
  float* scale = weight_scale.data<float>();
  for (int64_t o = 0; o < out_features; ++o) {
    const float* row = src + o * in_features;
    float amax = 0;
    for (int64_t i = 0; i < in_features; ++i) amax = std::max(amax, std::fabs(row[i]));
    scale[o] = amax > 0 ? amax / 127.0f : 1.0f;
    for (int64_t i = 0; i < in_features; ++i)
      q[o * in_features + i] = int8_t(std::clamp(std::nearbyint(row[i] / scale[o]), -127.0f, 127.0f));
  }
  if (b.defined()) std::copy_n(contiguous(b).data<float>(), out_features, bias.data<float>());
}

QuantizedLinearImpl::QuantizedLinearImpl(const Tensor& w, const Tensor& b, float in_scale, int32_t in_zp)
    : QuantizedLinearImpl(w, b) {
  FRUGAL_CHECK(std::isfinite(in_scale) && in_scale > 0 && in_zp >= 0 && in_zp <= quant::kInputQMax,
               "QuantizedLinear: the input scale must be positive and the zero point in [0, ",
               quant::kInputQMax, "], got ", in_scale, " and ", in_zp);
  input_scale = register_buffer("input_scale", tensor<float>({in_scale}, Shape({1})));
  input_zero_point = register_buffer("input_zero_point", tensor<int32_t>({in_zp}, Shape({1})));
}

Tensor QuantizedLinearImpl::dequantized_weight() const {
  Tensor w = empty({out_features, in_features}, kF32);
  const auto* q = static_cast<const int8_t*>(weight.raw_data());
  const float* scale = weight_scale.data<float>();
  float* dst = w.data<float>();
  for (int64_t o = 0; o < out_features; ++o)
    for (int64_t i = 0; i < in_features; ++i)
      dst[o * in_features + i] = float(q[o * in_features + i]) * scale[o];
  return w;
}

Tensor QuantizedLinearImpl::forward(const Tensor& x) {
  FRUGAL_CHECK_DTYPE(x.dtype() == kF32 && x.device() == kCPU,
                     "QuantizedLinear: expected an f32 cpu input, got ", x.dtype(), " on ", x.device());
  FRUGAL_CHECK_SHAPE(x.dim() >= 1 && x.size(-1) == in_features,
                     "QuantizedLinear: expected an input of shape [...,", in_features, "], got ", x.shape());
  FRUGAL_CHECK(!(autograd::grad_mode_enabled() && x.requires_grad()),
               "QuantizedLinear: inference only, but the input requires grad (run it under NoGradGuard, or "
               "use nn::quant::prepare_qat for quantisation-aware training)");
  FRUGAL_CHECK_DTYPE(
      weight.dtype() == kU8 && weight_scale.dtype() == kF32 && (!bias.defined() || bias.dtype() == kF32),
      "QuantizedLinear: expected weight U8 (int8 bytes) and f32 weight_scale and bias, got ", weight.dtype(),
      ", ", weight_scale.dtype());
  const Tensor xc = contiguous(x);
  const int64_t m = x.numel() / in_features;
  std::vector<int64_t> dims(x.shape().begin(), x.shape().end());
  dims.back() = out_features;
  Tensor y = empty(Shape(dims), kF32);
  Tensor xq = empty({m, in_features}, kU8);
  const quant::InputQuant qp =
      input_scale.defined()
          ? quant::InputQuant{input_scale.data<float>()[0], input_zero_point.data<int32_t>()[0]}
          : quant::choose_input_qparams(xc.data<float>(), xc.numel());
  quant::quantize_input(xc.data<float>(), xc.numel(), qp, xq.data<uint8_t>());
  // One output scale per column: the input's times the weight row's.
  Tensor scale = empty({out_features}, kF32);
  for (int64_t o = 0; o < out_features; ++o)
    scale.data<float>()[o] = qp.scale * weight_scale.data<float>()[o];
  cpu::int8_linear(xq.data<uint8_t>(), qp.zero_point, static_cast<const int8_t*>(weight.raw_data()),
                   scale.data<float>(), bias.defined() ? bias.data<float>() : nullptr, y.data<float>(), m,
                   in_features, out_features);
  return y;
}

namespace functional {

Tensor fake_quantize(const Tensor& x, double scale, int64_t zero_point, int64_t qmin, int64_t qmax) {
  FRUGAL_CHECK(std::isfinite(scale) && scale > 0, "fake_quantize: scale must be positive and finite, got ",
               scale);
  FRUGAL_CHECK(qmin < qmax, "fake_quantize: qmin must be below qmax, got qmin ", qmin, " and qmax ", qmax);
  FRUGAL_CHECK(zero_point >= qmin && zero_point <= qmax, "fake_quantize: zero_point ", zero_point,
               " must lie in [qmin, qmax] = [", qmin, ", ", qmax, "]");
  FRUGAL_CHECK_DTYPE((x.dtype() == kF32 || x.dtype() == kF64) && x.device() == kCPU,
                     "fake_quantize: expected an f32 or f64 cpu tensor, got ", x.dtype(), " on ", x.device());
  const Tensor xc = contiguous(x.detach());
  Tensor y = empty(x.shape(), x.dtype()), mask = empty(x.shape(), x.dtype());
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      const T* src = xc.data<T>();
      T *dst = y.data<T>(), *m = mask.data<T>();
      const T s = T(scale), zp = T(zero_point), lo = T(qmin), hi = T(qmax);
      for (int64_t i = 0; i < x.numel(); ++i) {
        const T q = std::nearbyint(src[i] / s) + zp;
        m[i] = q >= lo && q <= hi ? T(1) : T(0);
        dst[i] = (std::clamp(q, lo, hi) - zp) * s;
      }
    }
  });
  if (Node* n = recorded("fake_quantize", {&x}, y)) {
    n->save(mask);
    n->backward = [](const Grads& saved, const Tensor& g) -> Grads { return {mul(g, saved[0])}; };
  }
  return y;
}

Tensor fake_quantize_per_row(const Tensor& w, const std::vector<double>& scale, int64_t qmin, int64_t qmax) {
  FRUGAL_CHECK(qmin < qmax, "fake_quantize_per_row: qmin must be below qmax, got ", qmin, " and ", qmax);
  FRUGAL_CHECK_SHAPE(w.dim() == 2 && w.size(0) == int64_t(scale.size()),
                     "fake_quantize_per_row: expected a 2-D ", "weight with one scale per row (",
                     scale.size(), "), got shape ", w.shape());
  FRUGAL_CHECK_DTYPE((w.dtype() == kF32 || w.dtype() == kF64) && w.device() == kCPU,
                     "fake_quantize_per_row: expected an f32 or f64 cpu tensor, got ", w.dtype());
  for (double sc : scale)
    FRUGAL_CHECK(std::isfinite(sc) && sc > 0, "fake_quantize_per_row: scales must be positive, got ", sc);
  const Tensor wc = contiguous(w.detach());
  Tensor y = empty(w.shape(), w.dtype()), mask = empty(w.shape(), w.dtype());
  const int64_t rows = w.size(0), cols = w.size(1);
  visit_dtype(w.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      const T* src = wc.data<T>();
      T *dst = y.data<T>(), *m = mask.data<T>();
      for (int64_t r = 0; r < rows; ++r) {
        const T s = T(scale[size_t(r)]);
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t i = r * cols + c;
          const T q = std::nearbyint(src[i] / s);
          m[i] = q >= T(qmin) && q <= T(qmax) ? T(1) : T(0);
          dst[i] = std::clamp(q, T(qmin), T(qmax)) * s;
        }
      }
    }
  });
  if (Node* n = recorded("fake_quantize_per_row", {&w}, y)) {
    n->save(mask);
    n->backward = [](const Grads& saved, const Tensor& g) -> Grads { return {mul(g, saved[0])}; };
  }
  return y;
}

}  // namespace functional

QatLinearImpl::QatLinearImpl(const LinearImpl& linear) : Module("QatLinear") {
  FRUGAL_CHECK_DTYPE(linear.weight.dtype() == kF32 && linear.weight.device() == kCPU,
                     "prepare_qat: expected an f32 cpu Linear, got ", linear.weight.dtype());
  weight = register_parameter("weight", linear.weight, linear.weight.requires_grad());
  if (linear.bias.defined()) bias = register_parameter("bias", linear.bias, linear.bias.requires_grad());
  observed_min = register_buffer("observed_min", zeros({1}, kF32));
  observed_max = register_buffer("observed_max", zeros({1}, kF32));
}

Tensor QatLinearImpl::forward(const Tensor& x) {
  FRUGAL_CHECK_DTYPE(x.dtype() == kF32, "QatLinear: expected an f32 input, got ", x.dtype());
  if (is_training()) {  // Moving-average min-max (PyTorch's MovingAverageMinMaxObserver, constant 0.01)
    const Tensor xc = contiguous(x.detach());
    const quant::InputQuant q = quant::choose_input_qparams(xc.data<float>(), xc.numel());
    const float lo = -float(q.zero_point) * q.scale, hi = lo + q.scale * float(quant::kInputQMax);
    float &mn = observed_min.data<float>()[0], &mx = observed_max.data<float>()[0];
    mn = observed ? mn + 0.01f * (lo - mn) : lo;
    mx = observed ? mx + 0.01f * (hi - mx) : hi;
    observed = true;
  }
  FRUGAL_CHECK(observed, "QatLinear: no batch observed yet; run forward in training mode first");
  const float mn = std::min(observed_min.data<float>()[0], 0.0f),
              mx = std::max(observed_max.data<float>()[0], 0.0f);
  const float s = mx > mn ? (mx - mn) / float(quant::kInputQMax) : 1.0f;
  const auto zp = int64_t(std::clamp(std::nearbyint(-mn / s), 0.0f, float(quant::kInputQMax)));
  std::vector<double> ws(size_t(weight.size(0)));
  {
    const Tensor wc = contiguous(weight.detach());
    const int64_t cols = weight.size(1);
    for (int64_t o = 0; o < weight.size(0); ++o) {
      float amax = 0;
      for (int64_t i = 0; i < cols; ++i) amax = std::max(amax, std::fabs(wc.data<float>()[o * cols + i]));
      ws[size_t(o)] = amax > 0 ? double(amax / 127.0f) : 1.0;
    }
  }
  const Tensor xq = functional::fake_quantize(x, double(s), zp, 0, quant::kInputQMax);
  const Tensor wq = functional::fake_quantize_per_row(weight, ws, -127, 127);
  return functional::linear(xq, wq, bias);
}

ObservedLinearImpl::ObservedLinearImpl(const LinearImpl& linear, quant::Observer obs)
    : Module("ObservedLinear"), observer(obs) {
  FRUGAL_CHECK_DTYPE(linear.weight.dtype() == kF32 && linear.weight.device() == kCPU,
                     "quant::prepare: expected an f32 cpu Linear, got ", linear.weight.dtype());
  weight = register_parameter("weight", linear.weight, linear.weight.requires_grad());
  if (linear.bias.defined()) bias = register_parameter("bias", linear.bias, linear.bias.requires_grad());
}

Tensor ObservedLinearImpl::forward(const Tensor& x) {
  FRUGAL_CHECK_DTYPE(x.dtype() == kF32, "ObservedLinear: expected an f32 input, got ", x.dtype());
  const Tensor xc = contiguous(x.detach());
  const float* v = xc.data<float>();
  const int64_t n = xc.numel();
  float lo = batches ? min_ : v[0], hi = batches ? max_ : v[0], amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, v[i]);
    hi = std::max(hi, v[i]);
    amax = std::max(amax, std::fabs(v[i]));
  }
  min_ = lo, max_ = hi;
  if (observer == quant::Observer::Histogram) {
    if (batches == 0) {
      histogram_.assign(2048, 0);
      bin_width_ = amax > 0 ? 2 * amax / 2048 : 1.0f;
    }
    for (int64_t i = 0; i < n; ++i)
      ++histogram_[size_t(std::min<int64_t>(2047, int64_t(std::fabs(v[i]) / bin_width_)))];
  }
  ++batches;
  return functional::linear(x, weight, bias);
}

std::pair<float, float> ObservedLinearImpl::range() const {
  if (observer == quant::Observer::MinMax || histogram_.empty()) return {min_, max_};
  const int64_t total = std::accumulate(histogram_.begin(), histogram_.end(), int64_t(0));
  int64_t seen = 0;
  size_t bin = 0;
  while (bin + 1 < histogram_.size() && double(seen + histogram_[bin]) < 0.9999 * double(total))
    seen += histogram_[bin++];
  const float clip = float(bin + 1) * bin_width_;
  return {std::max(min_, -clip), std::min(max_, clip)};
}

namespace quant {

// Rounds half to even (as std::nearbyint in the default rounding mode) by adding and removing 1.5 * 2^23,
// exact for |v| < 2^22 (callers clamp first); unlike std::nearbyint, a library call, it vectorises.
inline float round_even(float v) {
  constexpr float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;
}

InputQuant choose_input_qparams(const float* x, int64_t n) {
  float lo = 0, hi = 0;
#pragma omp parallel for simd reduction(min : lo) reduction(max : hi) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  if (hi == lo) return {1.0f, 0};
  const float scale = (hi - lo) / float(kInputQMax);
  const auto zp = int32_t(std::clamp(std::nearbyint(-lo / scale), 0.0f, float(kInputQMax)));
  return {scale, zp};
}

void quantize_input(const float* x, int64_t n, InputQuant q, uint8_t* out) {
  const float inv = 1.0f / q.scale, zp = float(q.zero_point);
  // Clamped to [-zp - 1, kInputQMax - zp + 1] before rounding, so round_even is exact and the result the
  // same.
  const float lo = -zp - 1, hi = float(kInputQMax) - zp + 1;
#pragma omp parallel for simd if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i] * inv;
    v = v < lo ? lo : v;  // ternaries rather than std::clamp's references, so that this is minps/maxps
    v = v > hi ? hi : v;
    v = round_even(v) + zp;
    v = v < 0.0f ? 0.0f : v;
    v = v > float(kInputQMax) ? float(kInputQMax) : v;
    out[i] = uint8_t(int32_t(v));
  }
}

int quantize_dynamic(Module& model) {
  FRUGAL_CHECK(dynamic_cast<LinearImpl*>(&model) == nullptr,
               "quantize_dynamic: the model is itself a Linear, which cannot replace itself; put it in a "
               "Sequential (or another module) first");
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> linears;
  for (const auto& [path, module] : model.named_modules())
    if (auto* lin = dynamic_cast<LinearImpl*>(module.get())) {
      FRUGAL_CHECK_DTYPE(lin->weight.dtype() == kF32 && lin->weight.device() == kCPU,
                         "quantize_dynamic: Linear '", path, "' has a ", lin->weight.dtype(), " weight on ",
                         lin->weight.device(),
                         "; only f32 cpu models can be quantised (convert it with to(kF32))");
      linears.emplace_back(path, module);
    }
  for (auto& [path, module] : linears) {
    auto* lin = static_cast<LinearImpl*>(module.get());
    auto q = std::make_shared<QuantizedLinearImpl>(lin->weight, lin->bias);
    module.reset();  // our reference, so the Linear (and its f32 weight) goes when the model lets it go
    model.replace_module(path, q);
  }
  return int(linears.size());
}

std::set<std::string> int8_names(const Module& model) {
  std::set<std::string> names;
  for (const auto& [path, module] : model.named_modules())
    if (dynamic_cast<QuantizedLinearImpl*>(module.get())) names.insert(path + ".weight");
  return names;
}

int prepare_qat(Module& model) {
  FRUGAL_CHECK(dynamic_cast<LinearImpl*>(&model) == nullptr,
               "prepare_qat: the model is itself a Linear, which cannot replace itself; wrap it first");
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> found;
  for (const auto& [path, module] : model.named_modules())
    if (dynamic_cast<LinearImpl*>(module.get())) found.emplace_back(path, module);
  for (auto& [path, module] : found)
    model.replace_module(path, std::make_shared<QatLinearImpl>(static_cast<const LinearImpl&>(*module)));
  return int(found.size());
}

int prepare(Module& model, Observer observer) {
  FRUGAL_CHECK(dynamic_cast<LinearImpl*>(&model) == nullptr,
               "quant::prepare: the model is itself a Linear, which cannot replace itself; wrap it first");
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> found;
  for (const auto& [path, module] : model.named_modules())
    if (dynamic_cast<LinearImpl*>(module.get())) found.emplace_back(path, module);
  for (auto& [path, module] : found)
    model.replace_module(
        path, std::make_shared<ObservedLinearImpl>(static_cast<const LinearImpl&>(*module), observer));
  return int(found.size());
}

int convert(Module& model) {
  struct Found {
    std::string path;
    std::shared_ptr<Module> module;
    Tensor weight, bias;
    float lo, hi;
  };
  std::vector<Found> found;
  for (const auto& [path, module] : model.named_modules()) {
    if (auto* q = dynamic_cast<QatLinearImpl*>(module.get())) {
      FRUGAL_CHECK(q->observed, "convert: QatLinear '", path, "' has observed no batch; train it first");
      found.push_back({path, module, q->weight, q->bias, q->observed_min.data<float>()[0],
                       q->observed_max.data<float>()[0]});
    } else if (auto* o = dynamic_cast<ObservedLinearImpl*>(module.get())) {
      FRUGAL_CHECK(o->batches > 0, "convert: ObservedLinear '", path,
                   "' has observed no batch; calibrate it (run batches through the model) first");
      const auto [lo, hi] = o->range();
      found.push_back({path, module, o->weight, o->bias, lo, hi});
    }
  }
  for (Found& f : found) {
    const float mn = std::min(f.lo, 0.0f), mx = std::max(f.hi, 0.0f);
    const float s = mx > mn ? (mx - mn) / float(kInputQMax) : 1.0f;
    const auto zp = int32_t(std::clamp(std::nearbyint(-mn / s), 0.0f, float(kInputQMax)));
    NoGradGuard ng;
    auto ql = std::make_shared<QuantizedLinearImpl>(f.weight.detach(),
                                                    f.bias.defined() ? f.bias.detach() : Tensor(), s, zp);
    f.module.reset();
    f.weight = Tensor();
    f.bias = Tensor();
    model.replace_module(f.path, ql);
  }
  return int(found.size());
}

}  // namespace quant
}  // namespace frugal::nn
