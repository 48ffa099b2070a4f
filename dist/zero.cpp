// dist::ZeroOptimizer; see Note [ZeRO shards] in dist/zero.h.
#include "dist/zero.h"

#include <cstring>
#include <string>

#include "autograd/graph.h"
#include "core/memory.h"
#include "dist/ddp.h"
#include "dist/dist.h"

namespace frugal::dist {

namespace {

std::string state_key(int64_t i, const std::string& name) {
  return "state." + std::to_string(i) + "." + name;
}
std::string group_key(size_t g, const std::string& name) {
  return "param_groups." + std::to_string(g) + "." + name;
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(optim::Optimizer& optimizer) : optimizer_(optimizer) {
  FRUGAL_CHECK(is_initialized(), "ZeroOptimizer: call dist::init() (or make a dist::Guard) first");
  const std::string name = optimizer.name();
  FRUGAL_CHECK(name == "SGD" || name == "Adam" || name == "AdamW", "ZeroOptimizer: ", name,
               "'s state is not elementwise (Adafactor's factored moments need whole matrices, the 8-bit "
               "optimizers' blocks would move), so it cannot be split into parts; use SGD, Adam or AdamW");
  FRUGAL_CHECK(
      optimizer.num_state_bytes() == 0,
      "ZeroOptimizer: the optimizer has stepped already; make the ZeroOptimizer before the first step "
      "(and load a state dict through it)");
  const int size = world_size();
  const int me = rank();
  NoGradGuard no_grad;
  static const uint32_t kParametersTag = memory::intern_tag("parameters");
  // Every group is checked before any parameter moves: a refusal changes nothing.
  for (size_t g = 0; g < optimizer.groups_.size(); ++g) {
    const optim::ParamGroup& pg = optimizer.groups_[g];
    FRUGAL_CHECK(!pg.params.empty(), "ZeroOptimizer: parameter group ", g, " is empty");
    for (const Tensor& p : pg.params) {
      FRUGAL_CHECK(p.device().is_cpu(), "ZeroOptimizer: a parameter is on ", p.device(),
                   "; it shards CPU parameters only (its uneven parts go through MPI), CUDA ones not yet");
      FRUGAL_CHECK_DTYPE(
          p.dtype() == pg.params.front().dtype() && (p.dtype() == DType::F32 || p.dtype() == DType::F64),
          "ZeroOptimizer: a group's parameters must all be f32 or all f64, got ", dtype_name(p.dtype()));
    }
  }
  for (size_t g = 0; g < optimizer.groups_.size(); ++g) {
    optim::ParamGroup& pg = optimizer.groups_[g];
    Group group;
    int64_t total = 0;
    for (const Tensor& p : pg.params) {
      group.offsets.push_back(total);
      total += p.numel();
    }
    group.flat = empty({total}, pg.params.front().dtype());
    group.flat.storage()->retag(kParametersTag);
    for (size_t i = 0; i < pg.params.size(); ++i) {
      const Tensor& p = pg.params[i];
      Tensor view = group.flat.narrow(0, group.offsets[i], p.numel()).view(p.shape());
      view.copy_(p);
      p.set_data(view);  // the parameter keeps its identity (and the model's handle), on the flat bytes
    }
    for (int r = 0; r < size; ++r) group.counts.push_back(total / size + (r < total % size ? 1 : 0));
    for (int r = 0; r < me; ++r) group.begin += group.counts[size_t(r)];
    group.part = group.flat.narrow(0, group.begin, group.counts[size_t(me)]).detach();
    group.part.requires_grad_(true);
    group.params = pg.params;
    pg.params = {group.part};
    optimizer.state_[g] = std::vector<optim::Optimizer::ParamState>(1);
    groups_.push_back(std::move(group));
  }
}

void ZeroOptimizer::zero_grad(bool set_to_none) {
  for (const Group& g : groups_)
    for (const Tensor& p : g.params) p.zero_grad(set_to_none);
}

void ZeroOptimizer::step() {
  NoGradGuard no_grad;
  static const uint32_t kGradientsTag = memory::intern_tag("gradients");
  const int me = rank();
  // 1. each rank's part of the mean gradient.
  for (Group& g : groups_) {
    Tensor flat = empty({g.flat.numel()}, g.flat.dtype());
    flat.storage()->retag(kGradientsTag);
    for (size_t i = 0; i < g.params.size(); ++i)
      detail::move_gradient(g.params[i], flat.narrow(0, g.offsets[i], g.params[i].numel()));
    Tensor part = empty({g.counts[size_t(me)]}, g.flat.dtype());
    part.storage()->retag(kGradientsTag);
    reduce_scatter_flat(flat, part, g.counts, ReduceOp::Average);
    g.part.set_grad(part);
  }
  // 2. the update of this rank's parts; 3. every rank's parts, everywhere.
  try {
    optimizer_.step();
  } catch (...) {
    for (Group& g : groups_) g.part.set_grad(Tensor());
    throw;
  }
  for (Group& g : groups_) {
    g.part.set_grad(Tensor());
    all_gather_flat(g.flat, g.counts);
  }
}

StateDict ZeroOptimizer::state_dict() const {
  const StateDict inner = optimizer_.state_dict();
  StateDict out;
  int64_t index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const Group& group = groups_[g];
    const int64_t first = index;
    std::vector<int64_t> ids;
    for (size_t i = 0; i < group.params.size(); ++i) ids.push_back(index++);
    const std::string prefix = "state." + std::to_string(g) + ".";
    for (auto it = inner.lower_bound(prefix); it != inner.end() && it->first.starts_with(prefix); ++it) {
      const std::string name = it->first.substr(prefix.size());
      if (name == "step") {
        for (size_t i = 0; i < group.params.size(); ++i)
          out[state_key(first + int64_t(i), name)] = it->second.clone();
        continue;
      }
      Tensor full = zeros({group.flat.numel()}, it->second.dtype());
      full.narrow(0, group.begin, it->second.numel()).copy_(it->second.reshape({-1}));
      all_gather_flat(full, group.counts);
      for (size_t i = 0; i < group.params.size(); ++i) {
        const Tensor& p = group.params[i];
        out[state_key(first + int64_t(i), name)] =
            full.narrow(0, group.offsets[i], p.numel()).view(p.shape()).clone();
      }
    }
    const std::string gprefix = group_key(g, "");
    for (auto it = inner.lower_bound(gprefix); it != inner.end() && it->first.starts_with(gprefix); ++it)
      out[it->first] = it->second;
    out[group_key(g, "params")] = tensor(ids);
  }
  return out;
}

void ZeroOptimizer::load_state_dict(const StateDict& dict) {
  NoGradGuard no_grad;
  StateDict inner;
  int64_t index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const Group& group = groups_[g];
    const int64_t first = index;
    index += int64_t(group.params.size());
    const std::string gprefix = group_key(g, "");
    for (auto it = dict.lower_bound(gprefix); it != dict.end() && it->first.starts_with(gprefix); ++it)
      inner[it->first] = it->second;
    inner[group_key(g, "params")] = tensor(std::vector<int64_t>{int64_t(g)});
    // The names the first parameter's state has; every parameter of the group must have them.
    const std::string prefix = state_key(first, "");
    for (auto it = dict.lower_bound(prefix); it != dict.end() && it->first.starts_with(prefix); ++it) {
      const std::string name = it->first.substr(prefix.size());
      if (name == "step") {
        inner[state_key(int64_t(g), name)] = it->second;
        continue;
      }
      Tensor full = empty({group.flat.numel()}, it->second.dtype());
      for (size_t i = 0; i < group.params.size(); ++i) {
        const Tensor& p = group.params[i];
        const std::string key = state_key(first + int64_t(i), name);
        auto found = dict.find(key);
        FRUGAL_CHECK(found != dict.end() && found->second.defined(),
                     "ZeroOptimizer.load_state_dict: the state dict has no '", key, "'");
        FRUGAL_CHECK_SHAPE(found->second.shape() == p.shape(), "ZeroOptimizer.load_state_dict: '", key,
                           "' has shape ", found->second.shape(), ", its parameter ", p.shape());
        full.narrow(0, group.offsets[i], p.numel()).copy_(found->second.reshape({-1}));
      }
      inner[state_key(int64_t(g), name)] = full.narrow(0, group.begin, group.part.numel()).clone();
    }
  }
  optimizer_.load_state_dict(inner);
}

}  // namespace frugal::dist
