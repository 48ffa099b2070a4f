// CPU GEMM: f32 through oneDNN's dnnl_sgemm when built with it (DESIGN.md says why), Eigen's GEMM otherwise
// and for f64. The naive reference the tests and benchmarks check against is kernels/cpu/reference.h.
#include <Eigen/Core>

#include "core/error.h"
#include "core/op_table.h"
#include "core/parallel.h"

#ifdef FRUGAL_HAVE_ONEDNN
#include <dnnl.h>
#endif

namespace frugal {
namespace {

template <typename T>
void gemm_eigen(const GemmArgs& g) {
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Strided = Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>;
  using CMap = Eigen::Map<const Mat, 0, Strided>;
  using OMap = Eigen::Map<Mat, 0, Eigen::OuterStride<>>;
  for (int64_t b = 0; b < g.batch; ++b) {
    CMap a(static_cast<const T*>(g.a) + b * g.a_batch, g.m, g.k, Strided(g.a_row, g.a_col));
    CMap bm(static_cast<const T*>(g.b) + b * g.b_batch, g.k, g.n, Strided(g.b_row, g.b_col));
    OMap c(static_cast<T*>(g.c) + b * g.c_batch, g.m, g.n, Eigen::OuterStride<>(g.c_row));
    if (g.beta == 0)
      c.noalias() = T(g.alpha) * (a * bm);
    else
      c = T(g.beta) * c + T(g.alpha) * (a * bm);
  }
}

#ifdef FRUGAL_HAVE_ONEDNN
void gemm_f32_onednn(const GemmArgs& g) {
  // dnnl_sgemm is row-major: 'N' reads A as m x k with rows lda apart, 'T' reads it as its k x m transpose.
  const char ta = g.a_col == 1 ? 'N' : 'T', tb = g.b_col == 1 ? 'N' : 'T';
  const int64_t lda = ta == 'N' ? g.a_row : g.a_col, ldb = tb == 'N' ? g.b_row : g.b_col;
  for (int64_t b = 0; b < g.batch; ++b) {
    const dnnl_status_t st =
        dnnl_sgemm(ta, tb, g.m, g.n, g.k, g.alpha, static_cast<const float*>(g.a) + b * g.a_batch, lda,
                   static_cast<const float*>(g.b) + b * g.b_batch, ldb, g.beta,
                   static_cast<float*>(g.c) + b * g.c_batch, g.c_row);
    FRUGAL_ASSERT(st == dnnl_success, "dnnl_sgemm failed with status ", int(st), " for m=", g.m, " n=", g.n,
                  " k=", g.k);
  }
}
#endif

const bool kRegistered = [] {
#ifdef FRUGAL_HAVE_ONEDNN
  op_gemm.set(DeviceType::CPU, DType::F32, gemm_f32_onednn);
#else
  op_gemm.set(DeviceType::CPU, DType::F32, gemm_eigen<float>);
#endif
  op_gemm.set(DeviceType::CPU, DType::F64, gemm_eigen<double>);
  return true;
}();

}  // namespace

// Exposed for the tests and benchmarks that compare both f32 paths (the Eigen one is the oracle for oneDNN).
void gemm_f32_eigen_cpu(const GemmArgs& g) { gemm_eigen<float>(g); }

}  // namespace frugal
