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
};

// The plan for `a` in direction `dir` with every user tensor in `type` (f32 or bf16), built once and cached
// under the current layout and Winograd policies (set_conv_onednn_any_layout, set_conv_onednn_winograd); null
// where oneDNN declines the shape (the caller's fallback then runs).
std::shared_ptr<const ConvPlan> conv_plan(const ConvArgs& a, ConvDirection dir, dnnl::memory::data_type type);

// Runs the plan: reorders inputs into the primitive's layouts (arena buffers), executes, reorders outputs
// back into the user's tensors. `dy`, when given, is d y already in the primitive's layout
// (conv2d_backward_both's). `y`, when given, receives the forward's output in the primitive's layout
// (dst_desc's bytes), where it stays: a.y is not written (conv2d_relu_pool2's kernel pools from it).
void run_conv_plan(const ConvPlan& plan, const ConvArgs& a, const dnnl::memory* dy = nullptr,
                   void* y = nullptr);

// run_conv_plan's buffers on the meta device, held together (with_dy: d y comes prepared, no buffer for it;
// with_y: the forward's output has its own place, no buffer for it either).
void conv_plan_meta(const ConvPlan& plan, bool with_dy, bool with_y = false);

// The layout the primitive writes the forward's output in.
const dnnl::memory::desc& conv_plan_dst_desc(const ConvPlan& plan);
#endif

}  // namespace frugal::cpu
