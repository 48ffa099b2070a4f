// The op tables of one family, with their argument structs. Softmax, log-softmax and the fused softmax +
// cross-entropy (core/ops_activation.cpp, nn/functional.h, kernels/*/softmax.*,
// kernels/cpu/cross_entropy.cpp). The tables themselves are core/op_table.h's OpTable; a family's header is
// included only by its ops, its kernels and their tests, so a new op of one family recompiles only that
// family.
#pragma once

#include "op_table.h"

namespace frugal {

// Softmax (or log-softmax) over the last dim of a contiguous [rows, cols] input into a contiguous output.
struct SoftmaxArgs {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t rows = 0, cols = 0;
  bool log = false;
};
using SoftmaxKernel = void(const SoftmaxArgs& args);
extern OpTable<SoftmaxKernel> op_softmax;

// The gradient of softmax (or log-softmax) over the last dim of contiguous [rows, cols] tensors, from its
// output y and the output's gradient g, in one pass that sums and one that writes (no temporary of their
// size; f16/bf16 compute in f32):
//   softmax:      dx[r, j] = y[r, j] (g[r, j] - sum_k g[r, k] y[r, k])
//   log_softmax:  dx[r, j] = g[r, j] - exp(y[r, j]) sum_k g[r, k]
struct SoftmaxBackwardArgs {
  const void* y = nullptr;
  const void* grad = nullptr;
  void* dx = nullptr;
  int64_t rows = 0, cols = 0;
  bool log = false;
};
using SoftmaxBackwardKernel = void(const SoftmaxBackwardArgs& args);
extern OpTable<SoftmaxBackwardKernel> op_softmax_backward;

// Fused softmax + cross-entropy over contiguous [rows, classes] logits with i64 targets [rows]; one pass over
// each row in each direction (nn/functional.h). Per-row tensors (loss, lse, grad) are f32 for f16/bf16 logits
// and of the logits' dtype otherwise.
//   forward:  loss[r] = lse[r] - (1 - eps) x[r, t] - eps / C sum_j x[r, j], lse[r] = log sum_j exp(x[r, j])
//   backward: d_logits[r, j] = grad[r] (exp(x[r, j] - lse[r]) - (1 - eps) [j == t] - eps / C)
// Rows whose target is ignore_index give loss 0 and a zero gradient. Targets are checked by the op layer.
struct CrossEntropyArgs {
  const void* logits = nullptr;
  const int64_t* target = nullptr;
  void* loss = nullptr;        // forward out [rows]
  void* lse = nullptr;         // forward out, backward in [rows]
  const void* grad = nullptr;  // backward in [rows]
  void* d_logits = nullptr;    // backward out [rows, classes]
  int64_t rows = 0, classes = 0;
  int64_t ignore_index = -100;
  double label_smoothing = 0;
};
using CrossEntropyKernel = void(const CrossEntropyArgs& args);
extern OpTable<CrossEntropyKernel> op_cross_entropy;
extern OpTable<CrossEntropyKernel> op_cross_entropy_backward;

}  // namespace frugal
