// Pruning (Note [pruning masks] in nn/prune.h): magnitude, random and structured masks as packed bits, the
// masks held in forward and on the gradient, shrinking a Sequential, and the CSR Linear.
#include "nn/prune.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <typeinfo>

#include "autograd/graph.h"
#include "core/op_table_sparse.h"
#include "nn/containers.h"
#include "nn/conv.h"

namespace frugal::nn {

namespace {

// The bits of a mask, unpacked: one byte per element, 1 keeps it.
using Keep = std::vector<uint8_t>;

void check_prunable(const Tensor& p, const char* op, const std::string& name) {
  FRUGAL_CHECK_DTYPE(p.dtype() == DType::F32 || p.dtype() == DType::F64, op, ": parameter '", name,
                     "' must be f32 or f64, got ", dtype_name(p.dtype()));
  FRUGAL_CHECK(p.device().is_cpu() && p.is_contiguous(), op, ": parameter '", name,
               "' must be a contiguous CPU tensor (pruning runs on the CPU), got ", p.device().str());
}

void check_amount(double amount, const char* op) {
  FRUGAL_CHECK(amount >= 0 && amount <= 1, op, ": amount must be a fraction in [0, 1], got ", amount);
}

// The module's parameter `name`, checked.
const Tensor& prunable(const Module& m, const std::string& name, const char* op) {
  const Tensor& p = m.parameter(name);
  check_prunable(p, op, name);
  return p;
}

Keep current_keep(const Module& m, const std::string& name, int64_t n) {
  Keep keep(size_t(n), 1);
  const Tensor bits = m.mask(name);
  if (!bits.defined()) return keep;
  const uint8_t* b = bits.data<uint8_t>();
  for (int64_t i = 0; i < n; ++i) keep[size_t(i)] = (b[i >> 3] >> (i & 7)) & 1;
  return keep;
}

// Packs keep into the module's mask of `name` and applies it (the weight's pruned elements become 0 now).
void commit(Module& m, const std::string& name, const Keep& keep) {
  std::vector<uint8_t> packed((keep.size() + 7) / 8, 0);
  for (size_t i = 0; i < keep.size(); ++i) packed[i >> 3] |= uint8_t(keep[i] << (i & 7));
  m.set_mask(name, tensor<uint8_t>(packed, {int64_t(packed.size())}));
  m.apply_masks();
}

std::vector<double> values_of(const Tensor& p) { return p.to_vector<double>(); }

// Clears the bits of the `k` candidates with the smallest score (ties: the lower index first).
void prune_smallest(std::vector<int64_t> candidates, const std::vector<double>& score, int64_t k,
                    const std::function<void(int64_t)>& clear) {
  k = std::clamp<int64_t>(k, 0, int64_t(candidates.size()));
  auto less = [&](int64_t a, int64_t b) {
    return score[size_t(a)] < score[size_t(b)] || (score[size_t(a)] == score[size_t(b)] && a < b);
  };
  std::nth_element(candidates.begin(), candidates.begin() + k, candidates.end(), less);
  for (int64_t i = 0; i < k; ++i) clear(candidates[size_t(i)]);
}

int64_t count_of(double amount, size_t remaining) {
  return int64_t(std::llround(amount * double(remaining)));
}

// Unstructured pruning of one parameter by a score per element (|w|, or a random draw).
void prune_by_score(Module& m, const std::string& name, double amount, const std::vector<double>& score) {
  const int64_t n = int64_t(score.size());
  Keep keep = current_keep(m, name, n);
  std::vector<int64_t> remaining;
  for (int64_t i = 0; i < n; ++i)
    if (keep[size_t(i)]) remaining.push_back(i);
  const int64_t k = count_of(amount, remaining.size());
  prune_smallest(std::move(remaining), score, k, [&](int64_t i) { keep[size_t(i)] = 0; });
  commit(m, name, keep);
}

// Branch-free within each byte (a select per lane, which the compiler turns into 8-wide blends); a byte of
// all ones is skipped whole.
template <typename T>
void zero_masked(T* x, const uint8_t* bits, int64_t n) {
  const int64_t full = n / 8;
  for (int64_t byte = 0; byte < full; ++byte) {
    const uint32_t b = bits[byte];
    if (b == 0xFF) continue;
    T* p = x + byte * 8;
#pragma omp simd
    for (int j = 0; j < 8; ++j) p[j] = ((b >> j) & 1u) ? p[j] : T(0);
  }
  for (int64_t i = full * 8; i < n; ++i)
    if (!((bits[i >> 3] >> (i & 7)) & 1)) x[i] = T(0);
}

}  // namespace

// ---- SparseLinear ----

SparseLinearImpl::SparseLinearImpl(const LinearImpl& linear)
    : Module("SparseLinear"), in_(linear.options.in_features()), out_(linear.options.out_features()) {
  const Tensor& w = linear.weight;
  FRUGAL_CHECK_DTYPE(w.dtype() == DType::F32 && w.device().is_cpu() && w.dim() == 2,
                     "SparseLinear: the Linear's weight must be an f32 CPU matrix, got ",
                     dtype_name(w.dtype()), " ", w.shape(), " on ", w.device().str());
  const std::vector<float> dense = w.to_vector<float>();
  std::vector<float> vals;
  std::vector<int32_t> cols, offsets{0};
  FRUGAL_CHECK(in_ < INT32_MAX && out_ * in_ < INT32_MAX, "SparseLinear: a weight of ", w.shape(),
               " needs 64-bit indices, which this CSR does not have");
  for (int64_t r = 0; r < out_; ++r) {
    for (int64_t c = 0; c < in_; ++c) {
      const float v = dense[size_t(r * in_ + c)];
      if (v != 0) {
        vals.push_back(v);
        cols.push_back(int32_t(c));
      }
    }
    offsets.push_back(int32_t(vals.size()));
  }
  const auto nnz = int64_t(vals.size());
  values = register_buffer("values", tensor<float>(vals, {nnz}));
  col_indices = register_buffer("col_indices", tensor<int32_t>(cols, {nnz}));
  row_offsets = register_buffer("row_offsets", tensor<int32_t>(offsets, {out_ + 1}));
  if (linear.bias.defined()) bias = register_buffer("bias", linear.bias.detach().clone());
}

Tensor SparseLinearImpl::forward(const Tensor& x) {
  FRUGAL_CHECK(!(autograd::grad_mode_enabled() && x.requires_grad()),
               "SparseLinear: for inference only; its input requires grad (run it under NoGradGuard or "
               "InferenceMode)");
  FRUGAL_CHECK_DTYPE(x.dtype() == DType::F32 && x.device().is_cpu(),
                     "SparseLinear: the input must be f32 on the CPU, got ", dtype_name(x.dtype()), " on ",
                     x.device().str());
  FRUGAL_CHECK_SHAPE(x.dim() >= 1 && x.size(-1) == in_, "SparseLinear: input shape ", x.shape(),
                     " must end in the ", in_, " input features");
  NoGradGuard no_record;
  const Tensor x2 = x.reshape({-1, in_}).contiguous();
  const int64_t batch = x2.size(0);
  Shape shape = x.shape();
  shape[shape.size() - 1] = out_;
  Tensor out = empty({batch, out_});
  CsrMatmulArgs a;
  a.values = values.raw_data();
  a.col_indices = col_indices.data<int32_t>();
  a.row_offsets = row_offsets.data<int32_t>();
  a.x = x2.raw_data();
  a.bias = bias.defined() ? bias.raw_data() : nullptr;
  a.out = out.raw_data();
  a.rows = out_, a.cols = in_, a.nnz = values.numel(), a.batch = batch;
  op_csr_matmul.get(kCPU, DType::F32)(a);
  return out.reshape(shape);
}

}  // namespace frugal::nn

namespace frugal::nn::prune {

void l1_unstructured(Module& module, const std::string& name, double amount) {
  check_amount(amount, "l1_unstructured");
  std::vector<double> score = values_of(prunable(module, name, "l1_unstructured"));
  for (double& v : score) v = std::abs(v);
  prune_by_score(module, name, amount, score);
}

void random_unstructured(Module& module, const std::string& name, double amount) {
  check_amount(amount, "random_unstructured");
  const Tensor& p = prunable(module, name, "random_unstructured");
  prune_by_score(module, name, amount, rand({p.numel()}, DType::F64).to_vector<double>());
}

void ln_structured(Module& module, const std::string& name, double amount, double n, int64_t dim) {
  const char* op = "ln_structured";
  check_amount(amount, op);
  FRUGAL_CHECK(n > 0 && !std::isnan(n), op, ": the norm's order n must be > 0, got ", n);
  const Tensor& p = prunable(module, name, op);
  FRUGAL_CHECK(dim >= -p.dim() && dim < p.dim(), op, ": dim ", dim, " is out of range for parameter '", name,
               "' of shape ", p.shape());
  if (dim < 0) dim += p.dim();
  const int64_t slices = p.size(dim), stride = p.stride(dim), numel = p.numel();
  const std::vector<double> w = values_of(p);
  Keep keep = current_keep(module, name, numel);
  std::vector<double> norm(size_t(slices), 0.0);
  std::vector<uint8_t> alive(size_t(slices), 0);
  auto slice_of = [&](int64_t i) { return (i / stride) % slices; };
  for (int64_t i = 0; i < numel; ++i) {
    const int64_t s = slice_of(i);
    norm[size_t(s)] += std::pow(std::abs(w[size_t(i)]), n);
    alive[size_t(s)] |= keep[size_t(i)];
  }
  std::vector<int64_t> remaining;
  for (int64_t s = 0; s < slices; ++s)
    if (alive[size_t(s)]) remaining.push_back(s);
  std::vector<uint8_t> cut(size_t(slices), 0);
  const int64_t k = count_of(amount, remaining.size());
  prune_smallest(std::move(remaining), norm, k, [&](int64_t s) { cut[size_t(s)] = 1; });
  for (int64_t i = 0; i < numel; ++i)
    if (cut[size_t(slice_of(i))]) keep[size_t(i)] = 0;
  commit(module, name, keep);
  // A pruned output row is a removed neuron: its bias goes too (Note [pruning masks]).
  const auto params = module.named_parameters(false);
  const bool has_bias =
      std::any_of(params.begin(), params.end(), [](const auto& kv) { return kv.first == "bias"; });
  if (dim == 0 && name == "weight" && has_bias && module.parameter("bias").numel() == slices) {
    check_prunable(module.parameter("bias"), op, "bias");
    Keep bias_keep = current_keep(module, "bias", slices);
    for (int64_t s = 0; s < slices; ++s)
      if (cut[size_t(s)]) bias_keep[size_t(s)] = 0;
    commit(module, "bias", bias_keep);
  }
}

void global_unstructured(const std::vector<std::pair<Module*, std::string>>& parameters, double amount) {
  const char* op = "global_unstructured";
  check_amount(amount, op);
  FRUGAL_CHECK(!parameters.empty(), op, ": no parameters given");
  std::vector<Keep> keeps;
  std::vector<double> score;
  std::vector<std::pair<size_t, int64_t>> where;  // (parameter, element) of each candidate
  for (size_t j = 0; j < parameters.size(); ++j) {
    auto [m, name] = parameters[j];
    FRUGAL_CHECK(m != nullptr, op, ": module ", j, " is null");
    const std::vector<double> w = values_of(prunable(*m, name, op));
    keeps.push_back(current_keep(*m, name, int64_t(w.size())));
    for (size_t i = 0; i < w.size(); ++i) {
      if (!keeps.back()[i]) continue;
      score.push_back(std::abs(w[i]));
      where.emplace_back(j, int64_t(i));
    }
  }
  std::vector<int64_t> candidates(score.size());
  std::iota(candidates.begin(), candidates.end(), int64_t(0));
  const int64_t k = count_of(amount, score.size());
  prune_smallest(std::move(candidates), score, k,
                 [&](int64_t c) { keeps[where[size_t(c)].first][size_t(where[size_t(c)].second)] = 0; });
  for (size_t j = 0; j < parameters.size(); ++j) commit(*parameters[j].first, parameters[j].second, keeps[j]);
}

void remove(Module& module, const std::string& name) {
  FRUGAL_CHECK(is_pruned(module, name), "prune::remove: parameter '", name, "' of ", module.type_name(),
               " is not pruned");
  module.apply_masks();
  module.remove_mask(name);
}

bool is_pruned(const Module& module, const std::string& name) { return module.mask(name).defined(); }

double sparsity(const Tensor& t) {
  if (t.numel() == 0) return 0;
  const std::vector<double> v = t.to_vector<double>();
  return double(std::count(v.begin(), v.end(), 0.0)) / double(v.size());
}

namespace {

// A Linear or Conv2d of a Sequential, with the rows (output features or channels) it keeps.
struct Layer {
  size_t index;
  Module* module;
  std::vector<int64_t> kept_out;
  int64_t out = 0;
};

bool is_linear(const Module& m) { return typeid(m) == typeid(LinearImpl); }
bool is_conv(const Module& m) { return typeid(m) == typeid(Conv2dImpl); }
// Modules that map 0 to 0 element-wise (or pick among their inputs) and hold no parameters: a removed row's
// zeros pass them as zeros.
bool sees_through(const Module& m) {
  return typeid(m) == typeid(ReLUImpl) || typeid(m) == typeid(MaxPool2dImpl) ||
         typeid(m) == typeid(DropoutImpl) || typeid(m) == typeid(FlattenImpl);
}

const Tensor& weight_of(const Module& m) {
  return is_linear(m) ? static_cast<const LinearImpl&>(m).weight : static_cast<const Conv2dImpl&>(m).weight;
}
const Tensor& bias_of(const Module& m) {
  return is_linear(m) ? static_cast<const LinearImpl&>(m).bias : static_cast<const Conv2dImpl&>(m).bias;
}

// Rows whose weight and bias are all exactly 0 (an output that is always 0) are dropped.
std::vector<int64_t> live_rows(const Module& m) {
  const Tensor& w = weight_of(m);
  const int64_t rows = w.size(0), per = w.numel() / rows;
  const std::vector<double> wv = w.to_vector<double>();
  const std::vector<double> bv =
      bias_of(m).defined() ? bias_of(m).to_vector<double>() : std::vector<double>(size_t(rows), 0.0);
  std::vector<int64_t> live;
  for (int64_t r = 0; r < rows; ++r) {
    const bool zero = bv[size_t(r)] == 0 && std::all_of(wv.begin() + r * per, wv.begin() + (r + 1) * per,
                                                        [](double v) { return v == 0; });
    if (!zero) live.push_back(r);
  }
  if (live.empty()) live.push_back(0);  // a layer of no outputs is no layer: keep one (all-zero) row
  return live;
}

Tensor indices(const std::vector<int64_t>& v) { return tensor<int64_t>(v, {int64_t(v.size())}); }

}  // namespace

void shrink(SequentialImpl& model) {
  const char* op = "prune::shrink";
  std::vector<Layer> layers;
  for (size_t i = 0; i < model.size(); ++i) {
    Module& m = *model[i];
    if (is_linear(m) || is_conv(m)) {
      FRUGAL_CHECK(!is_conv(m) || static_cast<const Conv2dImpl&>(m).options().groups() == 1, op, ": module ",
                   i, " is a grouped Conv2d, which shrink does not rebuild");
      layers.push_back({i, &m, {}, weight_of(m).size(0)});
    } else if (!layers.empty() && !m.parameters().empty()) {
      throw Error(
          frugal::detail::str_cat(op, ": module ", i, " (", m.type_name(),
                                  ") holds parameters between prunable layers; shrink sees through ReLU, "
                                  "MaxPool2d, Dropout and Flatten only"));
    }
  }
  // Before anything changes (the masks are made permanent below): every prunable layer can be replaced
  // (Note [rewriting a model in place]).
  std::vector<std::string> prunable;
  for (const Layer& l : layers) prunable.push_back(std::to_string(l.index));
  check_replaceable(model, prunable, op);
  for (size_t j = 0; j < layers.size(); ++j) {
    Module& m = *layers[j].module;
    for (const std::string& p : std::vector<std::string>(m.masked_parameters())) remove(m, p);
    // The last layer's outputs are the model's: all kept.
    if (j + 1 == layers.size()) {
      layers[j].kept_out.resize(size_t(layers[j].out));
      std::iota(layers[j].kept_out.begin(), layers[j].kept_out.end(), int64_t(0));
    } else {
      layers[j].kept_out = live_rows(m);
    }
    for (size_t i = layers[j].index + 1; j + 1 < layers.size() && i < layers[j + 1].index; ++i)
      FRUGAL_CHECK(sees_through(*model[i]), op, ": module ", i, " (", model[i]->type_name(),
                   ") lies between two prunable layers; shrink sees through ReLU, MaxPool2d, Dropout and "
                   "Flatten only");
  }
  NoGradGuard no_record;
  // The layers that lose rows or inputs, rebuilt one at a time, each old one freed once its new one is in.
  std::vector<std::string> paths;
  std::vector<size_t> rebuilt;                         // their layers, in the order of paths
  std::vector<bool> after_conv(layers.size(), false);  // whether the layer before is a Conv2d
  for (size_t j = 0; j < layers.size(); ++j) {
    if (j > 0) after_conv[j] = is_conv(*layers[j - 1].module);
    if (j == 0 && int64_t(layers[j].kept_out.size()) == layers[j].out) continue;
    paths.push_back(std::to_string(layers[j].index));
    rebuilt.push_back(j);
  }
  size_t next = 0;  // rewrite_modules calls rebuild once per path, in order
  auto rebuild = [&](Module& m) -> std::shared_ptr<Module> {
    const size_t j = rebuilt[next++];
    const std::vector<int64_t>& rows = layers[j].kept_out;
    Tensor w = index_select(weight_of(m), 0, indices(rows));
    if (j > 0) {
      // The inputs this layer still gets: the previous layer's kept rows (a channel feeding a Linear through
      // Flatten is in_features / channels consecutive features).
      const Layer& prev = layers[j - 1];
      std::vector<int64_t> cols = prev.kept_out;
      const int64_t in = w.size(1);
      if (is_linear(m) && after_conv[j]) {
        FRUGAL_CHECK(in % prev.out == 0, op, ": Linear ", layers[j].index, " has ", in,
                     " inputs, not a multiple of the previous Conv2d's ", prev.out, " channels");
        const int64_t hw = in / prev.out;
        cols.clear();
        for (int64_t c : prev.kept_out)
          for (int64_t k = 0; k < hw; ++k) cols.push_back(c * hw + k);
      } else {
        FRUGAL_CHECK(in == prev.out, op, ": module ", layers[j].index, " takes ", in,
                     " inputs but the previous layer gives ", prev.out);
      }
      w = index_select(w, 1, indices(cols));
    }
    const Tensor b = bias_of(m).defined() ? index_select(bias_of(m), 0, indices(rows)) : Tensor();
    std::shared_ptr<Module> layer;
    if (is_linear(m)) {
      auto lin = std::make_shared<LinearImpl>(LinearOptions(w.size(1), w.size(0)).bias(b.defined()));
      lin->weight.copy_(w);
      if (b.defined()) lin->bias.copy_(b);
      layer = lin;
    } else {
      const Conv2dOptions& o = static_cast<const Conv2dImpl&>(m).options();
      auto conv = std::make_shared<Conv2dImpl>(Conv2dOptions(w.size(1), w.size(0), o.kernel_size())
                                                   .stride(o.stride())
                                                   .padding(o.padding())
                                                   .dilation(o.dilation())
                                                   .bias(b.defined()));
      conv->weight.copy_(w);
      if (b.defined()) conv->bias.copy_(b);
      layer = conv;
    }
    layer->train(m.is_training());
    return layer;
  };
  rewrite_modules(model, paths, rebuild, op);
}

int to_sparse(Module& model, double min_sparsity) {
  FRUGAL_CHECK(min_sparsity >= 0 && min_sparsity <= 1,
               "prune::to_sparse: min_sparsity must be in [0, 1], got ", min_sparsity);
  std::vector<std::string> paths;
  for (const auto& [path, m] : model.named_modules()) {
    if (!is_linear(*m)) continue;
    auto& lin = static_cast<LinearImpl&>(*m);
    lin.apply_masks();
    if (sparsity(lin.weight) >= min_sparsity) paths.push_back(path);
  }
  // One layer at a time, each dense weight freed once its CSR form is in place.
  rewrite_modules(
      model, paths,
      [](Module& m) -> std::shared_ptr<Module> {
        return std::make_shared<SparseLinearImpl>(static_cast<LinearImpl&>(m));
      },
      "prune::to_sparse");
  return int(paths.size());
}

namespace detail {

void apply_mask(const Tensor& t, const Tensor& bits) {
  FRUGAL_CHECK(t.device().is_cpu() && t.is_contiguous() && bits.numel() == (t.numel() + 7) / 8,
               "prune: a mask applies to a contiguous CPU tensor of its size, got ", t.shape(), " on ",
               t.device().str());
  const uint8_t* b = bits.data<uint8_t>();
  if (t.dtype() == DType::F32)
    zero_masked(t.data<float>(), b, t.numel());
  else if (t.dtype() == DType::F64)
    zero_masked(t.data<double>(), b, t.numel());
  else
    throw DTypeError(
        frugal::detail::str_cat("prune: masks apply to f32 and f64 tensors, got ", dtype_name(t.dtype())));
}

// The hook reaches the parameter through its module, which takes the hook off when it dies (~Module): a
// hook holding the parameter itself would be a cycle.
void hook_gradient(const Tensor& param, Module& owner, const std::string& name) {
  if (!param.requires_grad() || !param.is_leaf()) return;
  autograd::set_grad_ready_hook(param, [owner = &owner, name] {
    const Tensor& p = owner->parameter(name);
    const Tensor g = p.grad();
    if (g.defined() && g.is_contiguous() && g.device().is_cpu()) apply_mask(g, owner->mask(name));
  });
}

void unhook_gradient(const Tensor& param) {
  if (param.requires_grad() && param.is_leaf()) autograd::set_grad_ready_hook(param, {});
}

}  // namespace detail

}  // namespace frugal::nn::prune
