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
#pragma once

#include <functional>
#include <vector>

#include "../core/tensor.h"

namespace frugal::autograd {

using SegmentFn = std::function<Tensor(const std::vector<Tensor>& inputs)>;

// fn must do the same ops each time it runs on the same inputs (it runs twice when backward reaches it). The
// inputs are kept alive until backward; anything else fn reads (parameters) must stay unchanged until then.
// Outside grad mode this is just fn(inputs).
Tensor recompute(const SegmentFn& fn, const std::vector<Tensor>& inputs);

}  // namespace frugal::autograd
