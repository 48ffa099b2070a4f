// CPU kernels over sparse data. A sparse matrix (CSR) times a dense one, for nn::SparseLinear, through Eigen.
// Over the rows of a sparse (row-wise) gradient: summing duplicate rows (coalescing, see autograd/sparse.h)
// and SparseAdam's lazy update of the rows present (optim/sparse_adam.h). Both run one thread per block of
// whole rows; rows are unique, so no two threads write the same bytes. The references are the dense paths
// they replace: the embedding's dense gradient (tests/autograd/test_sparse.cpp) and PyTorch's SparseAdam
// (tests/optim/test_sparse_adam.cpp).
#include <Eigen/SparseCore>
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/op_table_sparse.h"
#include "core/parallel.h"
#include "kernels/cpu/register.h"

namespace frugal {
namespace {

using cpu::for_types;

// Rows per parallel chunk: about kGrain elements.
int64_t row_grain(int64_t dim) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(dim, 1)); }

// values [n, dim], order [n], starts [segments + 1] -> out [segments, dim]; accumulates in acc_t<T>.
template <typename T>
void segment_sum_rows_cpu(const SegmentSumArgs& a) {
  using C = acc_t<T>;
  const T* values = static_cast<const T*>(a.values);
  T* out = static_cast<T*>(a.out);
  const int64_t dim = a.dim;
  parallel_for(0, a.segments, row_grain(dim), [&](int64_t begin, int64_t end) {
    std::vector<C> acc(static_cast<size_t>(dim));  // per-thread scratch of one row (not tensor memory)
    for (int64_t s = begin; s < end; ++s) {
      std::fill(acc.begin(), acc.end(), C(0));
      for (int64_t k = a.starts[s]; k < a.starts[s + 1]; ++k) {
        const T* row = values + a.order[k] * dim;
        for (int64_t j = 0; j < dim; ++j) acc[size_t(j)] += C(row[j]);
      }
      T* o = out + s * dim;
      for (int64_t j = 0; j < dim; ++j) o[j] = T(acc[size_t(j)]);
    }
  });
}

// param [rows, dim] (T); exp_avg, exp_avg_sq [rows, dim] (acc_t<T>); values [nnz, dim] (T) at rows indices.
// The operation order is torch.optim.SparseAdam's (PyTorch 1.13, torch/optim/_functional.py): the moments
// move by (1 - beta) * (new - old), and the step divides by sqrt(v) + eps with the corrections in step_size.
template <typename T>
void sparse_adam_step_cpu(const SparseAdamStepArgs& a) {
  using C = acc_t<T>;
  T* param = static_cast<T*>(a.param);
  C* exp_avg = static_cast<C*>(a.exp_avg);
  C* exp_avg_sq = static_cast<C*>(a.exp_avg_sq);
  const T* values = static_cast<const T*>(a.values);
  const C one_minus_beta1 = C(1 - a.beta1), one_minus_beta2 = C(1 - a.beta2), eps = C(a.eps),
          step_size = C(a.step_size);
  const int64_t dim = a.dim;
  parallel_for(0, a.nnz, row_grain(dim), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t offset = a.indices[r] * dim;
      T* p = param + offset;
      C* m = exp_avg + offset;
      C* v = exp_avg_sq + offset;
      const T* g_row = values + r * dim;
      for (int64_t j = 0; j < dim; ++j) {
        const C g = C(g_row[j]);
        const C m_new = m[j] + (g - m[j]) * one_minus_beta1;
        const C v_new = v[j] + (g * g - v[j]) * one_minus_beta2;
        m[j] = m_new;
        v[j] = v_new;
        const C denom = std::sqrt(v_new) + eps;
        p[j] = T(C(p[j]) + -step_size * (m_new / denom));
      }
    }
  });
}

// Eigen's sparse module over the tensors' own bytes: out [rows, batch] = W [rows, cols] (row-major sparse) *
// x [cols, batch] (row-major dense). Eigen runs a row-major sparse times dense product row by row of W, on
// its OpenMP threads; each nonzero (r, c) adds values * x's row c to out's row r, both contiguous here, so
// the inner loop is a vectorised axpy of `batch` elements.
template <typename T>
void csr_matmul_cpu(const CsrMatmulArgs& a) {
  using Sparse = Eigen::Map<const Eigen::SparseMatrix<T, Eigen::RowMajor, int32_t>>;
  using Dense = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Sparse w(a.rows, a.cols, a.nnz, a.row_offsets, a.col_indices, static_cast<const T*>(a.values));
  const Eigen::Map<const Dense> x(static_cast<const T*>(a.x), a.cols, a.batch);
  Eigen::Map<Dense> out(static_cast<T*>(a.out), a.rows, a.batch);
  out.noalias() = w * x;
}

const bool kRegistered = [] {
  for_types<float, double>([](auto t) {
    using T = decltype(t);
    op_csr_matmul.set(DeviceType::CPU, dtype_v<T>, csr_matmul_cpu<T>);
  });
  for_types<float, double, Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_segment_sum_rows.set(DeviceType::CPU, dtype_v<T>, segment_sum_rows_cpu<T>);
    op_sparse_adam_step.set(DeviceType::CPU, dtype_v<T>, sparse_adam_step_cpu<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
