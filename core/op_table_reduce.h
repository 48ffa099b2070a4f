// The op tables of one family, with their argument structs. Reductions: sum, mean, max, min, argmax, argmin,
// var (core/ops_reduce.cpp, kernels/*/reduce.*). The tables themselves are core/op_table.h's OpTable; a
// family's header is included only by its ops, its kernels and their tests, so a new op of one family
// recompiles only that family.
#pragma once

#include "op_table.h"

namespace frugal {

// A reduction of `in` over some of its dims. The op layer orders the input's dims as kept dims (the output's
// dims, contiguous in `out`) followed by reduced dims.
struct ReduceArgs {
  const char* in = nullptr;
  char* out = nullptr;
  int64_t n_out = 1;     // number of outputs
  int64_t n_reduce = 1;  // elements reduced into each output
  int kept_ndim = 0;
  int64_t kept_sizes[kMaxDims] = {};
  int64_t kept_strides[kMaxDims] = {};  // elements, in the input
  int red_ndim = 0;
  int64_t red_sizes[kMaxDims] = {};
  int64_t red_strides[kMaxDims] = {};  // elements, in the input
  double correction = 0;               // var: divide by n_reduce - correction
};
using ReduceKernel = void(const ReduceArgs& args);

// Reductions over the dims ReduceArgs describes; argmax writes i64.
#define FRUGAL_REDUCE_OPS(X) X(sum) X(max) X(min) X(argmax) X(argmin) X(var)
#define FRUGAL_DECLARE_TABLE(name) extern OpTable<ReduceKernel> op_##name;
FRUGAL_REDUCE_OPS(FRUGAL_DECLARE_TABLE)
#undef FRUGAL_DECLARE_TABLE

}  // namespace frugal
