// nn::quant (nn/quant.h), the way to the int8 layers of nn/quant.cpp: fake quantisation and the QAT layers,
// the static observers, and the model rewrites (quantize_dynamic, prepare, prepare_qat, convert).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "autograd/graph.h"
#include "core/error.h"
#include "core/ops.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "nn/quant.h"

namespace frugal::nn {

using autograd::Grads;
using autograd::Node;
using autograd::recorded;

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

namespace {

// A QAT layer's forward before its op: in training, the moving-average min-max of the input (PyTorch's
// MovingAverageMinMaxObserver, constant 0.01) moves; then the input is fake-quantised per tensor with the
// observed range and the weight per output channel (symmetric). Returns (input, weight), both carrying
// gradients straight through.
std::pair<Tensor, Tensor> qat_fake_quantize(const char* who, bool training, const Tensor& x,
                                            const Tensor& weight, Tensor& observed_min, Tensor& observed_max,
                                            bool& observed) {
  FRUGAL_CHECK_DTYPE(x.dtype() == kF32, who, ": expected an f32 input, got ", x.dtype());
  if (training) {
    const Tensor xc = contiguous(x.detach());
    const quant::InputQuant q = quant::choose_input_qparams(xc.data<float>(), xc.numel());
    const float lo = -float(q.zero_point) * q.scale, hi = lo + q.scale * float(quant::kInputQMax);
    float &mn = observed_min.data<float>()[0], &mx = observed_max.data<float>()[0];
    mn = observed ? mn + 0.01f * (lo - mn) : lo;
    mx = observed ? mx + 0.01f * (hi - mx) : hi;
    observed = true;
  }
  FRUGAL_CHECK(observed, who, ": no batch observed yet; run forward in training mode first");
  const quant::InputQuant in =
      quant::input_qparams_of_range(observed_min.data<float>()[0], observed_max.data<float>()[0]);
  const int64_t rows = weight.size(0), cols = weight.numel() / rows;
  std::vector<double> ws(static_cast<size_t>(rows));
  const Tensor wc = contiguous(weight.detach());
  for (int64_t o = 0; o < rows; ++o)
    ws[size_t(o)] = double(quant::weight_row_scale(wc.data<float>() + o * cols, cols));
  const Tensor xq = functional::fake_quantize(x, double(in.scale), in.zero_point, 0, quant::kInputQMax);
  const Tensor wq =
      functional::fake_quantize_per_row(weight.reshape({rows, cols}), ws, -127, 127).reshape(weight.shape());
  return {xq, wq};
}

}  // namespace

Tensor QatLinearImpl::forward(const Tensor& x) {
  const auto [xq, wq] =
      qat_fake_quantize("QatLinear", is_training(), x, weight, observed_min, observed_max, observed);
  return functional::linear(xq, wq, bias);
}

QatConv2dImpl::QatConv2dImpl(const Conv2dImpl& conv) : Module("QatConv2d"), options_(conv.options()) {
  FRUGAL_CHECK_DTYPE(conv.weight.dtype() == kF32 && conv.weight.device() == kCPU,
                     "prepare_qat: expected an f32 cpu Conv2d, got ", conv.weight.dtype());
  weight = register_parameter("weight", conv.weight, conv.weight.requires_grad());
  if (conv.bias.defined()) bias = register_parameter("bias", conv.bias, conv.bias.requires_grad());
  observed_min = register_buffer("observed_min", zeros({1}, kF32));
  observed_max = register_buffer("observed_max", zeros({1}, kF32));
}

Tensor QatConv2dImpl::forward(const Tensor& x) {
  const auto [xq, wq] =
      qat_fake_quantize("QatConv2d", is_training(), x, weight, observed_min, observed_max, observed);
  const auto& o = options_;
  return conv2d(xq, wq, bias, o.stride(), o.padding(), o.dilation(), o.groups());
}

namespace quant {

void RangeObserver::observe(const Tensor& x) {
  FRUGAL_CHECK_DTYPE(x.dtype() == kF32, "quant observer: expected an f32 input, got ", x.dtype());
  const Tensor xc = contiguous(x.detach());
  const float* v = xc.data<float>();
  const int64_t n = xc.numel();
  if (n == 0) return;
  float lo = batches ? min_ : v[0], hi = batches ? max_ : v[0], amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, v[i]);
    hi = std::max(hi, v[i]);
    amax = std::max(amax, std::fabs(v[i]));
  }
  min_ = lo, max_ = hi;
  if (observer == Observer::Histogram) {
    if (batches == 0) {
      histogram_.assign(2048, 0);
      bin_width_ = amax > 0 ? 2 * amax / 2048 : 1.0f;
    }
    for (int64_t i = 0; i < n; ++i)
      ++histogram_[size_t(std::min<int64_t>(2047, int64_t(std::fabs(v[i]) / bin_width_)))];
  }
  ++batches;
}

std::pair<float, float> RangeObserver::range() const {
  if (observer == Observer::MinMax || histogram_.empty()) return {min_, max_};
  const int64_t total = std::accumulate(histogram_.begin(), histogram_.end(), int64_t(0));
  int64_t seen = 0;
  size_t bin = 0;
  while (bin + 1 < histogram_.size() && double(seen + histogram_[bin]) < 0.9999 * double(total))
    seen += histogram_[bin++];
  const float clip = float(bin + 1) * bin_width_;
  return {std::max(min_, -clip), std::min(max_, clip)};
}

}  // namespace quant

ObservedLinearImpl::ObservedLinearImpl(const LinearImpl& linear, quant::Observer obs)
    : Module("ObservedLinear"), RangeObserver(obs) {
  FRUGAL_CHECK_DTYPE(linear.weight.dtype() == kF32 && linear.weight.device() == kCPU,
                     "quant::prepare: expected an f32 cpu Linear, got ", linear.weight.dtype());
  weight = register_parameter("weight", linear.weight, linear.weight.requires_grad());
  if (linear.bias.defined()) bias = register_parameter("bias", linear.bias, linear.bias.requires_grad());
}

Tensor ObservedLinearImpl::forward(const Tensor& x) {
  observe(x);
  return functional::linear(x, weight, bias);
}

ObservedConv2dImpl::ObservedConv2dImpl(const Conv2dImpl& conv, quant::Observer obs)
    : Module("ObservedConv2d"), RangeObserver(obs), options_(conv.options()) {
  FRUGAL_CHECK_DTYPE(conv.weight.dtype() == kF32 && conv.weight.device() == kCPU,
                     "quant::prepare: expected an f32 cpu Conv2d, got ", conv.weight.dtype());
  weight = register_parameter("weight", conv.weight, conv.weight.requires_grad());
  if (conv.bias.defined()) bias = register_parameter("bias", conv.bias, conv.bias.requires_grad());
}

Tensor ObservedConv2dImpl::forward(const Tensor& x) {
  observe(x);
  const auto& o = options_;
  return conv2d(x, weight, bias, o.stride(), o.padding(), o.dilation(), o.groups());
}

namespace quant {

int quantize_dynamic(Module& model) {
  FRUGAL_CHECK(
      dynamic_cast<LinearImpl*>(&model) == nullptr && dynamic_cast<EmbeddingImpl*>(&model) == nullptr,
      "quantize_dynamic: the model is itself a ", model.type_name(),
      ", which cannot replace itself; put it in a Sequential (or another module) first");
  std::vector<std::string> paths;
  for (const auto& [path, module] : model.named_modules()) {
    const Tensor* w = nullptr;
    if (auto* lin = dynamic_cast<LinearImpl*>(module.get())) w = &lin->weight;
    if (auto* emb = dynamic_cast<EmbeddingImpl*>(module.get())) w = &emb->weight;
    if (!w) continue;
    FRUGAL_CHECK_DTYPE(w->dtype() == kF32 && w->device() == kCPU, "quantize_dynamic: ", module->type_name(),
                       " '", path, "' has a ", w->dtype(), " weight on ", w->device(),
                       "; only f32 cpu models can be quantised (convert it with to(kF32))");
    paths.push_back(path);
  }
  // One layer at a time, each f32 weight freed as soon as its int8 form is in place.
  rewrite_modules(
      model, paths,
      [](Module& m) -> std::shared_ptr<Module> {
        if (auto* lin = dynamic_cast<LinearImpl*>(&m))
          return std::make_shared<QuantizedLinearImpl>(lin->weight, lin->bias);
        return std::make_shared<QuantizedEmbeddingImpl>(static_cast<EmbeddingImpl&>(m).weight);
      },
      "quantize_dynamic");
  return int(paths.size());
}

std::set<std::string> int8_names(const Module& model) {
  std::set<std::string> names;
  for (const auto& [path, module] : model.named_modules())
    if (dynamic_cast<QuantizedLinearImpl*>(module.get()) ||
        dynamic_cast<QuantizedConv2dImpl*>(module.get()) ||
        dynamic_cast<QuantizedEmbeddingImpl*>(module.get()))
      names.insert(path + ".weight");
  return names;
}

namespace {

// The layers prepare and prepare_qat take: every Linear, and the Conv2ds that pay in int8 (groups 1, patches
// of at least kMinConvPatch values).
std::vector<std::string> quantisable_layers(Module& model, const char* who) {
  FRUGAL_CHECK(dynamic_cast<LinearImpl*>(&model) == nullptr && dynamic_cast<Conv2dImpl*>(&model) == nullptr,
               who, ": the model is itself a ", model.type_name(),
               ", which cannot replace itself; wrap it first");
  std::vector<std::string> found;
  for (const auto& [path, module] : model.named_modules()) {
    const auto* conv = dynamic_cast<const Conv2dImpl*>(module.get());
    const bool conv_pays =
        conv && conv->options().groups() == 1 &&
        conv->options().in_channels() * conv->options().kernel_size().h * conv->options().kernel_size().w >=
            kMinConvPatch;
    if (dynamic_cast<LinearImpl*>(module.get()) || conv_pays) found.push_back(path);
  }
  return found;
}

}  // namespace

int prepare_qat(Module& model) {
  const std::vector<std::string> paths = quantisable_layers(model, "prepare_qat");
  rewrite_modules(
      model, paths,
      [](Module& m) -> std::shared_ptr<Module> {
        if (auto* lin = dynamic_cast<const LinearImpl*>(&m)) return std::make_shared<QatLinearImpl>(*lin);
        return std::make_shared<QatConv2dImpl>(static_cast<const Conv2dImpl&>(m));
      },
      "prepare_qat");
  return int(paths.size());
}

int prepare(Module& model, Observer observer) {
  const std::vector<std::string> paths = quantisable_layers(model, "quant::prepare");
  rewrite_modules(
      model, paths,
      [observer](Module& m) -> std::shared_ptr<Module> {
        if (auto* lin = dynamic_cast<const LinearImpl*>(&m))
          return std::make_shared<ObservedLinearImpl>(*lin, observer);
        return std::make_shared<ObservedConv2dImpl>(static_cast<const Conv2dImpl&>(m), observer);
      },
      "quant::prepare");
  return int(paths.size());
}

int convert(Module& model) {
  // What a converted layer is made from: its weight and bias, its input's observed range, and its
  // convolution's options (null for a Linear); nothing for a module that is not converted.
  struct Observed {
    Tensor weight, bias;
    float lo = 0, hi = 0;
    const Conv2dOptions* conv = nullptr;
  };
  auto observed_of = [](Module& m, const std::string& path) -> std::optional<Observed> {
    if (auto* q = dynamic_cast<QatLinearImpl*>(&m)) {
      FRUGAL_CHECK(q->observed, "convert: QatLinear '", path, "' has observed no batch; train it first");
      return Observed{q->weight, q->bias, q->observed_min.data<float>()[0], q->observed_max.data<float>()[0],
                      nullptr};
    }
    if (auto* c = dynamic_cast<QatConv2dImpl*>(&m)) {
      FRUGAL_CHECK(c->observed, "convert: QatConv2d '", path, "' has observed no batch; train it first");
      return Observed{c->weight, c->bias, c->observed_min.data<float>()[0], c->observed_max.data<float>()[0],
                      &c->options()};
    }
    if (auto* o = dynamic_cast<RangeObserver*>(&m)) {
      FRUGAL_CHECK(o->batches > 0, "convert: ", m.type_name(), " '", path,
                   "' has observed no batch; calibrate it (run batches through the model) first");
      const auto [lo, hi] = o->range();
      if (auto* c = dynamic_cast<ObservedConv2dImpl*>(&m))
        return Observed{c->weight, c->bias, lo, hi, &c->options()};
      if (auto* l = dynamic_cast<ObservedLinearImpl*>(&m))
        return Observed{l->weight, l->bias, lo, hi, nullptr};
    }
    return std::nullopt;
  };
  std::vector<std::string> paths;
  for (const auto& [path, module] : model.named_modules())
    if (observed_of(*module, path)) paths.push_back(path);
  // One layer at a time, each f32 weight freed as soon as its int8 form is in place.
  rewrite_modules(
      model, paths,
      [&](Module& m) -> std::shared_ptr<Module> {
        const Observed f = *observed_of(m, "");
        const InputQuant in = input_qparams_of_range(f.lo, f.hi);
        NoGradGuard ng;
        const Tensor b = f.bias.defined() ? f.bias.detach() : Tensor();
        if (f.conv) return std::make_shared<QuantizedConv2dImpl>(*f.conv, f.weight.detach(), b, &in);
        return std::make_shared<QuantizedLinearImpl>(f.weight.detach(), b, in.scale, in.zero_point);
      },
      "convert");
  return int(paths.size());
}

}  // namespace quant
}  // namespace frugal::nn
