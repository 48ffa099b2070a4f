// The op tables of one family, with their argument structs. Matrix products: the GEMM (matmul), the linear
// layer fused with ReLU, and ReLU's backward fused with the bias gradient (core/ops_linalg.cpp,
// core/ops_linear.cpp, kernels/*/gemm.*, kernels/cpu/linear.cpp). The tables themselves are core/op_table.h's
// OpTable; a family's header is included only by its ops, its kernels and their tests, so a new op of one
// family recompiles only that family.
#pragma once

#include "op_table.h"

namespace frugal {

// C[b] = alpha * A[b] @ B[b] + beta * C[b] for b < batch; A is m x k, B is k x n, C is m x n (contiguous
// rows). Each of A and B has a unit stride along rows or columns (the op layer copies otherwise). Strides in
// elements.
struct GemmArgs {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int64_t a_batch = 0, a_row = 0, a_col = 1;
  int64_t b_batch = 0, b_row = 0, b_col = 1;
  int64_t c_batch = 0, c_row = 0;
  float alpha = 1, beta = 0;
};
using GemmKernel = void(const GemmArgs& args);

// A linear layer, the bias (and with relu the ReLU) applied as the GEMM stores C: y [m, n] = x [m, k] w^T +
// bias, or max(that, 0), x and y contiguous, w [n, k] contiguous, bias [n] or null. Registered where a device
// has such a fused GEMM (f32 and bf16 through oneDNN's matmul primitive on the CPU); ops::linear and
// ops::linear_relu compose it elsewhere.
struct LinearArgs {
  int64_t m = 0, n = 0, k = 0;
  const void* x = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;
  void* y = nullptr;
  bool relu = false;
};
using LinearKernel = void(const LinearArgs& args);

// ReLU's backward and the bias gradient in one pass over contiguous [rows, cols] g and y (ReLU's output):
// gz = y > 0 ? g : 0 and dbias [cols] = the column sums of gz, summed in the order ops::sum(gz, {0}) uses
// (on the CPU, Note [pairwise sums] in kernels/cpu/cascade.h).
struct ReluBackwardBiasArgs {
  int64_t rows = 0, cols = 0;
  const void* g = nullptr;
  const void* y = nullptr;
  void* gz = nullptr;
  void* dbias = nullptr;
};
using ReluBackwardBiasKernel = void(const ReluBackwardBiasArgs& args);

extern OpTable<GemmKernel> op_gemm;
extern OpTable<LinearKernel> op_linear;
extern OpTable<ReluBackwardBiasKernel> op_relu_backward_bias;

}  // namespace frugal
