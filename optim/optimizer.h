// optim::Optimizer: what SGD, Adam and AdamW share — parameter groups with their own options, per-parameter
// state kept in arena tensors (counted under the memory tag "optimizer"), master weights, zero_grad, and
// state dicts.
//
//   optim::Adam opt(model->parameters(), optim::AdamOptions(1e-3));
//   for (...) { opt.zero_grad(); Tensor loss = ...; loss.backward(); opt.step(); }
//   StateDict s = opt.state_dict();  // "state.0.exp_avg", "state.0.step", "param_groups.0.lr", ...
//   optim::SGD sgd({{body->parameters()}, {head->parameters(), optim::SGDOptions(1e-2)}},  // per-group lr
//                  optim::SGDOptions(1e-3));
//   optim::SGDOptions(1e-3));
//
// Note [master weights]: with master_weights(true) in its options, a group's f16/bf16 parameters are updated
// through an f32 copy, the state tensor "master" (made from the parameter on its first update, counted under
// "optimizer", saved in state dicts): each step converts the gradient to f32, updates the copy with the
// state (f32 too), and writes the copy back rounded to the parameter. Updates far smaller than the
// parameter's rounding step, which a 16-bit parameter would lose each time, then add up. The copy is what
// the optimizer trusts: after changing the parameters by hand, load a matching optimizer state or make a new
// optimizer. f32 and f64 parameters ignore the option.
//   optim::AdamW opt(model->parameters(), optim::AdamWOptions(1e-3).master_weights(true));  // bf16 model
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../core/options.h"
#include "../core/tensor.h"

namespace frugal {
struct SparseGrad;  // autograd/graph.h
namespace dist {
class ZeroOptimizer;  // dist/zero.h: replaces the parameters by its shards
}
}  // namespace frugal

namespace frugal::optim {

// One hyperparameter by name, for state dicts: a number (saved as 0-d f64), a flag (0-d i64), a number
// that may be unset (0-d f64, nan when unset: Adafactor's eps1), or an integer (0-d i64: Adam8bit's
// block_size).
struct HyperParam {
  std::string name;
  double* number = nullptr;
  bool* flag = nullptr;
  std::optional<double>* maybe_number = nullptr;
  int64_t* integer = nullptr;
};

// The options of one optimizer (SGDOptions, AdamOptions, ...); each parameter group holds its own copy.
class OptimizerOptions {
 public:
  virtual ~OptimizerOptions() = default;
  virtual std::unique_ptr<OptimizerOptions> clone() const = 0;
  virtual double get_lr() const = 0;
  virtual void set_lr(double lr) = 0;
  // Every hyperparameter, by the name it has in a state dict ("lr", "momentum", ...).
  virtual std::vector<HyperParam> hyperparams() = 0;
  // Throws Error naming the first invalid value (the optimizer calls it for every group).
  virtual void validate() const = 0;
  // Note [master weights]: keep f32 copies of the group's f16/bf16 parameters.
  virtual bool get_master_weights() const { return false; }
};

// Parameters that share options. Without options a group takes the optimizer's defaults.
struct ParamGroup {
  ParamGroup(std::vector<Tensor> params);  // NOLINT: implicit, so {{a, b}, {c, SGDOptions(0.1)}} reads well
  ParamGroup(std::vector<Tensor> params, const OptimizerOptions& options);
  ParamGroup(const ParamGroup& other);
  ParamGroup& operator=(const ParamGroup& other);
  ParamGroup(ParamGroup&&) = default;
  ParamGroup& operator=(ParamGroup&&) = default;

  OptimizerOptions& options() { return *options_; }
  const OptimizerOptions& options() const { return *options_; }
  bool has_options() const { return options_ != nullptr; }

  std::vector<Tensor> params;
  // The lr the first LR schedule found on this group (PyTorch's group["initial_lr"]): what schedules scale.
  std::optional<double> initial_lr;

 private:
  friend class Optimizer;
  std::unique_ptr<OptimizerOptions> options_;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient (those without are skipped), without recording.
  // Note [a failed step changes nothing]: a step that throws (OutOfMemoryError, or an Error from its checks
  // of the gradients and state) has changed no parameter, no state tensor and no step count, and holds no
  // memory of its own: call it again once memory is free. It first checks every parameter and makes every
  // tensor the updates need (missing state, the master weights' f32 gradient buffer, contiguous copies of
  // strided parameters and gradients), then runs the updates, which allocate nothing. A step that completes
  // has updated every parameter that has a gradient.
  virtual void step();
  // Updates this one parameter (one of the optimizer's) if it has a gradient, as step() would: what
  // optim::StepInBackward runs for each parameter during backward.
  void step_param(const Tensor& param);
  // True while an optim::StepInBackward runs this optimizer's updates in backward.
  bool steps_in_backward() const { return in_backward_ > 0; }
  // Clears the gradients: set_to_none drops them (memory is freed), otherwise they are filled with zeros.
  void zero_grad(bool set_to_none = true);
  // A group added later gets the defaults unless it has options; its parameters must be new.
  void add_param_group(ParamGroup group);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  const OptimizerOptions& defaults() const { return *defaults_; }
  const char* name() const { return name_; }

  // The state as tensors, parameters numbered across groups in order (as in PyTorch):
  //   state.<i>.<name>      the state tensors of parameter i ("exp_avg", "momentum_buffer", ...)
  //   state.<i>.step        updates applied to parameter i (0-d i64)
  //   param_groups.<g>.<h>  hyperparameter h of group g (0-d f64; flags 0-d i64)
  //   param_groups.<g>.params  the indices of the group's parameters (1-D i64)
  // Tensors are copies: later steps do not change a saved dict.
  StateDict state_dict() const;
  // Replaces the state and hyperparameters with those of a dict from state_dict() of an optimizer of the
  // same kind over parameters of the same shapes. Throws Error naming what does not match (and changes
  // nothing then).
  void load_state_dict(const StateDict& dict);
  // Bytes held by the state tensors.
  int64_t num_state_bytes() const;

 protected:
  // The state of one parameter: created zeroed on its first update.
  struct ParamState {
    bool initialized = false;
    int64_t step = 0;
    std::map<std::string, Tensor> tensors;
  };

  Optimizer(const char* name, std::vector<ParamGroup> groups, std::unique_ptr<OptimizerOptions> defaults);

  // Applies one update to a parameter (contiguous) from its gradient (contiguous, same shape and dtype).
  virtual void update(const OptimizerOptions& options, Tensor& param, const Tensor& grad,
                      ParamState& state) = 0;
  // True for an optimizer of sparse gradients (SparseAdam): step() then passes each parameter's sparse
  // gradient to update_sparse() and refuses dense ones; otherwise it refuses sparse ones.
  virtual bool takes_sparse_grads() const { return false; }
  // Applies one update from a coalesced sparse gradient (Note [sparse gradients], autograd/sparse.h).
  virtual void update_sparse(const OptimizerOptions& options, Tensor& param, const SparseGrad& grad,
                             ParamState& state);
  // The state tensors param has under these options (what load_state_dict expects). Most optimizers name the
  // same ones for every parameter; Adafactor's depend on its rank.
  virtual std::vector<std::string> state_names(const OptimizerOptions& options,
                                               const Tensor& param) const = 0;
  // The shape of param's state tensor `name` under these options: param's own by default (Adafactor's
  // factors are smaller, Adam8bit's scales one per block).
  virtual Shape state_shape(const OptimizerOptions& options, const std::string& name,
                            const Tensor& param) const;
  // The dtype of param's state tensor `name`: state_dtype(param's dtype) by default (Adam8bit's codes are
  // u8).
  virtual DType state_dtype_of(const std::string& name, const Tensor& param) const;
  // Throws Error if this optimizer cannot update param (step() asks before it changes anything; Adafactor
  // runs on the CPU only).
  virtual void check_param(const Tensor& param, int64_t index) const;

  // A zeroed state tensor for param: its shape (or `shape`), f32 for f16/bf16 parameters (else its dtype),
  // counted under the memory tag "optimizer".
  static Tensor new_state(const Tensor& param);
  static Tensor new_state(const Tensor& param, const Shape& shape);
  static Tensor new_state(const Tensor& param, const Shape& shape, DType dtype);
  static DType state_dtype(DType param_dtype);
  // True when param is updated through an f32 master copy (Note [master weights]).
  static bool uses_master(const OptimizerOptions& options, const Tensor& param);

 private:
  friend class StepInBackward;
  friend class dist::ZeroOptimizer;
  void step_only(const Tensor* only);  // step() when only is null; else that parameter alone
  int in_backward_ = 0;
  void check_new_params(const std::vector<Tensor>& params) const;

  const char* name_;
  std::vector<ParamGroup> groups_;
  std::vector<std::vector<ParamState>> state_;  // parallel to groups_[g].params
  std::unique_ptr<OptimizerOptions> defaults_;
};

}  // namespace frugal::optim
