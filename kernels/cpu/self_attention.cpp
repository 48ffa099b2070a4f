// CPU kernels of the fused self-attention (op_self_attention, formulas in core/op_table.h). The heads run in
// parallel, one head's matrices at a time on one thread: its q, k, v are read in place from the packed qkv
// rows (no head split copies), its output is written in place into the merged [B, T, H * hd] rows (no merge
// copy), and each head's T x T products are small enough to stay in L1/L2. The per-head products are small
// register-blocked loops that skip the blocks a causal mask zeroes. The reference is the composite of matmul,
// attention_scores_softmax and views (nn::functional::self_attention_composite).
#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/op_table.h"
#include "core/parallel.h"

namespace frugal {
namespace {

// C = A B for one head's small matrices, with A m x k read through strides (ars, acs) (so a transposed
// operand costs nothing), B k x n with unit column stride and rows brs apart, C m x n with rows crs apart.
// For a block of rows [i, i + MR), c runs over the whole k, or only up to row i + MR - 1 (lower_k) or from
// row i on (upper_k), and columns stop at the first block of NR past row i + MR - 1 (lower_n): how a causal
// product skips what the mask zeroes. Register blocking of MR
// rows by NR columns, kept in registers by the compiler (fixed sizes, omp simd); Eigen's general product
// spends most of its time packing at these sizes (64 x 64 x 32 per head in W3) and cannot skip blocks.
template <typename T, int MR, int NR>
inline void gemm_block(int64_t mr, int64_t nr, int64_t k0, int64_t k1, const T* a, int64_t ars, int64_t acs,
                       const T* b, int64_t brs, T* c, int64_t crs) {
  T acc[MR][NR] = {};
  if (mr == MR && nr == NR) {
    for (int64_t p = k0; p < k1; ++p) {
      const T* bp = b + p * brs;
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const T av = a[r * ars + p * acs];
#pragma omp simd
        for (int j = 0; j < NR; ++j) acc[r][j] += av * bp[j];
      }
    }
  } else {
    for (int64_t p = k0; p < k1; ++p)
      for (int64_t r = 0; r < mr; ++r) {
        const T av = a[r * ars + p * acs];
        for (int64_t j = 0; j < nr; ++j) acc[r][j] += av * b[p * brs + j];
      }
  }
  for (int64_t r = 0; r < mr; ++r)
    for (int64_t j = 0; j < nr; ++j) c[r * crs + j] = acc[r][j];
}

struct Range {           // the bounds of a causal product; the defaults give the whole product
  bool lower_k = false;  // c <= i: k ends after row i (A lower triangular)
  bool upper_k = false;  // c >= i: k starts at row i (A upper triangular)
  bool lower_n = false;  // j <= i: columns end after row i (C's lower triangle wanted)
};

template <typename T, int MR = 8, int NR = 32>
void small_gemm(int64_t m, int64_t n, int64_t k, const T* a, int64_t ars, int64_t acs, const T* b,
                int64_t brs, T* c, int64_t crs, Range range = {}) {
  for (int64_t i = 0; i < m; i += MR) {
    const int64_t mr = std::min<int64_t>(MR, m - i), last = i + mr - 1;
    const int64_t k0 = range.upper_k ? std::min(i, k) : 0, k1 = range.lower_k ? std::min(last + 1, k) : k;
    // Whole blocks of NR columns (the fast path); the few extra entries left of the diagonal are masked later.
    const int64_t n1 = range.lower_n ? std::min((last + NR) / NR * NR, n) : n;
    for (int64_t j = 0; j < n1; j += NR)
      gemm_block<T, MR, NR>(mr, std::min<int64_t>(NR, n1 - j), k0, k1, a + i * ars, ars, acs, b + j, brs,
                            c + i * crs + j, crs);
  }
}

// dst [cols, rows] = src [rows, cols]^T, src rows `stride` apart.
template <typename T>
void transpose(int64_t rows, int64_t cols, const T* src, int64_t stride, T* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * stride + c];
}

// Where head (b, h)'s matrices start: q, k, v (and dq, dk, dv) in the packed rows [B, T, 3, H, hd], rows 3 D
// apart; y (and dy) in the merged rows [B, T, H, hd], rows D apart; P in [B, H, T, T].
struct HeadOffsets {
  int64_t q, y, p;
};
inline HeadOffsets head_offsets(const SelfAttentionArgs& a, int64_t bh) {
  const int64_t b = bh / a.heads, h = bh % a.heads, d = a.heads * a.head_dim;
  return {b * a.t * 3 * d + h * a.head_dim, b * a.t * d + h * a.head_dim, bh * a.t * a.t};
}

// Keys query i may see.
inline int64_t allowed(const SelfAttentionArgs& a, int64_t i) { return a.causal ? i + 1 : a.t; }

// This thread's scratch of `size` elements in the workspace.
template <typename T>
T* scratch(const SelfAttentionArgs& a, int64_t size) {
  const int tid = omp_get_thread_num();
  FRUGAL_ASSERT(tid < a.threads, "self_attention: thread ", tid, " has no workspace (", a.threads,
                " threads planned)");
  return static_cast<T*>(a.workspace) + tid * size;
}

// qkv: [B, T, 3, H, hd]; probs: [B, H, T, T]; y: [B, T, H, hd]; workspace: [threads, hd, T]
template <typename T>
void self_attention_forward_cpu(const SelfAttentionArgs& a) {
  const T* qkv = static_cast<const T*>(a.qkv);
  T* probs = static_cast<T*>(a.probs);
  T* ys = static_cast<T*>(a.y);
  const int64_t t = a.t, hd = a.head_dim, d = a.heads * hd;
  const T scale = T(a.scale);
  Range causal;
  causal.lower_n = a.causal;
  Range causal_k;
  causal_k.lower_k = a.causal;
  parallel_for(0, a.batch * a.heads, 1, [&](int64_t begin, int64_t end) {
    T* kt = scratch<T>(a, hd * t);  // K^T, so that the rows of S = Q K^T come from rows of K^T
    for (int64_t bh = begin; bh < end; ++bh) {
      const HeadOffsets o = head_offsets(a, bh);
      const T* q = qkv + o.q;
      T* p = probs + o.p;
      transpose(t, hd, qkv + o.q + d, 3 * d, kt);
      small_gemm(t, t, hd, q, 3 * d, 1, kt, t, p, t, causal);
      for (int64_t i = 0; i < t; ++i) {
        T* row = p + i * t;
        const int64_t n = allowed(a, i);
        Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> r(row, n);
        // max(scale x) is scale max(x) for scale > 0 and scale min(x) otherwise.
        const T m = scale >= 0 ? scale * r.maxCoeff() : scale * r.minCoeff();
        r = (r * scale - m).exp();
        r *= T(1) / r.sum();
        std::fill(row + n, row + t, T(0));
      }
      small_gemm(t, hd, t, p, t, 1, qkv + o.q + 2 * d, 3 * d, ys + o.y, d, causal_k);  // Y = P V
    }
  });
}

// qkv, dqkv: [B, T, 3, H, hd]; probs: [B, H, T, T]; dy: [B, T, H, hd]; workspace: [threads, T * T + hd * T]
template <typename T>
void self_attention_backward_cpu(const SelfAttentionArgs& a) {
  const T* qkv = static_cast<const T*>(a.qkv);
  const T* probs = static_cast<const T*>(a.probs);
  const T* dys = static_cast<const T*>(a.dy);
  T* dqkv = static_cast<T*>(a.dqkv);
  const int64_t t = a.t, hd = a.head_dim, d = a.heads * hd;
  const T scale = T(a.scale);
  Range lower_n, lower_k, upper_k;
  lower_n.lower_n = lower_k.lower_k = upper_k.upper_k = a.causal;
  parallel_for(0, a.batch * a.heads, 1, [&](int64_t begin, int64_t end) {
    T* ds = scratch<T>(a, t * t + hd * t);  // dP, then dS in place
    T* vt = ds + t * t;                     // V^T
    for (int64_t bh = begin; bh < end; ++bh) {
      const HeadOffsets o = head_offsets(a, bh);
      const T* q = qkv + o.q;
      const T* k = q + d;
      const T* v = q + 2 * d;
      const T* p = probs + o.p;
      const T* dy = dys + o.y;
      T* dq = dqkv + o.q;
      T* dk = dq + d;
      T* dv = dq + 2 * d;
      small_gemm(t, hd, t, p, 1, t, dy, d, dv, 3 * d, upper_k);  // dV = P^T dY
      transpose(t, hd, v, 3 * d, vt);
      small_gemm(t, t, hd, dy, d, 1, vt, t, ds, t, lower_n);  // dP = dY V^T
      for (int64_t i = 0; i < t; ++i) {
        const int64_t n = allowed(a, i);
        Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>> pr(p + i * t, n);
        Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> r(ds + i * t, n);
        const T dot = (pr * r).sum();
        r = scale * pr * (r - dot);
        std::fill(ds + i * t + n, ds + (i + 1) * t, T(0));
      }
      small_gemm(t, hd, t, ds, t, 1, k, 3 * d, dq, 3 * d, lower_k);  // dQ = dS K
      small_gemm(t, hd, t, ds, 1, t, q, 3 * d, dk, 3 * d, upper_k);  // dK = dS^T Q
    }
  });
}

const bool kRegistered = [] {
  op_self_attention.set(DeviceType::CPU, DType::F32, self_attention_forward_cpu<float>);
  op_self_attention.set(DeviceType::CPU, DType::F64, self_attention_forward_cpu<double>);
  op_self_attention_backward.set(DeviceType::CPU, DType::F32, self_attention_backward_cpu<float>);
  op_self_attention_backward.set(DeviceType::CPU, DType::F64, self_attention_backward_cpu<double>);
  return true;
}();

}  // namespace
}  // namespace frugal
