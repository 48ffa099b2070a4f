// nn containers: Sequential's forward (plain, or in recompute segments) and indexing.
#include "nn/containers.h"

#include "autograd/recompute.h"

namespace frugal::nn {

namespace {
const std::shared_ptr<Module>& checked_at(const std::vector<std::shared_ptr<Module>>& modules, size_t i,
                                          const char* type) {
  FRUGAL_CHECK_INDEX(i < modules.size(), type, ": index ", i, " is out of range for ", modules.size(),
                     " modules");
  return modules[i];
}
}  // namespace

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) : Module("Sequential") {
  for (const auto& m : modules) push_back(m);
}

const std::shared_ptr<Module>& Sequential::operator[](size_t i) const {
  return checked_at(modules_, i, "Sequential");
}

Sequential& Sequential::recompute_every(int k) {
  FRUGAL_CHECK(k >= 0, "Sequential::recompute_every: k must be >= 0 (0 turns recompute off), got ", k);
  recompute_every_ = k;
  return *this;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  if (recompute_every_ == 0 || !autograd::grad_mode_enabled() || modules_.empty()) {
    for (const auto& m : modules_) h = m->forward(h);
    return h;
  }
  const size_t k = size_t(recompute_every_);
  // The last segment runs plainly: backward starts with it, so its activations would be recomputed at once
  // and the peak is the same either way (PyTorch's checkpoint_sequential does the same).
  const size_t last = (modules_.size() - 1) / k * k;
  for (size_t s = 0; s < modules_.size(); s += k) {
    if (s == last) {
      for (size_t i = s; i < modules_.size(); ++i) h = modules_[i]->forward(h);
      break;
    }
    // The segment holds its modules, so it stays valid however long backward takes to reach it.
    std::vector<std::shared_ptr<Module>> group(modules_.begin() + long(s),
                                               modules_.begin() + long(std::min(s + k, modules_.size())));
    h = autograd::recompute(
        [group](const std::vector<Tensor>& in) {
          Tensor y = in[0];
          for (const auto& m : group) y = m->forward(y);
          return y;
        },
        {h});
  }
  return h;
}

ModuleList::ModuleList(std::initializer_list<std::shared_ptr<Module>> modules) : Module("ModuleList") {
  for (const auto& m : modules) push_back(m);
}

const std::shared_ptr<Module>& ModuleList::operator[](size_t i) const {
  return checked_at(modules_, i, "ModuleList");
}

}  // namespace frugal::nn
