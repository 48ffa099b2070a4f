// nn containers: Sequential (runs its modules in order, optionally as recompute segments) and ModuleList
// (holds modules for a forward the user writes). Children are named "0", "1", ... as in PyTorch.
//
//   auto net = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
//       std::make_shared<nn::Linear>(784, 256), std::make_shared<nn::ReLU>(),
//       std::make_shared<nn::Linear>(256, 10)});
//   net->recompute_every(2);  // keep only every second activation; recompute the rest in backward
//   Tensor logits = net->forward(x);
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "module.h"

namespace frugal::nn {

class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);

  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    FRUGAL_CHECK(module != nullptr, "Sequential::push_back: the module is null");
    modules_.push_back(module);
    return register_module(std::to_string(modules_.size() - 1), std::move(module));
  }

  // Each module's output is the next one's input. With recompute_every(k) > 0 and grad mode on, each run of
  // k consecutive modules is one autograd::recompute segment: only the segments' inputs stay alive until
  // backward, which runs each segment again; gradients are bit-identical to those without. The last run of
  // at most k modules is not a segment: backward needs its activations first, so it keeps them. A Linear
  // directly followed by a ReLU (within one segment) runs as one F::linear_relu: the same values within f32
  // rounding (exactly, where no fused GEMM is registered), one pass over memory fewer each way.
  Tensor forward(const Tensor& x) override;
  Sequential& recompute_every(int k);
  int recompute_every() const { return recompute_every_; }

  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;
  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return modules_.begin(); }
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
  int recompute_every_ = 0;
};

// Modules held in order, indexable and iterable; their parameters belong to the list's owner. It has no
// forward: the owner's forward decides how they are used.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  ModuleList(std::initializer_list<std::shared_ptr<Module>> modules);

  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    FRUGAL_CHECK(module != nullptr, "ModuleList::push_back: the module is null");
    modules_.push_back(module);
    return register_module(std::to_string(modules_.size() - 1), std::move(module));
  }

  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;
  // The module at i as its own type (nullptr when it is of another type): list.at<Linear>(0)->weight.
  template <typename M>
  std::shared_ptr<M> at(size_t i) const {
    return std::dynamic_pointer_cast<M>((*this)[i]);
  }
  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return modules_.begin(); }
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace frugal::nn
