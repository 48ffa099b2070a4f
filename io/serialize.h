// frugal::save / frugal::load: a module's weights, or an optimizer's state, in one safetensors file (as
// torch::save / torch::load do for libtorch's modules and optimizers). Not here: a training run's checkpoint,
// weights and optimizer state saved as one unit (io/checkpoint.h).
//
//   frugal::save(net, "net.safetensors");  // a holder or a module: its state_dict(), parameters and buffers
//   frugal::load(net, "net.safetensors");  // strict: the same keys and shapes, else Error and net unchanged
//   frugal::save(opt, "adam.safetensors");  // the optimizer's state_dict(), its kind in the metadata
//   frugal::load(opt, "adam.safetensors");  // an optimizer of the same kind over parameters of the same
//   shapes
#pragma once

#include <string>

#include "../nn/module.h"
#include "../optim/optimizer.h"

namespace frugal {

// Writes module.state_dict() to path (atomically, io/file.h). The file is plain safetensors: PyTorch's
// safetensors.torch.load_file reads it, and load() reads one PyTorch wrote with the same names.
void save(const nn::Module& module, const std::string& path);
// Reads path and copies it into the module's parameters and buffers (Module::load_state_dict, strict).
// Throws Error naming the file and what is wrong (missing, corrupt, an optimizer's file, missing or
// unexpected keys, mis-shaped tensors), and then the module is unchanged.
void load(nn::Module& module, const std::string& path);

// Writes optimizer.state_dict() (state tensors, steps, hyperparameters; optim/optimizer.h) to path, with
// the optimizer's name in the metadata ("optimizer": "Adam").
void save(const optim::Optimizer& optimizer, const std::string& path);
// Replaces the optimizer's state and hyperparameters with those saved at path (Optimizer::load_state_dict).
// Throws Error when the file is missing or corrupt, was saved by another kind of optimizer or from a
// module, or does not fit the parameters; the optimizer is then unchanged.
void load(optim::Optimizer& optimizer, const std::string& path);

// Holders (nn::Linear, FRUGAL_MODULE's classes) save and load their module.
template <typename Holder, typename = typename Holder::ContainedType>
void save(const Holder& module, const std::string& path) {
  save(static_cast<const nn::Module&>(*module), path);
}
template <typename Holder, typename = typename Holder::ContainedType>
void load(const Holder& module, const std::string& path) {
  load(static_cast<nn::Module&>(*module), path);
}

}  // namespace frugal
