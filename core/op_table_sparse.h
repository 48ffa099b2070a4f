// The op tables of one family, with their argument structs. Sparse rows: the segment sums of a sparse
// gradient and SparseAdam's row update (autograd/sparse.h, optim/sparse_adam.h, kernels/cpu/sparse.cpp). The
// tables themselves are core/op_table.h's OpTable; a family's header is included only by its ops, its kernels
// and their tests, so a new op of one family recompiles only that family.
#pragma once

#include "op_table.h"

namespace frugal {

// Sparse rows (autograd/sparse.h, optim/sparse_adam.h). Keyed by the values' dtype.
//   segment_sum_rows: out[s, :] = sum over k in [starts[s], starts[s + 1]) of values[order[k], :], summed in
//                     k order (values [n, dim], order [n], starts [segments + 1], out [segments, dim])
struct SegmentSumArgs {
  const void* values = nullptr;
  const int64_t* order = nullptr;
  const int64_t* starts = nullptr;
  void* out = nullptr;
  int64_t segments = 0, dim = 0;
};
using SegmentSumKernel = void(const SegmentSumArgs& args);
extern OpTable<SegmentSumKernel> op_segment_sum_rows;
// SparseAdam's lazy update of the rows `indices` (unique) of a [rows, dim] parameter and its state (the
// state's dtype as for op_adam_step), as torch.optim.SparseAdam computes it per element of those rows:
//   m += (1 - beta1) * (g - m);  v += (1 - beta2) * (g * g - v)
//   param -= step_size * m / (sqrt(v) + eps),  step_size = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
struct SparseAdamStepArgs {
  void* param = nullptr;  // [rows, dim]
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  const int64_t* indices = nullptr;  // [nnz], unique, in [0, rows)
  const void* values = nullptr;      // [nnz, dim], the parameter's dtype
  int64_t nnz = 0, dim = 0;
  double beta1 = 0, beta2 = 0, eps = 0, step_size = 0;
};
using SparseAdamStepKernel = void(const SparseAdamStepArgs& args);
extern OpTable<SparseAdamStepKernel> op_sparse_adam_step;
// A dense matrix times a sparse one in compressed sparse rows, transposed (nn::SparseLinear's forward):
//   out[j, r] = bias[r] + sum over k in [start, end) of values[k] * x[j, col_indices[k]]
// where start, end = row_offsets[r], row_offsets[r + 1] (x [batch, cols] and out [batch, rows], both
// contiguous; bias [rows] or none). Keyed by the values' dtype. The CPU kernel takes working memory from the
// arena (Note [a sparse layer's product], kernels/cpu/sparse.cpp).
struct CsrMatmulArgs {
  const void* values = nullptr;
  const int32_t* col_indices = nullptr;
  const int32_t* row_offsets = nullptr;  // [rows + 1]
  const void* x = nullptr;               // [batch, cols]
  const void* bias = nullptr;            // [rows], or nullptr
  void* out = nullptr;                   // [batch, rows]
  int64_t rows = 0, cols = 0, nnz = 0, batch = 0;
};
using CsrMatmulKernel = void(const CsrMatmulArgs& args);
extern OpTable<CsrMatmulKernel> op_csr_matmul;

}  // namespace frugal
