// Pruning: zeroing the weights that matter least, so that a model needs fewer bytes and less arithmetic.
//
//   nn::prune::l1_unstructured(*fc, "weight", 0.8);     // the 80% smallest |w| of fc's weight become 0
//   nn::prune::l1_unstructured(*fc, "weight", 0.5);     // iterative: half of the remaining 20% too
//   nn::prune::ln_structured(*fc, "weight", 0.5, 2, 0);  // whole output rows, by their L2 norm
//   ... fine-tune: the pruned weights stay exactly 0 ...
//   nn::prune::remove(*fc, "weight");                   // permanent: the mask's bytes are freed
//   nn::prune::shrink(*model);                          // rows pruned away for real: a smaller model
//   model->replace_module("1", nn::SparseLinear(*fc));  // a 90%-pruned Linear in CSR
//
// Note [pruning masks]
// PyTorch's torch.nn.utils.prune keeps the original weight (weight_orig) and a float mask of the same size,
// and recomputes weight = weight_orig * mask in every forward: pruning costs two more copies of the weight.
// Here the pruned elements of the parameter itself are set to 0 (the original values are gone; remove() has
// nothing to restore) and the mask is one bit per element, packed (u8 [ceil(numel / 8)], an arena buffer
// `<name>_mask` that state_dict and files carry): 1/32 of an f32 weight. A mask holds in two places:
//   - forward: Linear, Conv2d and Sequential's fused linear_relu zero the masked elements in place before
//   they
//     read the weight (Module::apply_masks, unrecorded; a pass over the weight's bits), so an optimizer whose
//     state predates the pruning (momentum, Adam's moments) can move a pruned weight, but it is never used;
//   - the gradient: a grad-ready hook (autograd::set_grad_ready_hook) zeroes the masked elements of the
//     parameter's gradient as soon as backward completes it, so the optimizer steps, the gradient norm and
//     clipping see the pruned gradient, and plain SGD keeps pruned weights at 0 between forwards too.
// optim::StepInBackward takes the same hook slot (one per parameter): under it the gradient is not masked,
// while the forward still is. Pruning again prunes `amount` of the elements still unpruned, on top of the
// mask (PyTorch's PruningContainer). Structured pruning along dim 0 of a module with a bias prunes the
// matching bias elements too (PyTorch leaves them), so a pruned row is a removed neuron, and shrink() can
// delete it without changing any output.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "layers.h"
#include "module.h"

namespace frugal::nn {

class SequentialImpl;

// A Linear whose weight is held in compressed sparse rows (CSR): the nonzero values (f32), their column
// indices and the rows' start offsets (i32), all arena tensors, nnz * 8 + (out + 1) * 4 bytes (plus the
// bias) against out * in * 4 dense. y = x W^T + b in one kernel that reads x and writes y as they lie
// (Note [a sparse layer's product] in kernels/cpu/sparse.cpp), with tiles of working memory from the arena.
// For inference: its forward records nothing and refuses an input that requires grad.
class SparseLinearImpl : public Module {
 public:
  // From a Linear (pruned or not: its zeros are left out).
  explicit SparseLinearImpl(const LinearImpl& linear);
  Tensor forward(const Tensor& x) override;
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  int64_t nnz() const { return values.numel(); }

  Tensor values, col_indices, row_offsets;  // f32 [nnz], i32 [nnz], i32 [out + 1]
  Tensor bias;                              // f32 [out], undefined without one

 private:
  int64_t in_, out_;
};
FRUGAL_MODULE(SparseLinear);

}  // namespace frugal::nn

namespace frugal::nn::prune {

// Each throws Error for an amount outside [0, 1], an unknown parameter or a dim out of range, before it
// changes anything.
//
// The round(amount * remaining) unpruned elements of module.name with the smallest |w|.
void l1_unstructured(Module& module, const std::string& name, double amount);
// As many, drawn uniformly from the unpruned elements (the global generator: manual_seed reproduces them).
void random_unstructured(Module& module, const std::string& name, double amount);
// The round(amount * remaining) unpruned slices along dim (rows for dim 0) with the smallest Ln norm (n > 0;
// 1 and 2 are the usual ones).
void ln_structured(Module& module, const std::string& name, double amount, double n, int64_t dim);
// One threshold over all the parameters: the round(amount * remaining) smallest |w| among all their unpruned
// elements.
void global_unstructured(const std::vector<std::pair<Module*, std::string>>& parameters, double amount);
// Makes the pruning of module.name permanent: its mask (and gradient hook) go, the zeros stay.
void remove(Module& module, const std::string& name = "weight");
bool is_pruned(const Module& module, const std::string& name = "weight");
// The fraction of elements of t that are exactly zero.
double sparsity(const Tensor& t);

// Removes for real every output row (Linear) or channel (Conv2d) of the model's layers that is wholly pruned
// (weight and bias elements all masked, as ln_structured along dim 0 leaves them), and the matching inputs
// of the next Linear or Conv2d (through ReLU, MaxPool2d, Dropout and Flatten, where a channel is H * W
// consecutive features). The model's outputs are unchanged; its parameters, their future optimizer state and
// its activations shrink. Masks of the layers it rebuilds are made permanent first. Make the optimizer after
// shrinking: the parameters are new tensors. Throws Error for layers between two prunable ones that it
// cannot see through (BatchNorm, say), naming them.
void shrink(SequentialImpl& model);

// Replaces every Linear of the model (recursively) whose weight is at least min_sparsity zeros by a
// SparseLinear; returns how many it replaced.
int to_sparse(Module& model, double min_sparsity = 0.5);

namespace detail {
// Zeroes the elements of t whose bit in the packed mask is 0 (CPU, floating t, in place, unrecorded).
void apply_mask(const Tensor& t, const Tensor& bits);
void hook_gradient(const Tensor& param, Module& owner, const std::string& name);
void unhook_gradient(const Tensor& param);
}  // namespace detail

}  // namespace frugal::nn::prune
