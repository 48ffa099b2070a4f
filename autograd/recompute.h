// Recompute segments (activation checkpointing): run part of a model without keeping the tensors its backward
// needs, and compute them again in backward.
//
//   Tensor h = autograd::recompute([&](const std::vector<Tensor>& in) { return block(in[0]); }, {x});
//
// Note [recompute through saved-tensor hooks]: the segment runs normally, so its nodes and edges are recorded
// (parameters used inside get gradients even when no input requires grad), but a SavedTensorHooks pair
// replaces every tensor the segment would save by a number. The first time backward unpacks one of them, the
// segment runs again from its inputs with the RNG state of the first run (so dropout draws the same masks)
// and its autocast state (so it casts as it did; amp/autocast.h), and hands out the tensors it saves this
// time, in the same order. The gradients then flow through the first run's nodes: same kernels, same inputs,
// so they are bit-identical to a run without recompute. Each recomputed tensor is handed out once, so the
// segment's memory falls again as backward leaves it.
//
// Note [selective recompute]: a RecomputePolicy names ops whose results the segment keeps from its first
// run, as PyTorch's selective activation checkpointing and JAX's checkpoint policies do:
//
//   Tensor h = autograd::recompute(block_fn, {x}, autograd::RecomputePolicy::keep_matmuls());
//
// The ops that can be kept are the ones worth keeping, whose work is a GEMM (replayable_ops()). When the
// segment runs again, each kept op hands out what it computed the first time (its result, and what its
// backward needs that is not an input: self_attention's probabilities or their row statistics,
// layer_norm_linear's x-hat and rstd under autocast) instead of
// computing it, so backward recomputes the cheap ops (norms, activations, residual adds, views) only. The
// kept results stay alive from the first run until the segment runs again, and the tensors the backward of
// every op saves are still handed out by the second run, so the gradients are bit-identical to a run without
// recompute either way.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "../core/tensor.h"

namespace frugal::autograd {

using SegmentFn = std::function<Tensor(const std::vector<Tensor>& inputs)>;

// Which ops' results a recompute segment keeps (Note [selective recompute]). The default keeps none: the
// whole segment runs again.
class RecomputePolicy {
 public:
  RecomputePolicy() = default;
  static RecomputePolicy recompute_all() { return {}; }
  // Keeps the results of these ops; each must be one of replayable_ops() (an Error names the others).
  static RecomputePolicy keep(std::vector<std::string> ops);
  // Keeps every GEMM-bound op's results: all of replayable_ops().
  static RecomputePolicy keep_matmuls();

  bool keeps(const char* op) const;
  bool keeps_nothing() const { return ops_.empty(); }
  const std::vector<std::string>& ops() const { return ops_; }
  std::string str() const;  // "recompute all" or "keep linear, matmul"

 private:
  std::vector<std::string> ops_;
};

// The ops a policy can keep: linear, linear_relu, matmul, conv2d, conv2d_relu, self_attention, gelu_linear,
// layer_norm_linear. Each by its own name: nn::TransformerBlock's and nn::GPT's Linears after a norm or the
// GELU run as layer_norm_linear and gelu_linear, so keep({"linear"}) keeps only the attention's projection
// there (keep_matmuls() keeps them all).
const std::vector<std::string>& replayable_ops();

// fn must do the same ops each time it runs on the same inputs (it runs twice when backward reaches it). The
// inputs are kept alive until backward; anything else fn reads (parameters) must stay unchanged until then.
// Outside grad mode this is just fn(inputs).
Tensor recompute(const SegmentFn& fn, const std::vector<Tensor>& inputs,
                 const RecomputePolicy& policy = RecomputePolicy());

}  // namespace frugal::autograd
