// The op tables of one family, with their argument structs. Layer normalisation (core/ops_norm.cpp,
// kernels/*/norm.*); batch normalisation has core/batch_norm.h. The tables themselves are core/op_table.h's
// OpTable; a family's header is included only by its ops, its kernels and their tests, so a new op of one
// family recompiles only that family.
#pragma once

#include <optional>

#include "op_table.h"

namespace frugal {

// Fused layer normalisation over contiguous [rows, cols] rows (nn/functional.h, layer_norm):
//   forward:  mean[r] = sum_j x[r, j] / cols,  rstd[r] = 1 / sqrt(sum_j (x[r, j] - mean[r])^2 / cols + eps),
//             y[r, j] = (x[r, j] - mean[r]) rstd[r] weight[j] + bias[j]
//   backward: with xh = (x - mean) rstd and g = dy weight (g = dy without a weight),
//             dx[r, j] = rstd[r] (g[r, j] - mean_k g[r, k] - xh[r, j] mean_k (g xh)[r, k]),
//             dweight[j] = sum_r dy[r, j] xh[r, j],  dbias[j] = sum_r dy[r, j]
// x, y, dy, dx have the table's dtype; weight, bias, dweight, dbias, mean, rstd and the workspace have its
// compute type (f32 for f16/bf16, the dtype itself otherwise). weight and bias (forward) and dx, dweight and
// dbias (backward) may be null. The backward sums dweight and dbias per chunk of rows (`chunks` equal spans,
// chosen by the op layer from the shape alone) into workspace [chunks, 2, cols], then over the chunks in
// order, so the results do not depend on the number of threads.
// The x-hat forms (Note [layer norm saves x-hat] in autograd/grad_norm.cpp): op_layer_norm_xhat is the
// forward that also writes xh into xhat (rounded to xhat_dtype; y as op_layer_norm's, bit for bit), and
// op_layer_norm_backward_xhat the backward from xhat (read as xhat_dtype) and rstd instead of x and mean.
// The rounded forms (Note [layer norm before a Linear under autocast], autograd/grad_linear.cpp):
// op_layer_norm_rounded is op_layer_norm_xhat whose y has xhat_dtype and is the affine map of the rounded
// x-hat, y[r, j] = S(S(xh[r, j]) weight[j] + bias[j]) (S = xhat_dtype, computed in the compute type); and
// op_layer_norm_affine makes that y again from xhat alone (x, mean, rstd unused), bit for bit.
// All four are keyed by x's dtype; xhat_dtype is any floating dtype (f32, f64, f16, bf16).
struct LayerNormArgs {
  const void* x = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  void* y = nullptr;          // forward out
  void* mean = nullptr;       // forward out, backward in [rows]
  void* rstd = nullptr;       // forward out, backward in [rows]
  const void* dy = nullptr;   // backward in
  void* dx = nullptr;         // backward out
  void* dweight = nullptr;    // backward out [cols]
  void* dbias = nullptr;      // backward out [cols]
  void* workspace = nullptr;  // backward scratch [chunks, 2, cols]
  void* xhat = nullptr;       // x-hat forms: forward out, backward in [rows, cols]
  DType xhat_dtype = DType::F32;
  // op_layer_norm_backward_xhat: dy's dtype when it is not the table's: the CPU's f32 kernels also take dy
  // in x-hat's 16-bit dtype (d x-hat under autocast), converted as it is read.
  std::optional<DType> dy_dtype;
  int64_t rows = 0, cols = 0, chunks = 1;
  double eps = 1e-5;
};
using LayerNormKernel = void(const LayerNormArgs& args);
extern OpTable<LayerNormKernel> op_layer_norm;
extern OpTable<LayerNormKernel> op_layer_norm_backward;
extern OpTable<LayerNormKernel> op_layer_norm_xhat;
extern OpTable<LayerNormKernel> op_layer_norm_backward_xhat;
extern OpTable<LayerNormKernel> op_layer_norm_rounded;
extern OpTable<LayerNormKernel> op_layer_norm_affine;

}  // namespace frugal
