// Module holders, as in libtorch: FRUGAL_MODULE(Net) after `struct NetImpl : nn::Module {...}` makes Net, a
// shared handle to a NetImpl (a std::shared_ptr inside), built from NetImpl's constructor arguments. Every
// module nn/ defines comes this way: nn::Linear holds an nn::LinearImpl.
//
//   struct NetImpl : nn::Module {
//     nn::Linear fc{nullptr};  // empty until the constructor registers it
//     NetImpl(int64_t in, int64_t out) : fc(register_module("fc", nn::Linear(in, out))) {}
//     Tensor forward(const Tensor& x) override { return fc(x); }
//   };
//   FRUGAL_MODULE(Net);
//   Net net(4, 3);                     // make_shared<NetImpl>(4, 3)
//   Tensor y = net(x);                 // net->forward(x)
//   optim::Adam opt(net->parameters(), optim::AdamOptions(1e-3));
//   std::shared_ptr<nn::Module> m = net;  // the same module
#pragma once

#include <memory>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "module.h"

namespace frugal::nn {

// What FRUGAL_MODULE's classes derive from: a std::shared_ptr<Contained> with libtorch's holder interface.
// Copies share the module. Access is shared_ptr-like: a const holder still reaches a non-const module.
template <typename Contained>
class ModuleHolder {
  static_assert(std::is_base_of_v<Module, Contained>,
                "frugal: a module holder holds a class derived from nn::Module");
  static_assert(module_detail::forward_overrides_v<Contained>, FRUGAL_FORWARD_BY_VALUE_MESSAGE);

 public:
  using ContainedType = Contained;

  // A new Contained from its default constructor (Net net;). Write Net net{nullptr} for an empty holder.
  ModuleHolder() : impl_(make_default()) {}
  // Empty: every access throws until a module is assigned (fc = register_module("fc", nn::Linear(4, 3))).
  ModuleHolder(std::nullptr_t) {}  // NOLINT: implicit, as in libtorch (nn::Linear fc{nullptr}; fc = nullptr)
  // Holds an existing module.
  ModuleHolder(std::shared_ptr<Contained> module) : impl_(std::move(module)) {}  // NOLINT: implicit by design
  // A new Contained from its constructor's arguments (nn::Linear fc(784, 256)).
  template <typename Head, typename... Tail,
            typename = std::enable_if_t<!(sizeof...(Tail) == 0 &&
                                          (std::is_base_of_v<ModuleHolder, std::decay_t<Head>> ||
                                           std::is_same_v<std::decay_t<Head>, std::nullptr_t> ||
                                           std::is_convertible_v<Head&&, std::shared_ptr<Contained>>)) &&
                                        std::is_constructible_v<Contained, Head&&, Tail&&...>>>
  explicit ModuleHolder(Head&& head, Tail&&... tail)
      : impl_(std::make_shared<Contained>(std::forward<Head>(head), std::forward<Tail>(tail)...)) {}

  Contained* operator->() const { return get(); }
  Contained& operator*() const { return *get(); }
  Contained* get() const {
    FRUGAL_CHECK(impl_ != nullptr, "module holder of ", demangled_type_name(typeid(Contained)),
                 ": the holder is empty (made from nullptr); assign it a module first, e.g. "
                 "fc = register_module(\"fc\", nn::Linear(in, out))");
    return impl_.get();
  }
  const std::shared_ptr<Contained>& ptr() const { return impl_; }
  bool is_empty() const { return impl_ == nullptr; }
  explicit operator bool() const { return impl_ != nullptr; }

  // The module as a shared_ptr to itself or a base (std::shared_ptr<nn::Module> m = net).
  template <typename T, typename = std::enable_if_t<std::is_convertible_v<Contained*, T*>>>
  operator std::shared_ptr<T>() const {  // NOLINT: implicit by design
    return impl_;
  }

  // seq[i] is (*seq)[i], for the containers.
  template <typename Index>
  decltype(auto) operator[](Index&& index) const {
    return (*get())[std::forward<Index>(index)];
  }

  // net(x, ...) is net->forward(x, ...).
  template <typename... Args>
  decltype(auto) operator()(Args&&... args) const {
    return get()->forward(std::forward<Args>(args)...);
  }

 private:
  static std::shared_ptr<Contained> make_default() {
    if constexpr (std::is_default_constructible_v<Contained>) {
      return std::make_shared<Contained>();
    } else {
      static_assert(std::is_default_constructible_v<Contained>,
                    "frugal: this module has no default constructor; pass its constructor's arguments, or "
                    "nullptr for an empty holder (nn::Linear fc{nullptr};)");
      return nullptr;
    }
  }

  std::shared_ptr<Contained> impl_;
};

}  // namespace frugal::nn

// Declares Name, the holder of NameImpl (libtorch's TORCH_MODULE). Use it in the namespace of NameImpl.
#define FRUGAL_MODULE(Name)                                     \
  class Name : public ::frugal::nn::ModuleHolder<Name##Impl> {  \
   public:                                                      \
    using ::frugal::nn::ModuleHolder<Name##Impl>::ModuleHolder; \
  }
