// CPU kernels of the fused self-attention (op_self_attention, formulas in core/op_table.h). The heads run in
// parallel, one head's matrices at a time on one thread: its q, k, v are read in place from the packed qkv
// rows (no head split copies), its output is written in place into the merged [B, T, H * hd] rows (no merge
// copy), and each head's T x T products are small enough to stay in L2. The per-head products are Eigen's
// (single-threaded inside the parallel loop); a causal P V reads only P's lower triangle. The reference is
// the composite of matmul, attention_scores_softmax and views (nn::functional::self_attention_composite).
#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/op_table.h"
#include "core/parallel.h"

namespace frugal {
namespace {

template <typename C>
using Mat = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename C>
using In = Eigen::Map<const Mat<C>, 0, Eigen::OuterStride<>>;
template <typename C>
using Out = Eigen::Map<Mat<C>, 0, Eigen::OuterStride<>>;

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

// qkv: [B, T, 3, H, hd]; probs: [B, H, T, T]; y: [B, T, H, hd]
template <typename C>
void self_attention_forward_cpu(const SelfAttentionArgs& a) {
  const C* qkv = static_cast<const C*>(a.qkv);
  C* probs = static_cast<C*>(a.probs);
  C* ys = static_cast<C*>(a.y);
  const int64_t t = a.t, hd = a.head_dim, d = a.heads * hd;
  const C scale = C(a.scale);
  parallel_for(0, a.batch * a.heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const HeadOffsets o = head_offsets(a, bh);
      const In<C> q(qkv + o.q, t, hd, Eigen::OuterStride<>(3 * d));
      const In<C> k(qkv + o.q + d, t, hd, Eigen::OuterStride<>(3 * d));
      const In<C> v(qkv + o.q + 2 * d, t, hd, Eigen::OuterStride<>(3 * d));
      Out<C> p(probs + o.p, t, t, Eigen::OuterStride<>(t));
      p.noalias() = q * k.transpose();
      for (int64_t i = 0; i < t; ++i) {
        C* row = p.data() + i * t;
        const int64_t n = allowed(a, i);
        Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>> r(row, n);
        // max(scale x) is scale max(x) for scale > 0 and scale min(x) otherwise.
        const C m = scale >= 0 ? scale * r.maxCoeff() : scale * r.minCoeff();
        r = (r * scale - m).exp();
        r *= C(1) / r.sum();
        std::fill(row + n, row + t, C(0));
      }
      Out<C> y(ys + o.y, t, hd, Eigen::OuterStride<>(d));
      if (a.causal)
        y.noalias() = p.template triangularView<Eigen::Lower>() * v;
      else
        y.noalias() = p * v;
    }
  });
}

// qkv, dqkv: [B, T, 3, H, hd]; probs: [B, H, T, T]; dy: [B, T, H, hd]; workspace: [threads, T, T]
template <typename C>
void self_attention_backward_cpu(const SelfAttentionArgs& a) {
  const C* qkv = static_cast<const C*>(a.qkv);
  const C* probs = static_cast<const C*>(a.probs);
  const C* dys = static_cast<const C*>(a.dy);
  C* dqkv = static_cast<C*>(a.dqkv);
  C* ws = static_cast<C*>(a.workspace);
  const int64_t t = a.t, hd = a.head_dim, d = a.heads * hd;
  const C scale = C(a.scale);
  parallel_for(0, a.batch * a.heads, 1, [&](int64_t begin, int64_t end) {
    const int tid = omp_get_thread_num();
    FRUGAL_ASSERT(tid < a.threads, "self_attention_backward: thread ", tid, " has no workspace (", a.threads,
                  " threads planned)");
    Out<C> ds(ws + tid * t * t, t, t, Eigen::OuterStride<>(t));  // dP, then dS in place
    for (int64_t bh = begin; bh < end; ++bh) {
      const HeadOffsets o = head_offsets(a, bh);
      const In<C> q(qkv + o.q, t, hd, Eigen::OuterStride<>(3 * d));
      const In<C> k(qkv + o.q + d, t, hd, Eigen::OuterStride<>(3 * d));
      const In<C> v(qkv + o.q + 2 * d, t, hd, Eigen::OuterStride<>(3 * d));
      const In<C> p(probs + o.p, t, t, Eigen::OuterStride<>(t));
      const In<C> dy(dys + o.y, t, hd, Eigen::OuterStride<>(d));
      Out<C> dq(dqkv + o.q, t, hd, Eigen::OuterStride<>(3 * d));
      Out<C> dk(dqkv + o.q + d, t, hd, Eigen::OuterStride<>(3 * d));
      Out<C> dv(dqkv + o.q + 2 * d, t, hd, Eigen::OuterStride<>(3 * d));
      if (a.causal)
        dv.noalias() = p.transpose().template triangularView<Eigen::Upper>() * dy;
      else
        dv.noalias() = p.transpose() * dy;
      ds.noalias() = dy * v.transpose();
      for (int64_t i = 0; i < t; ++i) {
        const int64_t n = allowed(a, i);
        Eigen::Map<const Eigen::Array<C, Eigen::Dynamic, 1>> pr(p.data() + i * t, n);
        Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>> r(ds.data() + i * t, n);
        const C dot = (pr * r).sum();
        r = scale * pr * (r - dot);
        std::fill(ds.data() + i * t + n, ds.data() + (i + 1) * t, C(0));
      }
      if (a.causal) {
        dq.noalias() = ds.template triangularView<Eigen::Lower>() * k;
        dk.noalias() = ds.transpose().template triangularView<Eigen::Upper>() * q;
      } else {
        dq.noalias() = ds * k;
        dk.noalias() = ds.transpose() * q;
      }
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
