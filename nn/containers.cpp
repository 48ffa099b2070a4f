// nn containers: Sequential's forward (plain, or in recompute segments; a Linear and a ReLU after it fused)
// and indexing.
#include "nn/containers.h"

#include <optional>
#include <typeinfo>

#include "autograd/recompute.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/quant.h"

namespace frugal::nn {

namespace {
const std::shared_ptr<Module>& checked_at(const std::vector<std::shared_ptr<Module>>& modules, size_t i,
                                          const char* type) {
  FRUGAL_CHECK_INDEX(i < modules.size(), type, ": index ", i, " is out of range for ", modules.size(),
                     " modules");
  return modules[i];
}

// Note [a convolution, ReLU and pool in chunks]
// Without a tape to record, a Conv2d, a ReLU and a MaxPool2d(2) in a Sequential run as one
// ops::conv2d_relu_pool2 where the device has its fused kernel (the CPU in f32: Note [a convolution pooled
// from its blocked output], kernels/cpu/conv.cpp). Otherwise, and for other pools, the three run over
// chunks of kPoolChunkImages images: each chunk's convolution (with its ReLU) is pooled while it is still in
// the cache, and only the pooled output exists for the whole batch. W2's first convolution at a batch of 256
// wrote 25.7 MB that its pool then read back from memory; now 1.6 MB a chunk. Each image's result does not
// depend on the others' (Note [a large batch's forward in chunks], kernels/cpu/conv.cpp), so the output is
// bit for bit the three layers' apart. With grad mode on and anything to record, the three run apart, since
// backward needs the convolution's output.
constexpr int64_t kPoolChunkImages = 16;

Tensor conv_relu_pool_in_chunks(const Tensor& x, const Conv2dImpl& conv, Module& pool) {
  const Conv2dOptions& o = conv.options();
  const int64_t n = x.size(0);
  Tensor out;
  for (int64_t b = 0; b < n; b += kPoolChunkImages) {
    const int64_t count = std::min(kPoolChunkImages, n - b);
    const Tensor y = pool.forward(conv2d_relu(x.narrow(0, b, count), conv.weight, conv.bias, o.stride(),
                                              o.padding(), o.dilation(), o.groups()));
    if (!out.defined()) {
      Shape shape = y.shape();
      shape[0] = n;
      out = empty(shape, y.options());
    }
    out.narrow(0, b, count).copy_(y);
  }
  return out;
}

// A MaxPool2d over 2 x 2 windows at stride 2, without padding or dilation (MaxPool2d(2)).
bool is_pool2(const Module* m) {
  if (!m || typeid(*m) != typeid(MaxPool2dImpl)) return false;
  const auto& pool = static_cast<const MaxPool2dImpl&>(*m);
  return pool.kernel_size() == Size2(2) && pool.stride() == Size2(2) && pool.padding() == Size2(0) &&
         pool.dilation() == Size2(1);
}

// Runs the QuantizedConv2d at modules[j] on h (its input codes when codes_in) with what follows it: a ReLU,
// and a MaxPool2d(2) after that, as its forward_staged; and after those, a Flatten (of all but the batch) and
// a static QuantizedLinear (with the ReLU after it, if any) whose input codes it makes (Note [an int8
// convolution's input as codes], nn/quant.cpp). Sets j to the last module run.
Tensor run_quantized_conv(const std::vector<std::shared_ptr<Module>>& modules, size_t& j, size_t end,
                          const Tensor& h, bool codes_in) {
  auto& conv = static_cast<QuantizedConv2dImpl&>(*modules[j]);
  // typeid of a reference, not of *shared_ptr: clang warns that the call in the operand is evaluated.
  auto is = [&](size_t k, const std::type_info& type) {
    if (k >= end) return false;
    const Module& m = *modules[k];
    return typeid(m) == type;
  };
  const bool relu = is(j + 1, typeid(ReLUImpl));
  const bool pool2 = relu && j + 2 < end && is_pool2(modules[j + 2].get());
  if (pool2 && h.dim() == 4 && is(j + 3, typeid(FlattenImpl)) && is(j + 4, typeid(QuantizedLinearImpl))) {
    const FlattenOptions& flatten = static_cast<const FlattenImpl&>(*modules[j + 3]).options;
    auto& linear = static_cast<QuantizedLinearImpl&>(*modules[j + 4]);
    const std::optional<quant::InputQuant> out = linear.static_input();
    const int64_t features = conv.pooled_features(h.size(codes_in ? 1 : 2), h.size(codes_in ? 2 : 3));
    if (out && flatten.start_dim() == 1 && (flatten.end_dim() == -1 || flatten.end_dim() == 3) &&
        features > 0 && features == linear.in_features) {
      const Tensor codes = conv.forward_staged(h, codes_in, true, true, &*out);
      const bool linear_relu = is(j + 5, typeid(ReLUImpl));
      j += 4 + size_t(linear_relu);
      return linear.forward_codes(codes, linear_relu);
    }
  }
  j += size_t(relu) + size_t(pool2);
  return conv.forward_staged(h, codes_in, relu, pool2);
}

// Runs modules [begin, end) in order on h; a Linear directly followed by a ReLU (both exactly those classes,
// so no override of forward is skipped) runs as one F::linear_relu, a Conv2d followed by a ReLU as one
// frugal::conv2d_relu, a QuantizedLinear followed by a ReLU as its forward_relu, a QuantizedConv2d with the
// layers after it through run_quantized_conv; a Conv2d, a ReLU and a MaxPool2d with nothing to record as one
// ops::conv2d_relu_pool2 (a MaxPool2d(2), where the device has the fused kernel; into the codes of a static
// QuantizedConv2d after them, Note [an int8 convolution's input as codes]) or over chunks of images (Note [a
// convolution, ReLU and pool in chunks]).

Tensor run_modules(const std::vector<std::shared_ptr<Module>>& modules, size_t begin, size_t end, Tensor h) {
  for (size_t i = begin; i < end; ++i) {
    Module& m = *modules[i];
    const Module* next = i + 1 < end ? modules[i + 1].get() : nullptr;
    if (next && typeid(m) == typeid(LinearImpl) && typeid(*next) == typeid(ReLUImpl)) {
      m.apply_masks();
      const auto& linear = static_cast<const LinearImpl&>(m);
      h = functional::linear_relu(h, linear.weight, linear.bias);
      ++i;
      continue;
    }
    const Module* after = i + 2 < end ? modules[i + 2].get() : nullptr;
    const auto* conv = typeid(m) == typeid(Conv2dImpl) ? static_cast<const Conv2dImpl*>(&m) : nullptr;
    const bool conv_relu_pool = conv && next && after && typeid(*next) == typeid(ReLUImpl) &&
                                typeid(*after) == typeid(MaxPool2dImpl) &&
                                !autograd::needs_grad({&h, &conv->weight, &conv->bias});
    if (conv_relu_pool && is_pool2(after) && ops::has_conv2d_relu_pool2(h.device(), h.dtype())) {
      m.apply_masks();
      // A static QuantizedConv2d next takes the pooled output as its codes (Note [an int8 convolution's input
      // as codes], nn/quant.cpp), with its own ReLU and MaxPool2d(2) if they follow.
      const Module* third = i + 3 < end ? modules[i + 3].get() : nullptr;
      if (third && typeid(*third) == typeid(QuantizedConv2dImpl)) {
        auto& next_conv = static_cast<QuantizedConv2dImpl&>(*modules[i + 3]);
        if (const Tensor codes = quant::conv2d_relu_pool2_codes(h, *conv, next_conv); codes.defined()) {
          i += 3;
          h = run_quantized_conv(modules, i, end, codes, true);
          continue;
        }
      }
      const Conv2dOptions& o = conv->options();
      h = ops::conv2d_relu_pool2(h, conv->weight, conv->bias, o.stride(), o.padding(), o.dilation(),
                                 o.groups());
      i += 2;
      continue;
    }
    if (conv_relu_pool && h.dim() == 4 && h.size(0) > kPoolChunkImages) {
      m.apply_masks();
      h = conv_relu_pool_in_chunks(h, *conv, *modules[i + 2]);
      i += 2;
      continue;
    }
    if (next && typeid(m) == typeid(Conv2dImpl) && typeid(*next) == typeid(ReLUImpl)) {
      m.apply_masks();
      const auto& conv = static_cast<const Conv2dImpl&>(m);
      const Conv2dOptions& o = conv.options();
      h = conv2d_relu(h, conv.weight, conv.bias, o.stride(), o.padding(), o.dilation(), o.groups());
      ++i;
      continue;
    }
    if (next && typeid(m) == typeid(QuantizedLinearImpl) && typeid(*next) == typeid(ReLUImpl)) {
      h = static_cast<QuantizedLinearImpl&>(m).forward_relu(h);
      ++i;
      continue;
    }
    if (typeid(m) == typeid(QuantizedConv2dImpl)) {
      h = run_quantized_conv(modules, i, end, h, false);
      continue;
    }
    h = m.forward(h);
  }
  return h;
}

}  // namespace

SequentialImpl::SequentialImpl(std::initializer_list<std::shared_ptr<Module>> modules)
    : Module("Sequential") {
  for (const auto& m : modules) push_back(m);
}

const std::shared_ptr<Module>& SequentialImpl::operator[](size_t i) const {
  return checked_at(modules_, i, "Sequential");
}

// A container's children are named by their index ("0", "1", ...).
void SequentialImpl::child_replaced(const std::string& name, const std::shared_ptr<Module>& module) {
  modules_.at(std::stoul(name)) = module;
}

SequentialImpl& SequentialImpl::recompute_every(int k) {
  FRUGAL_CHECK(k >= 0, "Sequential::recompute_every: k must be >= 0 (0 turns recompute off), got ", k);
  recompute_every_ = k;
  return *this;
}

Tensor SequentialImpl::forward(const Tensor& x) {
  Tensor h = x;
  if (recompute_every_ == 0 || !autograd::grad_mode_enabled() || modules_.empty())
    return run_modules(modules_, 0, modules_.size(), h);
  const size_t k = size_t(recompute_every_);
  // The last segment runs plainly: backward starts with it, so its activations would be recomputed at once
  // and the peak is the same either way (PyTorch's checkpoint_sequential does the same).
  const size_t last = (modules_.size() - 1) / k * k;
  for (size_t s = 0; s < modules_.size(); s += k) {
    if (s == last) {
      h = run_modules(modules_, s, modules_.size(), h);
      break;
    }
    // The segment holds its modules, so it stays valid however long backward takes to reach it.
    std::vector<std::shared_ptr<Module>> group(modules_.begin() + long(s),
                                               modules_.begin() + long(std::min(s + k, modules_.size())));
    h = autograd::recompute(
        [group](const std::vector<Tensor>& in) { return run_modules(group, 0, group.size(), in[0]); }, {h});
  }
  return h;
}

ModuleListImpl::ModuleListImpl(std::initializer_list<std::shared_ptr<Module>> modules)
    : Module("ModuleList") {
  for (const auto& m : modules) push_back(m);
}

void ModuleListImpl::child_replaced(const std::string& name, const std::shared_ptr<Module>& module) {
  modules_.at(std::stoul(name)) = module;
}

const std::shared_ptr<Module>& ModuleListImpl::operator[](size_t i) const {
  return checked_at(modules_, i, "ModuleList");
}

}  // namespace frugal::nn
