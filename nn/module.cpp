// nn::Module: registration, traversal, modes, conversion and state dicts.
#include "nn/module.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "nn/containers.h"
#include "nn/prune.h"

namespace frugal::nn {

Tensor Module::forward(const Tensor&) {
  throw Error(
      detail::str_cat(type_name(), ": this module has no forward(const Tensor&); call its own forward"));
}

void Module::check_name(const std::string& name) const {
  FRUGAL_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name(), ": invalid name '", name,
               "' (names are non-empty and contain no '.')");
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& p) { return p.first == name; });
  };
  FRUGAL_CHECK(!taken(parameters_) && !taken(buffers_) && !taken(children_), type_name(), ": the name '",
               name, "' is already registered");
}

Tensor Module::register_parameter(const std::string& name, Tensor tensor, bool requires_grad) {
  check_name(name);
  FRUGAL_CHECK(tensor.defined(), type_name(), ": parameter '", name, "' is undefined");
  FRUGAL_CHECK(tensor.is_leaf(), type_name(), ": parameter '", name, "' must be a leaf; detach() it first");
  tensor.requires_grad_(requires_grad);
  parameters_.emplace_back(name, tensor);
  return tensor;
}

Tensor Module::register_buffer(const std::string& name, Tensor tensor) {
  check_name(name);
  buffers_.emplace_back(name, tensor);
  return tensor;
}

void Module::set_buffer(const std::string& name, Tensor tensor) {
  for (auto& [n, t] : buffers_)
    if (n == name) {
      t = std::move(tensor);
      return;
    }
  throw Error(detail::str_cat(type_name(), ": no buffer named '", name, "'"));
}

Module::~Module() {
  for (const std::string& param : masked_) prune::detail::unhook_gradient(parameter(param));
}

const Tensor& Module::parameter(const std::string& name) const {
  auto it =
      std::find_if(parameters_.begin(), parameters_.end(), [&](const auto& p) { return p.first == name; });
  FRUGAL_CHECK(it != parameters_.end(), type_name(), ": no parameter named '", name, "'");
  return it->second;
}

void Module::set_mask(const std::string& param, Tensor bits) {
  const Tensor& p = parameter(param);
  FRUGAL_CHECK_DTYPE(bits.dtype() == DType::U8 && bits.dim() == 1 && bits.numel() == (p.numel() + 7) / 8,
                     type_name(), ": the mask of '", param, "' must be u8 [", (p.numel() + 7) / 8,
                     "] (a bit per element, packed), got ", dtype_name(bits.dtype()), " ", bits.shape());
  const std::string name = param + "_mask";
  if (std::find(masked_.begin(), masked_.end(), param) != masked_.end()) {
    set_buffer(name, std::move(bits));
  } else {
    register_buffer(name, std::move(bits));
    masked_.push_back(param);
    prune::detail::hook_gradient(p, *this, param);
  }
}

void Module::remove_mask(const std::string& param) {
  auto m = std::find(masked_.begin(), masked_.end(), param);
  FRUGAL_CHECK(m != masked_.end(), type_name(), ": parameter '", param, "' has no mask");
  masked_.erase(m);
  prune::detail::unhook_gradient(parameter(param));
  const std::string name = param + "_mask";
  buffers_.erase(
      std::find_if(buffers_.begin(), buffers_.end(), [&](const auto& b) { return b.first == name; }));
}

Tensor Module::mask(const std::string& param) const {
  if (std::find(masked_.begin(), masked_.end(), param) == masked_.end()) return {};
  const std::string name = param + "_mask";
  return std::find_if(buffers_.begin(), buffers_.end(), [&](const auto& b) { return b.first == name; })
      ->second;
}

void Module::apply_masks_now() {
  NoGradGuard no_record;
  for (const std::string& param : masked_) prune::detail::apply_mask(parameter(param), mask(param));
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_name(name);
  FRUGAL_CHECK(module != nullptr, type_name(), ": child module '", name, "' is null");
  children_.emplace_back(name, std::move(module));
}

std::shared_ptr<Module> Module::replace_module(const std::string& path, std::shared_ptr<Module> module) {
  FRUGAL_CHECK(module != nullptr, type_name(), "::replace_module: the new module for '", path, "' is null");
  Module* parent = this;
  std::string name = path;
  for (size_t dot; (dot = name.find('.')) != std::string::npos; name = name.substr(dot + 1)) {
    auto it = std::find_if(parent->children_.begin(), parent->children_.end(),
                           [&](const auto& c) { return c.first == name.substr(0, dot); });
    FRUGAL_CHECK(it != parent->children_.end(), type_name(), "::replace_module: no module at '", path, "'");
    parent = it->second.get();
  }
  auto it = std::find_if(parent->children_.begin(), parent->children_.end(),
                         [&](const auto& c) { return c.first == name; });
  FRUGAL_CHECK(it != parent->children_.end(), type_name(), "::replace_module: no module at '", path, "'");
  std::shared_ptr<Module> old = std::exchange(it->second, module);
  try {
    parent->child_replaced(name, module);
  } catch (...) {
    it->second = old;
    try {
      parent->child_replaced(name, old);
    } catch (...) {  // the first error is the one to report
    }
    throw;
  }
  return old;
}

void Module::child_replaced(const std::string&, const std::shared_ptr<Module>&) {}

namespace {

// What check_replaceable puts in the tree while it counts references.
class Placeholder final : public Module {
 public:
  Placeholder() : Module("(being checked)") {}
};

// The module at a path of root ("fc1", "features.0").
std::shared_ptr<Module> module_at(const Module& root, const std::string& path) {
  const Module* parent = &root;
  std::string rest = path;
  for (;;) {
    const size_t dot = rest.find('.');
    std::shared_ptr<Module> m = parent->named_children().at(rest.substr(0, dot));
    if (dot == std::string::npos) return m;
    parent = m.get();
    rest = rest.substr(dot + 1);
  }
}

// For a refusal at `path`: a sentence on the recompute segments of the first Sequential on the way from root
// to the module that runs them, or nothing. The graph of a forward whose backward has not run holds each
// segment's modules (to run them again), a likelier holder than a pointer.
std::string recompute_note(const Module& root, const std::string& path) {
  const Module* at = &root;
  for (size_t from = 0;;) {
    if (const auto* seq = dynamic_cast<const SequentialImpl*>(at); seq && seq->recompute_every() > 0)
      return detail::str_cat(
          " If a forward of this model ran with grad (the Sequential ",
          from == 0 ? std::string("at the top") : detail::str_cat("at '", path.substr(0, from - 1), "'"),
          " runs recompute segments), the autograd graph of its output holds the segments' modules until "
          "backward runs or the output is dropped: do either first.");
    const size_t dot = path.find('.', from);
    if (dot == std::string::npos) return "";
    at = at->named_children().at(path.substr(from, dot - from)).get();
    from = dot + 1;
  }
}

}  // namespace

// Note [rewriting a model in place] (nn/module.h).
void check_replaceable(Module& root, const std::vector<std::string>& paths, const std::string& who) {
  std::vector<std::shared_ptr<Module>> old;
  old.reserve(paths.size());
  auto put_back = [&] {
    for (size_t i = old.size(); i-- > 0;) root.replace_module(paths[i], old[i]);
  };
  const auto placeholder = std::make_shared<Placeholder>();
  try {
    for (const std::string& path : paths) old.push_back(root.replace_module(path, placeholder));
  } catch (...) {
    put_back();
    throw;
  }
  // `old` holds one reference to a module per path it was at; any other is from outside the tree.
  size_t held = 0;
  while (held < old.size() && old[held].use_count() == std::count(old.begin(), old.end(), old[held])) ++held;
  put_back();
  if (held == old.size()) return;
  const std::string& path = paths[held];
  const std::string type = old[held]->type_name();
  const size_t dot = path.rfind('.');
  const std::shared_ptr<Module> parent_module =
      dot == std::string::npos ? nullptr : module_at(root, path.substr(0, dot));
  const Module& parent = parent_module ? *parent_module : root;
  const std::string member = path.substr(dot == std::string::npos ? 0 : dot + 1);
  const std::string segments = recompute_note(root, path);
  // Under a container the tree is what runs: the reference left is the caller's.
  if (dynamic_cast<const SequentialImpl*>(&parent) || dynamic_cast<const ModuleListImpl*>(&parent))
    throw Error(detail::str_cat(
        who, ": the ", type, " at '", path,
        "' is also held outside the model's module tree, by a pointer of yours (the ", parent.type_name(),
        " around it would run the new layer, but the pointer would keep the old one). Nothing was replaced. "
        "Drop the pointer first (Note [rewriting a model in place], nn/module.h).",
        segments));
  throw Error(detail::str_cat(
      who, ": the ", type, " at '", path,
      "' is also held outside the model's module tree: by a member of its parent ", parent.type_name(),
      " (such as `nn::", type, " ", member,
      "`), whose forward would go on calling the old layer, or by a pointer of yours. Nothing was replaced. "
      "Keep such layers in a container (nn::Sequential), re-point the member in ",
      parent.type_name(),
      "::child_replaced, or drop the pointer first (Note [rewriting a model in place], nn/module.h).",
      segments));
}

void rewrite_modules(Module& root, const std::vector<std::string>& paths,
                     const std::function<std::shared_ptr<Module>(Module&)>& make, const std::string& who) {
  check_replaceable(root, paths, who);
  for (const std::string& path : paths) {
    std::shared_ptr<Module> replacement = make(*module_at(root, path));
    root.replace_module(path, std::move(replacement));  // the old module, returned, goes here
  }
}

namespace {
// Walks the module tree depth first without recursion, calling f(prefix, module) ("" for the root).
template <typename F>
void walk(const Module& root, bool recurse, F f) {
  std::vector<std::pair<std::string, const Module*>> stack{{"", &root}};
  while (!stack.empty()) {
    auto [prefix, m] = stack.back();
    stack.pop_back();
    f(prefix, *m);
    if (!recurse) break;
    const auto kids = m->named_children();
    for (auto it = kids.items().rbegin(); it != kids.items().rend(); ++it)
      stack.emplace_back(prefix.empty() ? it->first : prefix + "." + it->first, it->second.get());
  }
}
std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}
using TensorItems = std::vector<OrderedDict<std::string, Tensor>::Item>;
using ModuleItems = std::vector<OrderedDict<std::string, std::shared_ptr<Module>>::Item>;
}  // namespace

std::string demangled_type_name(const std::type_info& type) {
  int status = 0;
  char* raw = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string name = status == 0 && raw ? raw : type.name();
  std::free(raw);
  // Drop the namespaces: the text up to the last "::" outside template arguments.
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '<' || name[i] == '(') ++depth;
    if (name[i] == '>' || name[i] == ')') --depth;
    if (depth == 0 && name.compare(i, 2, "::") == 0) start = i + 2;
  }
  name = name.substr(start);
  const std::string impl = "Impl";
  if (name.size() > impl.size() && name.compare(name.size() - impl.size(), impl.size(), impl) == 0)
    name.resize(name.size() - impl.size());
  return name;
}

std::string Module::type_name() const {
  return type_name_.empty() ? demangled_type_name(typeid(*this)) : type_name_;
}

OrderedDict<std::string, Tensor> Module::named_parameters(bool recurse) const {
  TensorItems out;
  walk(*this, recurse, [&](const std::string& prefix, const Module& m) {
    for (const auto& [n, t] : m.parameters_) out.push_back({join(prefix, n), t});
  });
  return {"named_parameters", std::move(out)};
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  walk(*this, recurse, [&](const std::string&, const Module& m) {
    for (const auto& [n, t] : m.parameters_) out.push_back(t);
  });
  return out;
}

OrderedDict<std::string, Tensor> Module::named_buffers(bool recurse) const {
  TensorItems out;
  walk(*this, recurse, [&](const std::string& prefix, const Module& m) {
    for (const auto& [n, t] : m.buffers_)
      if (t.defined()) out.push_back({join(prefix, n), t});
  });
  return {"named_buffers", std::move(out)};
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [n, m] : children_) out.push_back(m);
  return out;
}

OrderedDict<std::string, std::shared_ptr<Module>> Module::named_children() const {
  ModuleItems out;
  for (const auto& [n, m] : children_) out.push_back({n, m});
  return {"named_children", std::move(out)};
}

OrderedDict<std::string, std::shared_ptr<Module>> Module::named_modules() const {
  ModuleItems out;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> stack;
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) stack.push_back(*it);
  while (!stack.empty()) {
    auto [path, m] = stack.back();
    stack.pop_back();
    out.push_back({path, m});
    for (auto it = m->children_.rbegin(); it != m->children_.rend(); ++it)
      stack.emplace_back(path + "." + it->first, it->second);
  }
  return {"named_modules", std::move(out)};
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

Module& Module::to(DType dtype) {
  NoGradGuard no_grad;
  auto convert = [&](const Tensor& t) {
    if (t.defined() && is_floating(t.dtype()) && t.dtype() != dtype) {
      t.set_data(ops::cast(t, dtype));
      t.set_grad(Tensor());  // a gradient of the old dtype no longer fits
    }
  };
  for (auto& [n, t] : named_parameters()) convert(t);
  for (auto& [n, t] : named_buffers()) convert(t);
  return *this;
}

Module& Module::to(Device device) {
  NoGradGuard no_grad;
  auto move = [&](const Tensor& t) {
    if (t.defined() && t.device() != device) {
      t.set_data(ops::to(t, device));
      t.set_grad(Tensor());
    }
  };
  for (auto& [n, t] : named_parameters()) move(t);
  for (auto& [n, t] : named_buffers()) move(t);
  return *this;
}

void Module::zero_grad(bool set_to_none) {
  for (const Tensor& p : parameters()) p.zero_grad(set_to_none);
}

StateDict Module::state_dict() const {
  StateDict out;
  for (auto& [n, t] : named_parameters()) out[n] = t;
  for (auto& [n, t] : named_buffers()) out[n] = t;
  return out;
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  NoGradGuard no_grad;
  const StateDict mine = state_dict();
  std::vector<std::string> missing, unexpected, misshaped;
  for (const auto& [n, t] : mine) {
    auto it = state.find(n);
    if (it == state.end()) {
      missing.push_back(n);
    } else if (it->second.shape() != t.shape()) {
      misshaped.push_back(n + " (expected " + t.shape().str() + ", got " + it->second.shape().str() + ")");
    }
  }
  for (const auto& [n, t] : state)
    if (!mine.count(n)) unexpected.push_back(n);
  // Floating values convert (an f16 file loads into f32 parameters), but a byte tensor's bytes (nn::quant's
  // int8 weights, Note [int8 as I8] in io/safetensors.h) mean nothing converted from another dtype.
  for (const auto& [n, t] : mine) {
    auto it = state.find(n);
    FRUGAL_CHECK_DTYPE(it == state.end() || t.dtype() != DType::U8 || it->second.dtype() == DType::U8,
                       type_name(), ": load_state_dict: '", n, "' holds u8 (int8 bytes of a quantised ",
                       "model) and cannot be loaded from ", it->second.dtype(), "; pass the u8 tensor saved ",
                       "by the quantised model");
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s.empty() ? std::string("none") : s;
  };
  FRUGAL_CHECK_SHAPE(misshaped.empty() && (!strict || (missing.empty() && unexpected.empty())), type_name(),
                     ": load_state_dict: missing keys: ", list(missing),
                     "; unexpected keys: ", list(unexpected), "; mis-shaped keys: ", list(misshaped),
                     strict ? "" : " (strict=false ignores missing and unexpected keys, not shapes)");
  for (const auto& [n, t] : mine) {
    auto it = state.find(n);
    if (it == state.end()) continue;
    Tensor dst = t;
    ops::copy_(dst, it->second.to(t.device()));  // converts the dtype; the handles stay the same
  }
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

int64_t Module::parameter_bytes() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.nbytes();
  return n;
}

std::string Module::summary() const {
  std::ostringstream os;
  char line[256];
  auto row = [&](const std::string& path, const Module& m) {
    std::snprintf(line, sizeof line, "%-32s %-18s %12lld %14s\n", path.c_str(), m.type_name().c_str(),
                  static_cast<long long>(m.num_parameters()),
                  memory::format_bytes(m.parameter_bytes()).c_str());
    os << line;
  };
  std::snprintf(line, sizeof line, "%-32s %-18s %12s %14s\n", "module", "type", "parameters", "bytes");
  os << line;
  row("(root)", *this);
  for (const auto& [path, m] : named_modules()) row(path, *m);
  return os.str();
}

}  // namespace frugal::nn
