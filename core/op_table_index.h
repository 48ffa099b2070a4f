// The op tables of one family, with their argument structs. Indexing along one dim: index_select, gather,
// scatter_add, index_add (core/ops_index.cpp, kernels/*/index.*). The tables themselves are core/op_table.h's
// OpTable; a family's header is included only by its ops, its kernels and their tests, so a new op of one
// family recompiles only that family.
#pragma once

#include "op_table.h"

namespace frugal {

// Indexing along one dim of a contiguous tensor seen as [outer, dim_size, inner].
//   index_select: out[o, i, j] = x[o, index[i], j]          (index has n_index entries; out dim size n_index)
//   gather:       out[o, i, j] = x[o, index[o, i, j], j]    (index and out are [outer, n_index, inner])
//   scatter_add:  out[o, index[o, i, j], j] += src[o, i, j] (out starts as a copy of x)
// Index values are checked by the op layer before the kernel runs.
struct IndexArgs {
  const void* x = nullptr;
  const int64_t* index = nullptr;
  const void* src = nullptr;
  void* out = nullptr;
  int64_t outer = 1, dim_size = 0, inner = 1, n_index = 0;
};
using IndexKernel = void(const IndexArgs& args);
extern OpTable<IndexKernel> op_index_select;
extern OpTable<IndexKernel> op_gather;
extern OpTable<IndexKernel> op_scatter_add;

// index_select's transpose, over IndexArgs' [outer, dim_size, inner] layout: out[o, index[i], j] +=
// src[o, i, j] for i < n_index (src [outer, n_index, inner], index 1-d, duplicates accumulate; out starts as
// a copy of x). One vectorised row add per index instead of scatter_add's per-element index.
extern OpTable<IndexKernel> op_index_add;

}  // namespace frugal
