// Row-wise sparse gradients: what nn::Embedding with sparse(true) leaves on its weight instead of a dense
// [num_embeddings, dim] gradient, and what optim::SparseAdam consumes. Not a general sparse tensor type.
//
//   nn::Embedding emb(nn::EmbeddingOptions(50000, 256).sparse(true));
//   sum(emb(tokens) * w).backward();
//   SparseGrad g = autograd::sparse_grad(emb->weight);  // g.indices [nnz], g.values [nnz, 256]
//   Tensor dense = autograd::to_dense(g);              // [50000, 256], for checking
//
// Note [sparse gradients]
// A batch touches few rows of a large embedding, so its gradient is kept as (row indices, row values) in the
// weight's AutogradMeta::sparse_grad, beside (never together with) the dense .grad. The embedding's node
// writes there itself (a weak reference to the weight's metadata) and returns no gradient to the engine, so
// the engine and every dense rule stay unaware of sparsity. A sparse gradient is always coalesced: indices
// unique and ascending, duplicate rows summed; a second backward concatenates its rows with the held ones
// and coalesces again. zero_grad() drops it. Optimizers other than SparseAdam refuse it
// (optim/optimizer.cpp), and SparseAdam refuses dense gradients. The bytes are counted under the memory tag
// "gradients".
#pragma once

#include "graph.h"

namespace frugal::autograd {

// The sparse gradient of t (not defined() when it has none).
SparseGrad sparse_grad(const Tensor& t);

// Sums the rows of values [n, dim] that share an index (indices: i64 or i32 [n], each in [0, rows)) into
// a SparseGrad with unique, ascending indices. Rows are summed in their order in `values`.
SparseGrad coalesce(const Tensor& indices, const Tensor& values, int64_t rows);

// Adds the rows (indices [n], values [n, dim]) into meta's sparse gradient: concatenated with the rows it
// holds, then coalesced. Throws when meta already holds a dense gradient or rows of another shape.
void accumulate_sparse_grad(AutogradMeta& meta, const Tensor& indices, const Tensor& values, int64_t rows);

// The dense form [rows, dim] (zeros outside the indices).
Tensor to_dense(const SparseGrad& grad);

}  // namespace frugal::autograd
