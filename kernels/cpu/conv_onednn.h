// The CPU convolution's oneDNN plans, shared by the per-direction kernels (kernels/cpu/conv.cpp) and the
// fused backward (kernels/cpu/conv_backward.cpp): a cached primitive per shape, direction and dtype, with the
// reorders between the user's NCHW tensors and the layouts it wants. Internal to kernels/cpu.
#pragma once

#include "core/op_table_conv.h"

#ifdef FRUGAL_HAVE_ONEDNN
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/onednn.h"
#endif

namespace frugal::cpu {

enum class ConvDirection { Forward, BackwardData, BackwardWeight };

#ifdef FRUGAL_HAVE_ONEDNN
// One oneDNN argument of a primitive: where its bytes sit in the user's NCHW tensor, the layout the primitive
// wants, and the reorder between them when they differ.
struct Operand {
  int arg = 0;  // DNNL_ARG_*
  bool output = false;
  dnnl::memory::desc user, compute;
  std::optional<dnnl::reorder> reorder;  // user -> compute for inputs, compute -> user for outputs
};

// A created primitive and what running it needs; immutable once built, so threads may share it (the
// scratchpad is user-managed: each call brings its own).
struct ConvPlan {
  dnnl::primitive primitive;
  std::vector<Operand> operands;
  dnnl::memory::desc scratchpad;
  std::string implementation;  // oneDNN's name for the primitive's kernel, e.g. "jit_wino_4x3:avx512_core"
  dnnl::memory::data_type type = dnnl::memory::data_type::f32;  // of every user tensor
};

// The plan for `a` in direction `dir` with every user tensor in `type` (f32 or bf16), built once and cached
// under the current layout and Winograd policies (set_conv_onednn_any_layout, set_conv_onednn_winograd); null
// where oneDNN declines the shape (the caller's fallback then runs).
std::shared_ptr<const ConvPlan> conv_plan(const ConvArgs& a, ConvDirection dir, dnnl::memory::data_type type);

// Operands a caller has already in the primitive's layouts, so that run_conv_plan neither reorders nor
// allocates for them (null: the user's tensor, reordered as needed).
struct Prepared {
  const dnnl::memory* dy = nullptr;  // d y (conv2d_backward_both's)
  void* y = nullptr;  // the forward's output stays here, and a.y is not written (conv2d_relu_pool2's)
  const void* weights = nullptr;  // the weights, reordered once for all of a forward's chunks
};

// Runs the plan: reorders inputs into the primitive's layouts (arena buffers), executes, reorders outputs
// back into the user's tensors, except the operands that come prepared.
void run_conv_plan(const ConvPlan& plan, const ConvArgs& a, const Prepared& prepared = {});

// run_conv_plan's buffers on the meta device, held together (none for the operands `prepared` names; the
// pointers are not read).
void conv_plan_meta(const ConvPlan& plan, const Prepared& prepared = {});

// The weights of a forward's chunks (their plans, each with its arguments) reordered once into the layout the
// plans share: an arena buffer (on the meta device when meta, for a dry run), or an undefined tensor where
// there is one chunk, no reorder, or no layout they share. Prepared::weights for each chunk's run.
Tensor shared_weights(const std::vector<const ConvPlan*>& plans, const ConvArgs& a, bool meta);

// The layout the primitive writes the forward's output in.
const dnnl::memory::desc& conv_plan_dst_desc(const ConvPlan& plan);
#endif

}  // namespace frugal::cpu
