// optim::Optimizer: parameter groups, the step loop with its gradient checks, zero_grad, state dicts.
#include "optim/optimizer.h"

#include <cmath>
#include <set>

#include "autograd/graph.h"
#include "autograd/sparse.h"
#include "core/memory.h"
#include "core/memory_history.h"
#include "core/ops.h"

namespace frugal::optim {

ParamGroup::ParamGroup(std::vector<Tensor> params) : params(std::move(params)) {}
ParamGroup::ParamGroup(std::vector<Tensor> params, const OptimizerOptions& options)
    : params(std::move(params)), options_(options.clone()) {}
ParamGroup::ParamGroup(const ParamGroup& other)
    : params(other.params),
      initial_lr(other.initial_lr),
      options_(other.options_ ? other.options_->clone() : nullptr) {}
ParamGroup& ParamGroup::operator=(const ParamGroup& other) {
  if (this != &other) {
    params = other.params;
    initial_lr = other.initial_lr;
    options_ = other.options_ ? other.options_->clone() : nullptr;
  }
  return *this;
}

Optimizer::Optimizer(const char* name, std::vector<ParamGroup> groups,
                     std::unique_ptr<OptimizerOptions> defaults)
    : name_(name), defaults_(std::move(defaults)) {
  defaults_->validate();
  for (auto& g : groups) add_param_group(std::move(g));
}

void Optimizer::check_new_params(const std::vector<Tensor>& params) const {
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    FRUGAL_CHECK(p.defined(), name_, ": parameter ", i, " of the new group is undefined");
    FRUGAL_CHECK_DTYPE(is_floating(p.dtype()), name_, ": parameter ", i, " of the new group has dtype ",
                       dtype_name(p.dtype()), " (shape ", p.shape(),
                       "); only floating tensors can be optimized");
    FRUGAL_CHECK(p.is_leaf(), name_, ": parameter ", i, " of the new group (shape ", p.shape(),
                 ") is not a leaf; optimize the tensors you created, not results of ops");
    for (size_t j = 0; j < i; ++j)
      FRUGAL_CHECK(!p.is_same(params[j]), name_, ": parameter ", i, " of the new group (shape ", p.shape(),
                   ") is listed twice (also at ", j, ")");
    for (size_t g = 0; g < groups_.size(); ++g)
      for (const Tensor& q : groups_[g].params)
        FRUGAL_CHECK(!p.is_same(q), name_, ": parameter ", i, " of the new group (shape ", p.shape(),
                     ") is already in group ", g, "; a parameter may belong to one group only");
  }
}

void Optimizer::add_param_group(ParamGroup group) {
  check_new_params(group.params);
  if (!group.options_) group.options_ = defaults_->clone();
  group.options_->validate();
  state_.emplace_back(group.params.size());
  groups_.push_back(std::move(group));
}

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& g : groups_)
    for (const Tensor& p : g.params) p.zero_grad(set_to_none);
}

DType Optimizer::state_dtype(DType param_dtype) { return compute_dtype(param_dtype); }

Tensor Optimizer::new_state(const Tensor& param) { return new_state(param, param.shape()); }

Tensor Optimizer::new_state(const Tensor& param, const Shape& shape) {
  return new_state(param, shape, state_dtype(param.dtype()));
}

Tensor Optimizer::new_state(const Tensor& param, const Shape& shape, DType dtype) {
  Tensor s = zeros(shape, TensorOptions(dtype).device(param.device()));
  // Retagged rather than allocated under a memory::Tag scope, so the bytes show under exactly "optimizer"
  // whatever tag the caller's step() runs under.
  static const uint32_t kOptimizerTag = memory::intern_tag("optimizer");
  s.storage()->retag(kOptimizerTag);
  return s;
}

Shape Optimizer::state_shape(const OptimizerOptions&, const std::string&, const Tensor& param) const {
  return param.shape();
}

DType Optimizer::state_dtype_of(const std::string&, const Tensor& param) const {
  return state_dtype(param.dtype());
}

void Optimizer::check_param(const Tensor&, int64_t) const {}

bool Optimizer::uses_master(const OptimizerOptions& options, const Tensor& param) {
  return options.get_master_weights() && (param.dtype() == DType::F16 || param.dtype() == DType::BF16);
}

// Note [a failed step changes nothing] (optim/optimizer.h): phase 1 checks every parameter and makes every
// tensor the updates need; phase 2 runs the updates, which allocate nothing.
void Optimizer::step() { step_only(nullptr); }

void Optimizer::step_param(const Tensor& param) { step_only(&param); }

void Optimizer::step_only(const Tensor* only) {
  NoGradGuard no_grad;
  memory::PhaseScope phase(memory::Phase::Optimizer);  // Note [memory phases]
  struct Planned {
    Tensor p;
    const OptimizerOptions* options = nullptr;
    ParamState* state = nullptr;
    Tensor work, grad;    // what update() gets: p itself or a contiguous copy, a contiguous gradient
    SparseGrad sparse;    // or the coalesced sparse gradient, contiguous
    bool master = false;  // Note [master weights]: grad is converted into a slice of master_grads
  };
  std::vector<Planned> plan;
  std::vector<std::pair<ParamState*, std::string>> made;  // state created by this step, undone if it fails
  Tensor master_grads;  // f32, as large as the largest dense gradient a master copy takes, shared by all
  try {
    int64_t index = 0, master_numel = 0;
    bool found = only == nullptr;  // step_param's tensor among the parameters
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (size_t i = 0; i < groups_[g].params.size(); ++i, ++index) {
        Tensor p = groups_[g].params[i];
        if (only && !p.is_same(*only)) continue;
        found = true;
        const SparseGrad sparse = autograd::sparse_grad(p);
        Tensor grad = sparse.defined() ? sparse.values : p.grad();
        if (!grad.defined()) continue;
        // Note [sparse gradients] (autograd/sparse.h): an optimizer takes one kind of gradient only.
        FRUGAL_CHECK(!sparse.defined() || !p.grad().defined(), name_, ".step: parameter ", index, " (group ",
                     g, ", shape ", p.shape(),
                     ") has both a dense and a sparse gradient; zero_grad() and use it "
                     "either in an Embedding with sparse(true) or elsewhere, not both");
        FRUGAL_CHECK(!sparse.defined() || takes_sparse_grads(), name_, ".step: parameter ", index, " (group ",
                     g, ", shape ", p.shape(),
                     ") has a sparse gradient (from nn::Embedding with sparse(true)); ", name_,
                     " needs dense gradients: optimize that parameter with optim::SparseAdam, or build "
                     "the embedding with sparse(false)");
        FRUGAL_CHECK(sparse.defined() || !takes_sparse_grads(), name_, ".step: parameter ", index, " (group ",
                     g, ", shape ", p.shape(), ") has a dense gradient; ", name_,
                     " supports sparse gradients "
                     "only (nn::Embedding with sparse(true)); use optim::Adam for dense ones");
        const Shape grad_shape =
            sparse.defined() ? Shape{sparse.rows, grad.dim() == 2 ? grad.size(1) : -1} : grad.shape();
        FRUGAL_CHECK_SHAPE(grad_shape == p.shape(), name_, ".step: the gradient of parameter ", index,
                           " (group ", g, ") has shape ", grad_shape, " but the parameter has shape ",
                           p.shape());
        FRUGAL_CHECK_DTYPE(grad.dtype() == p.dtype(), name_, ".step: the gradient of parameter ", index,
                           " (group ", g, ", shape ", p.shape(), ") is ", dtype_name(grad.dtype()),
                           " but the parameter is ", dtype_name(p.dtype()),
                           "; convert the gradient or zero_grad() after changing dtypes");
        FRUGAL_CHECK_T(DeviceError, grad.device() == p.device(), name_, ".step: the gradient of parameter ",
                       index, " is on ", grad.device(), " but the parameter is on ", p.device());
        check_param(p, index);
        ParamState& st = state_[g][i];
        const OptimizerOptions& options = groups_[g].options();
        for (const auto& [key, t] : st.tensors)
          FRUGAL_CHECK(t.shape() == state_shape(options, key, p) && t.dtype() == state_dtype_of(key, p),
                       name_, ".step: the state '", key, "' of parameter ", index, " is ",
                       dtype_name(t.dtype()), " ", t.shape(), " but the parameter is now ",
                       dtype_name(p.dtype()), " ", p.shape(),
                       "; create the optimizer after converting the model");
        Planned u;
        u.p = p;
        u.options = &options;
        u.state = &st;
        u.master = uses_master(options, p);
        // The state the update reads, made now (zeroed; the master copy from p) so that it allocates nothing.
        std::vector<std::string> names = state_names(options, p);
        if (u.master) names.push_back("master");
        for (const std::string& name : names) {
          if (auto it = st.tensors.find(name); it != st.tensors.end() && it->second.defined()) continue;
          Tensor t = new_state(p, state_shape(options, name, p), state_dtype_of(name, p));
          if (name == "master") ops::copy_(t, p);
          st.tensors[name] = t;
          made.emplace_back(&st, name);
        }
        if (sparse.defined()) {
          u.sparse = sparse;
          u.sparse.values = ops::contiguous(u.master ? ops::cast(sparse.values, DType::F32) : sparse.values);
          u.sparse.indices = ops::contiguous(sparse.indices);
        } else if (u.master) {
          u.grad = grad;  // converted in phase 2, into master_grads
          master_numel = std::max(master_numel, p.numel());
        }
        if (!p.is_writable()) check_writable(p, (std::string(name_) + ".step").c_str());  // names the step
        if (!u.master) {
          // The kernels walk flat contiguous buffers; a strided parameter is updated through a copy.
          u.work = p.is_contiguous() ? p : p.contiguous();
          if (!sparse.defined()) u.grad = grad.contiguous();
        }
        plan.push_back(std::move(u));
      }
    }
    FRUGAL_CHECK(found, name_, ".step_param: the tensor (shape ", only->shape(),
                 ") is not one of its parameters");
    if (master_numel > 0) master_grads = empty({master_numel}, DType::F32);
  } catch (...) {
    for (auto& [st, name] : made) st->tensors.erase(name);
    throw;
  }

  for (Planned& u : plan) {
    ParamState& st = *u.state;
    if (u.master) {
      Tensor& master = st.tensors.at("master");
      st.initialized = true;
      if (u.sparse.defined()) {
        update_sparse(*u.options, master, u.sparse, st);
      } else {
        Tensor g32 = master_grads.narrow(0, 0, u.p.numel()).view(u.p.shape());
        ops::copy_(g32, u.grad);
        update(*u.options, master, g32, st);
      }
      ops::copy_(u.p, master);  // rounds once; bumps the version
      continue;
    }
    if (u.sparse.defined())
      update_sparse(*u.options, u.work, u.sparse, st);
    else
      update(*u.options, u.work, u.grad, st);
    if (!u.work.is_same(u.p)) ops::copy_(u.p, u.work);
    u.p.storage()->bump_version();
  }
}

void Optimizer::update_sparse(const OptimizerOptions&, Tensor&, const SparseGrad&, ParamState&) {
  FRUGAL_ASSERT(false, name_, " says it takes sparse gradients but does not implement update_sparse");
}

int64_t Optimizer::num_state_bytes() const {
  int64_t n = 0;
  for (const auto& group : state_)
    for (const auto& st : group)
      for (const auto& [key, t] : st.tensors) n += t.nbytes();
  return n;
}

namespace {

std::string group_key(size_t g, const std::string& name) {
  return "param_groups." + std::to_string(g) + "." + name;
}
std::string state_key(int64_t i, const std::string& name) {
  return "state." + std::to_string(i) + "." + name;
}

const Tensor& find_key(const StateDict& dict, const std::string& key, const char* opt) {
  auto it = dict.find(key);
  FRUGAL_CHECK(it != dict.end() && it->second.defined(), opt, ".load_state_dict: the state dict has no '",
               key, "'; was it saved by a ", opt, " over the same parameter groups?");
  return it->second;
}

double scalar_of(const Tensor& t, const std::string& key, const char* opt) {
  FRUGAL_CHECK_SHAPE(t.numel() == 1, opt, ".load_state_dict: '", key, "' should hold one number, got shape ",
                     t.shape());
  return t.item<double>();
}

}  // namespace

StateDict Optimizer::state_dict() const {
  StateDict dict;
  int64_t index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::vector<int64_t> ids;
    for (size_t i = 0; i < groups_[g].params.size(); ++i, ++index) {
      ids.push_back(index);
      const ParamState& st = state_[g][i];
      if (!st.initialized) continue;
      dict[state_key(index, "step")] = scalar_tensor(double(st.step), DType::I64);
      for (const auto& [key, t] : st.tensors) dict[state_key(index, key)] = t.clone();
    }
    dict[group_key(g, "params")] = tensor(ids);
    for (const HyperParam& h : groups_[g].options_->hyperparams())
      dict[group_key(g, h.name)] = h.number ? scalar_tensor(*h.number, DType::F64)
                                   : h.maybe_number
                                       ? scalar_tensor(h.maybe_number->value_or(std::nan("")), DType::F64)
                                   : h.integer ? scalar_tensor(double(*h.integer), DType::I64)
                                               : scalar_tensor(*h.flag ? 1 : 0, DType::I64);
    if (groups_[g].initial_lr)
      dict[group_key(g, "initial_lr")] = scalar_tensor(*groups_[g].initial_lr, DType::F64);
  }
  return dict;
}

void Optimizer::load_state_dict(const StateDict& dict) {
  NoGradGuard no_grad;
  // Everything is read into copies first and committed at the end, so a mismatch changes nothing.
  std::set<std::string> used;
  std::vector<std::unique_ptr<OptimizerOptions>> options;
  std::vector<std::optional<double>> initial_lrs;
  std::vector<std::vector<ParamState>> state;
  int64_t index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    const std::string ids_key = group_key(g, "params");
    const Tensor& ids = find_key(dict, ids_key, name_);
    used.insert(ids_key);
    FRUGAL_CHECK_SHAPE(ids.numel() == int64_t(group.params.size()), name_, ".load_state_dict: group ", g,
                       " has ", group.params.size(), " parameters here but ", ids.numel(),
                       " in the state dict; the optimizer must be built over the same parameter groups");

    auto opts = group.options_->clone();
    for (const HyperParam& h : opts->hyperparams()) {
      const std::string key = group_key(g, h.name);
      const double v = scalar_of(find_key(dict, key, name_), key, name_);
      if (h.number)
        *h.number = v;
      else if (h.maybe_number)
        *h.maybe_number = std::isnan(v) ? std::nullopt : std::optional<double>(v);
      else if (h.integer)
        *h.integer = int64_t(v);
      else
        *h.flag = v != 0;
      used.insert(key);
    }
    opts->validate();
    std::optional<double> initial_lr;
    if (auto it = dict.find(group_key(g, "initial_lr")); it != dict.end()) {
      initial_lr = scalar_of(it->second, it->first, name_);
      used.insert(it->first);
    }

    std::vector<ParamState> group_state(group.params.size());
    for (size_t i = 0; i < group.params.size(); ++i, ++index) {
      const Tensor& p = group.params[i];
      const std::string step_key = state_key(index, "step");
      auto it = dict.find(step_key);
      if (it == dict.end()) continue;  // never updated when saved
      used.insert(step_key);
      ParamState& st = group_state[i];
      st.initialized = true;
      st.step = int64_t(scalar_of(it->second, step_key, name_));
      std::vector<std::string> names = state_names(*opts, p);
      if (uses_master(*opts, p)) names.push_back("master");
      for (const std::string& name : names) {
        const std::string key = state_key(index, name);
        const Tensor& t = find_key(dict, key, name_);
        used.insert(key);
        const Shape shape = state_shape(*opts, name, p);
        const DType dtype = state_dtype_of(name, p);
        FRUGAL_CHECK_SHAPE(t.shape() == shape, name_, ".load_state_dict: '", key, "' has shape ", t.shape(),
                           " but parameter ", index, " (shape ", p.shape(), ") keeps it as ", shape);
        FRUGAL_CHECK_DTYPE(t.dtype() == dtype, name_, ".load_state_dict: '", key, "' is ",
                           dtype_name(t.dtype()), " but the state of a ", dtype_name(p.dtype()),
                           " parameter is ", dtype_name(dtype));
        Tensor s = new_state(p, shape, dtype);
        ops::copy_(s, t.to(p.device()));
        st.tensors[name] = s;
      }
    }
    options.push_back(std::move(opts));
    initial_lrs.push_back(initial_lr);
    state.push_back(std::move(group_state));
  }
  for (const auto& [key, t] : dict)
    FRUGAL_CHECK(used.count(key), name_, ".load_state_dict: unexpected key '", key, "' (this ", name_,
                 " has ", groups_.size(), " groups and ", index,
                 " parameters); was the dict saved by another optimizer or with other options?");

  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].options_ = std::move(options[g]);
    groups_[g].initial_lr = initial_lrs[g];
  }
  state_ = std::move(state);
}

}  // namespace frugal::optim
