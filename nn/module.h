// nn::Module: a model part that owns named parameters, buffers and child modules, in the style of PyTorch's
// C++ frontend. Subclasses register what they own in their constructor and implement forward(); a holder
// (FRUGAL_MODULE, nn/module_holder.h) makes the handle users pass around.
//
//   struct MlpImpl : nn::Module {
//     nn::Linear fc1{nullptr}, fc2{nullptr};
//     MlpImpl() : fc1(register_module("fc1", nn::Linear(784, 256))),
//                 fc2(register_module("fc2", nn::Linear(256, 10))) {}
//     Tensor forward(const Tensor& x) override { return fc2(relu(fc1(x))); }
//   };
//   FRUGAL_MODULE(Mlp);
//   Mlp net;
//   optim::Adam opt(net->parameters(), optim::AdamOptions(1e-3));
//   for (const auto& p : net->named_parameters()) std::cout << p.key() << "\n";  // fc1.weight, ...
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "../autograd/functions.h"
#include "ordered_dict.h"

namespace frugal::nn {

class Module;

namespace module_detail {

// Note [forward by value]
// Module::forward(const Tensor&) is virtual; a subclass that declares `Tensor forward(Tensor x)` (as libtorch
// code is often written) or `forward(Tensor& x)` does not override it but hides it, and a caller through
// Module (Sequential, a holder converted to shared_ptr<Module>) gets Module's "no forward" error at run time.
// The holders, register_module and the containers' push_back refuse such a module at compile time instead.
// A forward of other arguments (two tensors; a tensor and a flag without a default) is fine: only a forward
// that takes one tensor yet does not override is refused.
template <typename M, typename = void>
struct takes_one_tensor : std::false_type {};
template <typename M>
struct takes_one_tensor<M, std::void_t<decltype(std::declval<M&>().forward(std::declval<Tensor&>()))>>
    : std::true_type {};
template <typename M, typename = void>
struct overrides_forward : std::false_type {};
template <typename M>
struct overrides_forward<M, std::void_t<decltype(static_cast<Tensor (M::*)(const Tensor&)>(&M::forward))>>
    : std::true_type {};

// True unless M has a forward of one tensor that does not override Module's.
template <typename M>
inline constexpr bool forward_overrides_v = !takes_one_tensor<M>::value || overrides_forward<M>::value;

}  // namespace module_detail

#define FRUGAL_FORWARD_BY_VALUE_MESSAGE                                                             \
  "frugal: this module's forward takes its tensor by value or by non-const reference, which hides " \
  "nn::Module::forward instead of overriding it (Sequential would fail at run time); write "        \
  "`Tensor forward(const Tensor& x) override` (Note [forward by value], nn/module.h)"

// The name of a C++ type as written in code: demangled, without its namespaces and without a trailing "Impl"
// (frugal::nn::LinearImpl -> "Linear").
std::string demangled_type_name(const std::type_info& type);

class Module {
 public:
  // The type name shows in summary() and errors; by default it is the class's own (demangled_type_name).
  Module() = default;
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module();  // takes its masks' gradient hooks off the parameters, which may outlive it
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The module's computation on one input. Modules with other signatures define their own and leave this one
  // throwing.
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  std::string type_name() const;

  // Parameters and buffers of this module and (recurse) its children, named by their path ("fc1.weight"), in
  // registration order.
  std::vector<Tensor> parameters(bool recurse = true) const;
  OrderedDict<std::string, Tensor> named_parameters(bool recurse = true) const;
  OrderedDict<std::string, Tensor> named_buffers(bool recurse = true) const;
  std::vector<std::shared_ptr<Module>> children() const;
  OrderedDict<std::string, std::shared_ptr<Module>> named_children() const;
  // Every module below this one (not itself), depth first, named by path.
  OrderedDict<std::string, std::shared_ptr<Module>> named_modules() const;
  // Puts `module` where the child at `path` ("fc1"; "features.0" for a child's child) is, under the same
  // name and in the same place (a container's list follows), and returns the module it replaced. For
  // rewrites of a model: pruning's shrink, quantisation's convert. Throws Error when no child is there.
  // The module tree alone is changed: a typed member of the parent (nn::Linear fc1) still holds the old
  // module unless the parent re-points it in child_replaced; the rewrites of a model go through
  // rewrite_modules below, which refuses that case. If child_replaced throws, the old module is put back.
  std::shared_ptr<Module> replace_module(const std::string& path, std::shared_ptr<Module> module);

  // Training mode (dropout active, batch norm updating its statistics) for this module and its children.
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Converts parameters and buffers in place (their handles stay valid): floating ones to dtype; all to
  // device.
  Module& to(DType dtype);
  Module& to(Device device);
  void zero_grad(bool set_to_none = true);

  // Parameters and buffers by path. load_state_dict copies values into the existing tensors; strict checks
  // that the keys and shapes match exactly, naming the missing, unexpected and mis-shaped keys.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state, bool strict = true);

  // Pruning masks (nn/prune.h, Note [pruning masks]): one bit per element of parameter `param`, packed (1
  // keeps the element), held as the buffer `<param>_mask` so that state_dict and files carry it.
  // apply_masks() zeroes every masked element in place, unrecorded; the forwards that read their weights
  // (Linear, Conv2d, Sequential's fused linear_relu) call it first, so an optimizer that moved a pruned
  // weight never gets it used.
  void set_mask(const std::string& param, Tensor bits);
  // This module's own parameter `name` (not a child's); throws Error when it has none of that name.
  const Tensor& parameter(const std::string& name) const;
  void remove_mask(const std::string& param);
  Tensor mask(const std::string& param) const;  // undefined when `param` is not pruned
  const std::vector<std::string>& masked_parameters() const { return masked_; }
  void apply_masks() {
    if (!masked_.empty()) apply_masks_now();
  }

  int64_t num_parameters() const;   // elements
  int64_t parameter_bytes() const;  // bytes
  // One line per module: path, type, parameter count and bytes.
  std::string summary() const;

 protected:
  // Registers a tensor as a parameter (a leaf that requires grad) and returns it.
  Tensor register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  // Registers a tensor that is state but not trained (running statistics); an undefined tensor is allowed.
  Tensor register_buffer(const std::string& name, Tensor tensor);
  // Registers a child module, given as a shared_ptr or a holder (nn::Linear), and returns it as given:
  // fc = register_module("fc", nn::Linear(4, 3)).
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    static_assert(module_detail::forward_overrides_v<M>, FRUGAL_FORWARD_BY_VALUE_MESSAGE);
    add_child(name, module);
    return module;
  }
  template <typename Holder, typename = typename Holder::ContainedType>
  Holder register_module(const std::string& name, Holder holder) {
    add_child(name, holder.ptr());
    return holder;
  }
  // Called by replace_module after the child `name` became `module`: for containers that list their children,
  // and for modules that keep a child in a member of their own, to re-point it (the member then has to be a
  // std::shared_ptr<Module> where the replacement is of another type, as quantisation's are).
  virtual void child_replaced(const std::string& name, const std::shared_ptr<Module>& module);
  // Replaces the tensor behind a registered buffer (e.g. when it is recomputed rather than updated in place).
  void set_buffer(const std::string& name, Tensor tensor);

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void apply_masks_now();
  void check_name(const std::string& name) const;

  std::string type_name_;  // empty: the class's own name
  bool training_ = true;
  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<std::string> masked_;  // parameters with a mask, in the order they were pruned
};

// Note [rewriting a model in place]: quantisation (quantize_dynamic, prepare, prepare_qat, convert) and
// pruning (shrink, to_sparse) rewrite a model by putting new modules where old ones are in the module tree.
// A module whose parent also holds it in a typed member (nn::Linear fc1, as MlpImpl at the top of this file)
// would stay in use: the parent's forward calls the member, not the tree, so the model would go on computing
// in f32 while its state_dict (and the file saved from it) holds the int8 weights. So a rewrite first checks
// (check_replaceable): it puts a placeholder at every path to be rewritten (a parent that re-points its
// members in child_replaced drops its references then), counts the references left to each old module,
// puts them all back, and throws Error naming the first module that something outside the tree still holds
// (the member of a parent, or a pointer of the caller's; under a Sequential that runs recompute segments, the
// message also names the autograd graph of a forward whose backward has not run, which holds the segments'
// modules), with nothing changed. Only then does it rewrite
// (rewrite_modules), one module at a time, each old module let go as soon as its replacement is in place, so
// that a rewrite needs no more memory than the largest module's old and new forms together (beyond the
// model). The caller holds no reference of its own to the modules at `paths`. `who` names the rewrite in
// errors. A module registered at several paths is rewritten once per path, as each path is.
void check_replaceable(Module& root, const std::vector<std::string>& paths, const std::string& who);
// check_replaceable, then for each path in order: make(the module there) builds its replacement, which takes
// its place. An error from make leaves the paths before it rewritten.
void rewrite_modules(Module& root, const std::vector<std::string>& paths,
                     const std::function<std::shared_ptr<Module>(Module&)>& make, const std::string& who);

}  // namespace frugal::nn
