// nn containers: Sequential (runs its modules in order, optionally as recompute segments) and ModuleList
// (holds modules for a forward the user writes). Children are named "0", "1", ... as in PyTorch.
//
//   nn::Sequential net{nn::Linear(784, 256), nn::ReLU(), nn::Linear(256, 10)};
//   net->recompute_every(2);  // keep only every second activation; recompute the rest in backward
//   Tensor logits = net->forward(x);
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "module.h"
#include "module_holder.h"

namespace frugal::nn {

// One module of a braced list given to a Sequential or ModuleList holder: a holder or a shared_ptr to a
// module. Not nullptr, so that nn::Sequential seq{nullptr} is an empty holder, as for every other holder.
class ContainerItem {
 public:
  template <typename M, typename = std::enable_if_t<std::is_base_of_v<Module, M>>>
  ContainerItem(std::shared_ptr<M> module) : module(std::move(module)) {  // NOLINT: implicit by design
    static_assert(module_detail::forward_overrides_v<M>, FRUGAL_FORWARD_BY_VALUE_MESSAGE);
  }
  template <typename Holder, typename = typename Holder::ContainedType>
  ContainerItem(const Holder& holder) : module(holder.ptr()) {}  // NOLINT: implicit by design
  std::shared_ptr<Module> module;
};

class SequentialImpl : public Module {
 public:
  SequentialImpl() : Module("Sequential") {}
  SequentialImpl(std::initializer_list<std::shared_ptr<Module>> modules);

  // Appends a module, given as a holder or a shared_ptr, and returns it as given.
  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    static_assert(module_detail::forward_overrides_v<M>, FRUGAL_FORWARD_BY_VALUE_MESSAGE);
    FRUGAL_CHECK(module != nullptr, "Sequential::push_back: the module is null");
    modules_.push_back(module);
    return register_module(std::to_string(modules_.size() - 1), std::move(module));
  }
  template <typename Holder, typename = typename Holder::ContainedType>
  Holder push_back(Holder holder) {
    push_back(holder.ptr());
    return holder;
  }

  // Each module's output is the next one's input. With recompute_every(k) > 0 and grad mode on, each run of
  // k consecutive modules is one autograd::recompute segment: only the segments' inputs stay alive until
  // backward, which runs each segment again; gradients are bit-identical to those without. The last run of
  // at most k modules is not a segment: backward needs its activations first, so it keeps them. A Linear
  // directly followed by a ReLU (within one segment) runs as one F::linear_relu: the same values, a NaN
  // included, with no tensor for the value before the ReLU and one pass over memory fewer in backward. A
  // Conv2d followed by a ReLU likewise runs as one frugal::conv2d_relu, a NaN included, with no tensor for
  // the value before the ReLU; a QuantizedConv2d, a ReLU and a MaxPool2d(2)
  // as one QuantizedConv2d::forward_relu_pool2, which writes only the pooled output. Without a tape to
  // record, a Conv2d, a ReLU and a MaxPool2d(2) run as one ops::conv2d_relu_pool2 where the device has its
  // fused kernel (the CPU in f32), and otherwise (and with other pools) over chunks of images; either way
  // only the pooled output exists for the whole batch (Note [a convolution, ReLU and pool in chunks] in
  // nn/containers.cpp). Where such a block's pooled output goes to a statically quantised layer (a
  // QuantizedConv2d; a Flatten and a QuantizedLinear after an int8 block), it is made as that layer's u8
  // codes, with no f32 tensor for it (Note [an int8 convolution's input as codes] in nn/quant.cpp); the
  // results are bit for bit those of the modules one by one, a NaN included.
  Tensor forward(const Tensor& x) override;
  SequentialImpl& recompute_every(int k);
  int recompute_every() const { return recompute_every_; }

  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;
  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return modules_.begin(); }
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return modules_.end(); }

 private:
  void child_replaced(const std::string& name, const std::shared_ptr<Module>& module) override;
  std::vector<std::shared_ptr<Module>> modules_;
  int recompute_every_ = 0;
};
// The holder; a braced list of modules makes a new SequentialImpl of them: nn::Sequential{nn::Linear(4, 8),
// nn::ReLU()}.
class Sequential : public ModuleHolder<SequentialImpl> {
 public:
  using ModuleHolder<SequentialImpl>::ModuleHolder;
  Sequential() = default;
  Sequential(std::initializer_list<ContainerItem> modules)
      : ModuleHolder(std::make_shared<SequentialImpl>()) {
    for (const ContainerItem& m : modules) get()->push_back(m.module);
  }
  // for (const auto& m : seq) visits the modules in order.
  auto begin() const { return get()->begin(); }
  auto end() const { return get()->end(); }
};

// Modules held in order, indexable and iterable; their parameters belong to the list's owner. It has no
// forward: the owner's forward decides how they are used.
class ModuleListImpl : public Module {
 public:
  ModuleListImpl() : Module("ModuleList") {}
  ModuleListImpl(std::initializer_list<std::shared_ptr<Module>> modules);

  // Appends a module, given as a holder or a shared_ptr, and returns it as given.
  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    static_assert(module_detail::forward_overrides_v<M>, FRUGAL_FORWARD_BY_VALUE_MESSAGE);
    FRUGAL_CHECK(module != nullptr, "ModuleList::push_back: the module is null");
    modules_.push_back(module);
    return register_module(std::to_string(modules_.size() - 1), std::move(module));
  }
  template <typename Holder, typename = typename Holder::ContainedType>
  Holder push_back(Holder holder) {
    push_back(holder.ptr());
    return holder;
  }

  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;
  // The module at i as its own type (nullptr when it is of another type): list->at<LinearImpl>(0)->weight.
  template <typename M>
  std::shared_ptr<M> at(size_t i) const {
    return std::dynamic_pointer_cast<M>((*this)[i]);
  }
  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return modules_.begin(); }
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return modules_.end(); }

 private:
  void child_replaced(const std::string& name, const std::shared_ptr<Module>& module) override;
  std::vector<std::shared_ptr<Module>> modules_;
};
// The holder; a braced list of modules makes a new ModuleListImpl of them: nn::ModuleList{nn::Linear(4, 8),
// nn::ReLU()}.
class ModuleList : public ModuleHolder<ModuleListImpl> {
 public:
  using ModuleHolder<ModuleListImpl>::ModuleHolder;
  ModuleList() = default;
  ModuleList(std::initializer_list<ContainerItem> modules)
      : ModuleHolder(std::make_shared<ModuleListImpl>()) {
    for (const ContainerItem& m : modules) get()->push_back(m.module);
  }
  // for (const auto& m : seq) visits the modules in order.
  auto begin() const { return get()->begin(); }
  auto end() const { return get()->end(); }
};

}  // namespace frugal::nn
