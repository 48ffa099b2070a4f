// The op tables of one family, with their argument structs. The optimizers' fused updates and the loss
// scaler's unscale pass (optim/, kernels/*/optim.*, kernels/cpu/amp.cpp). The tables themselves are
// core/op_table.h's OpTable; a family's header is included only by its ops, its kernels and their tests, so a
// new op of one family recompiles only that family.
#pragma once

#include "op_table.h"

namespace frugal {

// Optimizer updates (optim/): one fused pass over a parameter, its gradient and its state, each contiguous
// with n elements. Keyed by the parameter's dtype; the gradient has that dtype too, the state is f32 for
// f16/bf16 parameters and the parameter's dtype otherwise (the compute type, acc_t). Formulas: optim/sgd.h,
// optim/adam.h.
struct SgdStepArgs {
  void* param = nullptr;
  const void* grad = nullptr;
  void* momentum_buffer = nullptr;  // null when momentum is 0
  int64_t n = 0;
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  bool first_step = false;  // the buffer starts as the gradient
};
using SgdStepKernel = void(const SgdStepArgs& args);
extern OpTable<SgdStepKernel> op_sgd_step;
struct AdamStepArgs {
  void* param = nullptr;
  const void* grad = nullptr;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  void* max_exp_avg_sq = nullptr;  // amsgrad only
  int64_t n = 0;
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  double step_size = 0;                 // lr / (1 - beta1^step)
  double bias_correction2_sqrt = 1;     // sqrt(1 - beta2^step)
  bool decoupled_weight_decay = false;  // AdamW
  bool amsgrad = false;
};
using AdamStepKernel = void(const AdamStepArgs& args);
extern OpTable<AdamStepKernel> op_adam_step;

// Adam/AdamW with 8-bit moments (optim/adam8bit.h): exp_avg and exp_avg_sq as 8-bit codes, each with one
// f32 scale (the block's largest |value|) per block of block_size elements; the last block may be shorter.
// Per block: dequantise, the Adam/AdamW update in the compute type from the new f32 moments, the new scales,
// requantise. Keyed by the parameter's dtype; the gradient has that dtype.
struct Adam8bitStepArgs {
  void* param = nullptr;                // [n]
  const void* grad = nullptr;           // [n]
  uint8_t* exp_avg_codes = nullptr;     // [n]
  float* exp_avg_absmax = nullptr;      // [ceil(n / block_size)]
  uint8_t* exp_avg_sq_codes = nullptr;  // [n]
  float* exp_avg_sq_absmax = nullptr;   // [ceil(n / block_size)]
  int64_t n = 0;
  int64_t block_size = 2048;  // a multiple of 64, at most kAdam8bitMaxBlock
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  double step_size = 0;                 // lr / (1 - beta1^step)
  double bias_correction2_sqrt = 1;     // sqrt(1 - beta2^step)
  bool decoupled_weight_decay = false;  // AdamW
  // The codes: bitsandbytes' dynamic code, signed for exp_avg and unsigned for exp_avg_sq
  // (kernels/dynamic_code.h), or with float8 E4M3 for exp_avg and E4M4 for exp_avg_sq's square root, whose
  // scales exp_avg_sq_codes and exp_avg_sq_absmax then hold (kernels/float8_code.h).
  bool float8 = false;
};
// The largest block: the kernels keep a block's new moments on the stack (CPU) or in registers (CUDA).
inline constexpr int64_t kAdam8bitMaxBlock = 4096;
using Adam8bitStepKernel = void(const Adam8bitStepArgs& args);
extern OpTable<Adam8bitStepKernel> op_adam8bit_step;

// Loss scaling (optim/grad_scaler.h): one pass over a contiguous gradient of n elements, keyed by its dtype.
//   *found_inf = 1 when some element is inf or nan (never set back to 0);
//   grad[i] *= inv_scale, in f32 for f16/bf16 (as PyTorch's _amp_foreach_non_finite_check_and_unscale_;
//   skipped when inv_scale is 1, which makes the pass a check only)
// found_inf is one f32 in the gradient's device memory (a 0-d tensor's data), as PyTorch's found_inf tensor:
// a CUDA kernel ORs into it on the stream without waiting, and whoever needs the answer reads it once for
// all the gradients of that device (Note [one found_inf per device] in optim/grad_scaler.cpp).
struct UnscaleArgs {
  void* grad = nullptr;
  int64_t n = 0;
  float inv_scale = 1;
  float* found_inf = nullptr;
};
using UnscaleKernel = void(const UnscaleArgs& args);
extern OpTable<UnscaleKernel> op_non_finite_check_and_unscale;

}  // namespace frugal
