// nn::Module: a model part that owns named parameters, buffers and child modules, in the style of PyTorch's
// C++ frontend. Subclasses register what they own in their constructor and implement forward().
//
//   struct Mlp : nn::Module {
//     std::shared_ptr<nn::Linear> fc1, fc2;
//     Mlp() : fc1(register_module("fc1", std::make_shared<nn::Linear>(784, 256))),
//             fc2(register_module("fc2", std::make_shared<nn::Linear>(256, 10))) {}
//     Tensor forward(const Tensor& x) override { return fc2->forward(relu(fc1->forward(x))); }
//   };
//   auto net = std::make_shared<Mlp>();
//   optim::Adam opt(net->parameters(), optim::AdamOptions(1e-3));
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../autograd/functions.h"

namespace frugal::nn {

class Module {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The module's computation on one input. Modules with other signatures define their own and leave this one
  // throwing.
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  const std::string& type_name() const { return type_name_; }

  // Parameters and buffers of this module and (recurse) its children, named by their path ("fc1.weight").
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<std::shared_ptr<Module>> children() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // Every module below this one (not itself), depth first, named by path.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules() const;

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

  int64_t num_parameters() const;   // elements
  int64_t parameter_bytes() const;  // bytes
  // One line per module: path, type, parameter count and bytes.
  std::string summary() const;

 protected:
  // Registers a tensor as a parameter (a leaf that requires grad) and returns it.
  Tensor register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  // Registers a tensor that is state but not trained (running statistics); an undefined tensor is allowed.
  Tensor register_buffer(const std::string& name, Tensor tensor);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }
  // Replaces the tensor behind a registered buffer (e.g. when it is recomputed rather than updated in place).
  void set_buffer(const std::string& name, Tensor tensor);

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void check_name(const std::string& name) const;

  std::string type_name_;
  bool training_ = true;
  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace frugal::nn
