// CPU kernels of the fused self-attention (op_self_attention, formulas in core/op_table.h). The heads run in
// parallel, one head's matrices at a time on one thread: its q, k, v are read in place from the packed qkv
// rows (no head split copies), its output is written in place into the merged [B, T, H * hd] rows (no merge
// copy), and each head's T x T products are small enough to stay in L1/L2. The per-head products are small
// register-blocked loops that skip the blocks a causal mask zeroes (bf16 ones on VDPBF16PS where the CPU has
// it: Note [the attention's products in bf16] in attention_bf16.h). The reference is the composite of matmul,
// attention_scores_softmax and views (nn::functional::self_attention_composite).
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/error.h"
#include "core/op_table_attention.h"
#include "core/parallel.h"
#include "kernels/cpu/attention_bf16.h"
#include "kernels/cpu/register.h"
#include "kernels/cpu/transpose_block.h"
#include "kernels/cpu/vec.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace frugal {
namespace {

using cpu::Range;
#if defined(__AVX512F__)
using cpu::first_lanes;
#endif

// C = A B for one head's small matrices, with A m x k read through strides (ars, acs) (so a transposed
// operand costs nothing), B k x n with unit column stride and rows brs apart, C m x n with rows crs apart.
// For a block of rows [i, i + MR), c runs over the whole k, or only up to row i + MR - 1 (lower_k) or from
// row i on (upper_k), and columns stop at the first block of NR past row i + MR - 1 (lower_n): how a causal
// product skips what the mask zeroes. Register blocking of MR
// rows by NR columns (two vectors) kept in registers; Eigen's general product spends most of its time packing
// at these sizes (64 x 64 x 32 per head in W3) and cannot skip blocks.
// A full MR x NR block: 2 x MR vector accumulators (GCC/Clang vector types, so they stay in registers; a
// zero-initialised array would live in memory), one broadcast of A and two loads of B per row and step.
// A vector is one register of the widest kind the target has (kernels/cpu/vec.h).
using cpu::kLanes;
using cpu::Vec;

// x in every lane: x - 0 is x for every x (V{} + x is not: the compiler must keep that add for the sign of
// zero), so this compiles to one broadcast.
template <typename T>
inline Vec<T> splat(T x) {
  return x - Vec<T>{};
}

template <typename T, int MR>
inline void gemm_block_full(int64_t k0, int64_t k1, const T* a, int64_t ars, int64_t acs, const T* b,
                            int64_t brs, T* c, int64_t crs) {
  using V = Vec<T>;
  constexpr int L = kLanes<T>;
  V lo[MR], hi[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) lo[r] = hi[r] = V{};
  for (int64_t p = k0; p < k1; ++p) {
    V b0, b1;
    std::memcpy(&b0, b + p * brs, sizeof(V));
    std::memcpy(&b1, b + p * brs + L, sizeof(V));
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const V av = splat<T>(a[r * ars + p * acs]);
      lo[r] += av * b0;
      hi[r] += av * b1;
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    std::memcpy(c + r * crs, &lo[r], sizeof(V));
    std::memcpy(c + r * crs + L, &hi[r], sizeof(V));
  }
}

// Any block up to MR x NR (the edges): plain loops.
template <typename T, int MR, int NR>
inline void gemm_block(int64_t mr, int64_t nr, int64_t k0, int64_t k1, const T* a, int64_t ars, int64_t acs,
                       const T* b, int64_t brs, T* c, int64_t crs) {
  if (mr == MR && nr == NR) return gemm_block_full<T, MR>(k0, k1, a, ars, acs, b, brs, c, crs);
  T acc[MR][NR] = {};
  for (int64_t p = k0; p < k1; ++p)
    for (int64_t r = 0; r < mr; ++r) {
      const T av = a[r * ars + p * acs];
      for (int64_t j = 0; j < nr; ++j) acc[r][j] += av * b[p * brs + j];
    }
  for (int64_t r = 0; r < mr; ++r)
    for (int64_t j = 0; j < nr; ++j) c[r * crs + j] = acc[r][j];
}

template <typename T, int MR = 8, int NR = 2 * kLanes<T>>
void small_gemm(int64_t m, int64_t n, int64_t k, const T* a, int64_t ars, int64_t acs, const T* b,
                int64_t brs, T* c, int64_t crs, Range range = {}) {
  for (int64_t i = 0; i < m; i += MR) {
    const int64_t mr = std::min<int64_t>(MR, m - i), last = i + mr - 1;
    const int64_t k0 = range.upper_k ? std::min(i, k) : 0, k1 = range.lower_k ? std::min(last + 1, k) : k;
    // Whole blocks of NR columns (the fast path); the few extra entries left of the diagonal are masked
    // later.
    const int64_t n1 = range.lower_n ? std::min((last + NR) / NR * NR, n) : n;
    for (int64_t j = 0; j < n1; j += NR)
      gemm_block<T, MR, NR>(mr, std::min<int64_t>(NR, n1 - j), k0, k1, a + i * ars, ars, acs, b + j, brs,
                            c + i * crs + j, crs);
  }
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

// S = Q K^T of one head into p [t, t] (rows of q `in` apart; kt: scratch [hd, t] for K^T, so that the rows of
// S come from rows of K^T). Causal: the blocks right of the diagonal are skipped.
template <typename C>
void head_scores(const SelfAttentionArgs& a, const C* q, const C* k, int64_t in, C* p, C* kt) {
  Range lower_n;
  lower_n.lower_n = a.causal;
  // In 8 x 8 blocks in registers for f32 (one element at a time, the K and V transposes took about a
  // millisecond of a W3 step on a Xeon: each store 4 t bytes from the last).
  cpu::transpose_tile(k, in, kt, a.t, 0, a.t, 0, a.head_dim);
  small_gemm(a.t, a.t, a.head_dim, q, in, 1, kt, a.t, p, a.t, lower_n);
}

// Row i of S (in p, rows t apart) into P: exp(scale s - m) over the allowed keys, times 1 / l, their sum; 0
// past them. Every row's (m, 1 / l) goes to `save` when it is given (the stats forms' forward), or comes from
// `load` (their backward: the same operations on the same S give the same P bit for bit).
template <typename C>
void softmax_rows_eigen(const SelfAttentionArgs& a, C* p, C* save, const C* load) {
  const int64_t t = a.t;
  const C scale = C(a.scale);
  for (int64_t i = 0; i < t; ++i) {
    C* row = p + i * t;
    const int64_t n = allowed(a, i);
    Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>> r(row, n);
    // max(scale x) is scale max(x) for scale > 0 and scale min(x) otherwise.
    const C m = load ? load[2 * i] : scale >= 0 ? scale * r.maxCoeff() : scale * r.minCoeff();
    // exp over whole vectors: past n (masked, but computed by the product's last column block) the values
    // are thrown away below; a partial vector would go through the scalar exp, element by element.
    const int64_t whole = std::min(t, (n + kLanes<C> - 1) / kLanes<C> * kLanes<C>);
    Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>> rw(row, whole);
    rw = (rw * scale - m).exp();
    const C inv = load ? load[2 * i + 1] : C(1) / r.sum();
    r *= inv;
    std::fill(row + n, row + t, C(0));
    if (save) {
      save[2 * i] = m;
      save[2 * i + 1] = inv;
    }
  }
}

#if defined(__AVX512F__)
// Note [a causal row's softmax in vectors]: a causal row of n <= T keys is short (1 to 64 in W3) and of
// every length, and Eigen runs the part of it before the first aligned element and after the last whole
// vector one element at a time (maxCoeff, sum, the scaling): that took about 19% of a head. Here every pass
// runs in 16-lane vectors from the row's start, the last one masked: the max, exp(scale s - m) (Eigen's
// vector exp, pexp, on every lane; a masked lane's value is never stored or summed), its sum (one vector
// accumulator, its lanes added as a tree), and the scaling. The order depends on n alone, so a row gives the
// same P wherever it lies (the stats forms' backward recomputes P in scratch).
inline void softmax_rows_avx512(const SelfAttentionArgs& a, float* p, float* save, const float* load) {
  const int64_t t = a.t;
  const float scale = float(a.scale);
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < t; ++i) {
    float* row = p + i * t;
    const int64_t n = allowed(a, i);
    float m;
    if (load) {
      m = load[2 * i];
    } else {
      // max(scale x) is scale max(x) for scale > 0 and scale min(x) otherwise.
      const bool up = scale >= 0;
      __m512 acc = _mm512_set1_ps(up ? -std::numeric_limits<float>::infinity()
                                     : std::numeric_limits<float>::infinity());
      for (int64_t j = 0; j < n; j += 16) {
        const __m512 x = _mm512_mask_loadu_ps(acc, first_lanes(n - j), row + j);
        acc = up ? _mm512_max_ps(acc, x) : _mm512_min_ps(acc, x);
      }
      m = scale * (up ? _mm512_reduce_max_ps(acc) : _mm512_reduce_min_ps(acc));
    }
    const __m512 vm = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 k = first_lanes(n - j);
      const __m512 e =
          Eigen::internal::pexp(_mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + j), vscale), vm));
      _mm512_mask_storeu_ps(row + j, k, e);
      sum = _mm512_mask_add_ps(sum, k, sum, e);
    }
    const float inv = load ? load[2 * i + 1] : 1.0f / _mm512_reduce_add_ps(sum);
    const __m512 vinv = _mm512_set1_ps(inv);
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 k = first_lanes(n - j);
      _mm512_mask_storeu_ps(row + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + j), vinv));
    }
    std::fill(row + n, row + t, 0.0f);
    if (save) {
      save[2 * i] = m;
      save[2 * i + 1] = inv;
    }
  }
}
#endif

template <typename C>
void softmax_rows(const SelfAttentionArgs& a, C* p, C* save, const C* load) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<C, float>) return softmax_rows_avx512(a, p, save, load);
#endif
  softmax_rows_eigen(a, p, save, load);
}

// Row i of dP (ds, t elements) into dS = scale P (dP - sum(P dP)) over the n allowed keys, 0 past them.
template <typename C>
[[gnu::noinline]] void softmax_backward_row(const C* p, C* ds, int64_t n, int64_t t, C scale) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<C, float>) {
    // In vectors from the row's start, the last one masked (Note [a causal row's softmax in vectors]).
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 k = first_lanes(n - j);
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, p + j), _mm512_maskz_loadu_ps(k, ds + j), acc);
    }
    const __m512 dot = _mm512_set1_ps(_mm512_reduce_add_ps(acc)), vscale = _mm512_set1_ps(scale);
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 k = first_lanes(n - j);
      const __m512 sp = _mm512_mul_ps(vscale, _mm512_maskz_loadu_ps(k, p + j));
      _mm512_mask_storeu_ps(ds + j, k,
                            _mm512_mul_ps(sp, _mm512_sub_ps(_mm512_maskz_loadu_ps(k, ds + j), dot)));
    }
    std::fill(ds + n, ds + t, 0.0f);
    return;
  }
#endif
  Eigen::Map<const Eigen::Array<C, Eigen::Dynamic, 1>> pr(p, n);
  Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>> r(ds, n);
  const C dot = (pr * r).sum();
  r = scale * pr * (r - dot);
  std::fill(ds + n, ds + t, C(0));
}

// One head in the compute type C: q, k, v [t, hd] with rows `in` apart, y [t, hd] with rows `out` apart,
// p [t, t]; kt: scratch [hd, t]; stats: [t, 2] for the stats forms, else null.
template <typename C>
void head_forward(const SelfAttentionArgs& a, const C* q, const C* k, const C* v, int64_t in, C* p, C* y,
                  int64_t out, C* kt, C* stats) {
  Range lower_k;
  lower_k.lower_k = a.causal;
  head_scores(a, q, k, in, p, kt);
  softmax_rows<C>(a, p, stats, nullptr);
  small_gemm(a.t, a.head_dim, a.t, p, a.t, 1, v, in, y, out, lower_k);  // Y = P V
}

// One head's gradients in the compute type: dq, dk, dv [t, hd] with rows `in` apart (as q, k, v), dy with
// rows `out` apart (as y); scratch ds [t, t] and vt [hd, t].
template <typename C>
void head_backward(const SelfAttentionArgs& a, const C* q, const C* k, const C* v, int64_t in, const C* p,
                   const C* dy, int64_t out, C* dq, C* dk, C* dv, C* ds, C* vt) {
  const int64_t t = a.t, hd = a.head_dim;
  const C scale = C(a.scale);
  Range lower_n, lower_k, upper_k;
  lower_n.lower_n = lower_k.lower_k = upper_k.upper_k = a.causal;
  small_gemm(t, hd, t, p, 1, t, dy, out, dv, in, upper_k);  // dV = P^T dY
  cpu::transpose_tile(v, in, vt, t, 0, t, 0, hd);           // vt [hd, t]
  small_gemm(t, t, hd, dy, out, 1, vt, t, ds, t, lower_n);  // dP = dY V^T, then dS in place
  for (int64_t i = 0; i < t; ++i) softmax_backward_row(p + i * t, ds + i * t, allowed(a, i), t, scale);
  small_gemm(t, hd, t, ds, t, 1, k, in, dq, in, lower_k);  // dQ = dS K
  small_gemm(t, hd, t, ds, 1, t, q, in, dk, in, upper_k);  // dK = dS^T Q
}

#if FRUGAL_ATTENTION_BF16_DOT
// Note [the attention's products in bf16] (kernels/cpu/attention_bf16.h): one bf16 head's forward and
// backward on its products.
namespace bf16_head {

using namespace cpu::bf16dot;

// S = Q K^T of one bf16 head into p [t, t] (f32); kp: scratch [hd / 2, t] u32 for K's pairs.
inline void head_scores(const SelfAttentionArgs& a, const uint16_t* q, const uint16_t* k, int64_t in,
                        float* p, uint32_t* kp) {
  Range lower_n;
  lower_n.lower_n = a.causal;
  pack_pairs(k, in, a.t, a.head_dim, kp);
  gemm(a.t, a.t, a.head_dim, q, in, 2, kp, a.t, p, a.t, lower_n);
}

// One bf16 head's forward (Note [the attention's products in bf16]): q, k, v [t, hd] bf16 with rows `in`
// apart, y [t, hd] (written in place, rounded) rows `out` apart; p [t, t] f32 (S, then P); stats as
// head_forward's; low_probs: P rounded to bf16 [t, t] (the low-probs forms) or null; w:
// self_attention_bf16_scratch(t, hd, false) floats.
inline void head_forward(const SelfAttentionArgs& a, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                         int64_t in, float* p, uint16_t* y, int64_t out, float* w, float* stats,
                         uint16_t* low_probs) {
  const int64_t t = a.t, hd = a.head_dim, t2 = t + t % 2;
  Range lower_k;
  lower_k.lower_k = a.causal;
  uint32_t* kp = reinterpret_cast<uint32_t*>(w);                 // [hd / 2, t]
  uint32_t* vi = kp + hd / 2 * t;                                // [t2 / 2, hd]
  uint16_t* pb = reinterpret_cast<uint16_t*>(vi + t2 / 2 * hd);  // [t, t2]
  head_scores(a, q, k, in, p, kp);
  softmax_rows<float>(a, p, stats, nullptr);
  round_rows(p, t, t, t, pb, t2);
  interleave_rows(v, in, t, hd, vi);
  gemm(t, hd, t, pb, t2, 2, vi, hd, y, out, lower_k);  // Y = P V, into y
  if (low_probs)
    for (int64_t i = 0; i < t; ++i) std::memcpy(low_probs + i * t, pb + i * t2, size_t(t) * sizeof(uint16_t));
}

// One bf16 head's backward: q, k, v [t, hd] bf16 with rows `in` apart, dy [t, hd] rows `out` apart; p [t, t]
// f32 P; its gradients into dqkv_q (dq's rows, `in` apart, dk and dv d and 2 d on); ds [t, t] f32 scratch;
// w: self_attention_bf16_scratch(t, hd, true) floats.
inline void head_backward(const SelfAttentionArgs& a, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                          int64_t in, const float* p, const uint16_t* dy, int64_t out, uint16_t* dqkv_q,
                          float* ds, float* w) {
  const int64_t t = a.t, hd = a.head_dim, t2 = t + t % 2, d = a.heads * hd;
  Range lower_n, lower_k, upper_k;
  lower_n.lower_n = lower_k.lower_k = upper_k.upper_k = a.causal;
  uint32_t* kp = reinterpret_cast<uint32_t*>(w);  // [hd / 2, t]: K's pairs, then V's
  uint32_t* dyi = kp + hd / 2 * t;                // [t2 / 2, hd] each
  uint32_t* ki = dyi + t2 / 2 * hd;
  uint32_t* qi = ki + t2 / 2 * hd;
  uint32_t* pi = qi + t2 / 2 * hd;  // [t2 / 2, t] each
  uint32_t* dsi = pi + t2 / 2 * t;
  uint16_t* dsb = reinterpret_cast<uint16_t*>(dsi + t2 / 2 * t);  // [t, t2]
  // dV = P^T dY: P's pair rows (over the queries) read as P^T's pairs along its rows.
  interleave_rows_f32(p, t, t, t, pi);
  interleave_rows(dy, out, t, hd, dyi);
  gemm(t, hd, t, reinterpret_cast<const uint16_t*>(pi), 2, 2 * t, dyi, hd, dqkv_q + 2 * d, in, upper_k);
  pack_pairs(v, in, t, hd, kp);
  gemm(t, t, hd, dy, out, 2, kp, t, ds, t, lower_n);  // dP = dY V^T, then dS in place
  for (int64_t i = 0; i < t; ++i)
    softmax_backward_row(p + i * t, ds + i * t, allowed(a, i), t, float(a.scale));
  round_rows(ds, t, t, t, dsb, t2);
  interleave_rows_f32(ds, t, t, t, dsi);
  interleave_rows(k, in, t, hd, ki);
  gemm(t, hd, t, dsb, t2, 2, ki, hd, dqkv_q, in, lower_k);  // dQ = dS K
  interleave_rows(q, in, t, hd, qi);
  gemm(t, hd, t, reinterpret_cast<const uint16_t*>(dsi), 2, 2 * t, qi, hd, dqkv_q + d, in,
       upper_k);  // dK = dS^T Q
}

}  // namespace bf16_head
#endif

// rows x cols of src (rows `stride` apart) to contiguous dst, converted; and back.
template <typename To, typename From>
void copy_rows(int64_t rows, int64_t cols, const From* src, int64_t src_stride, To* dst, int64_t dst_stride) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * dst_stride + c] = To(src[r * src_stride + c]);
}

// The first element at or after `from` (at most kLanes - 1 on) that sits where element `index` of a
// vector-aligned array would, relative to the vector width. Eigen runs the unaligned head of a row through
// scalar code (exp included, whose last bit differs from the vector exp's), so a head's P computed in scratch
// matches the P computed in place only at the same alignment.
template <typename C>
C* aligned_as(C* from, int64_t index) {
  constexpr int64_t L = kLanes<C>;
  const int64_t e = int64_t(reinterpret_cast<uintptr_t>(from) / sizeof(C));
  return from + ((index - e) % L + L) % L;
}

// What a forward keeps for its backward: P in the compute type, P in the 16-bit dtype (the low-probs forms),
// or each row's (m, 1 / l) (the stats forms; Note [attention keeps row statistics]).
enum class Keep { kProbs, kLowProbs, kStats };

// qkv: [B, T, 3, H, hd] (T); probs: [B, H, T, T] (C, or T with kLowProbs; none with kStats); stats: [B, H,
// T, 2] (C, kStats); y: [B, T, H, hd] (T); workspace: [threads, hd * T] (C), plus 4 T hd when T is not C
// (q, k, v, y converted), plus T * T + 64 unless kProbs (P in scratch)
template <typename T, Keep kKeep = Keep::kProbs>
void self_attention_forward_cpu(const SelfAttentionArgs& a) {
  using C = acc_t<T>;
  using P = std::conditional_t<kKeep == Keep::kLowProbs, T, C>;
  const T* qkv = static_cast<const T*>(a.qkv);
  P* probs = static_cast<P*>(a.probs);
  C* stats = static_cast<C*>(a.stats);
  T* ys = static_cast<T*>(a.y);
  const int64_t t = a.t, hd = a.head_dim, d = a.heads * hd;
  constexpr bool convert = !std::is_same_v<T, C>;
  static_assert(convert || kKeep != Keep::kLowProbs, "probs are kept in a 16-bit dtype only");
  const int64_t area = self_attention_workspace(a, dtype_v<T>, false);  // P in scratch after it
  parallel_for(0, a.batch * a.heads, 1, [&](int64_t begin, int64_t end) {
    C* kt = scratch<C>(a, self_attention_workspace(a, dtype_v<T>, false, kKeep != Keep::kProbs));
    for (int64_t bh = begin; bh < end; ++bh) {
      const HeadOffsets o = head_offsets(a, bh);
      if (bh + 1 < end) {
        const HeadOffsets next = head_offsets(a, bh + 1);
        for (int w = 0; w < 3; ++w) cpu::prefetch_rows(qkv + next.q + w * d, t, hd, 3 * d);
      }
      C* head_stats = kKeep == Keep::kStats ? stats + bh * t * 2 : nullptr;
      // P in scratch where op_self_attention's f32 probs have it (aligned_as), or in probs.
      C* p = kKeep == Keep::kProbs ? reinterpret_cast<C*>(probs) + o.p : aligned_as(kt + area, o.p);
#if FRUGAL_ATTENTION_BF16_DOT
      if constexpr (std::is_same_v<T, BFloat16>) {
        if (hd % 2 == 0) {
          const uint16_t* q16 = reinterpret_cast<const uint16_t*>(qkv + o.q);
          uint16_t* low = nullptr;
          if constexpr (kKeep == Keep::kLowProbs) low = reinterpret_cast<uint16_t*>(probs + o.p);
          bf16_head::head_forward(a, q16, q16 + d, q16 + 2 * d, 3 * d, p,
                                  reinterpret_cast<uint16_t*>(ys + o.y), d, kt, head_stats, low);
          continue;
        }
      }
#endif
      if constexpr (convert) {
        C* q = kt + hd * t;
        C *k = q + t * hd, *v = k + t * hd, *y = v + t * hd;
        copy_rows(t, hd, qkv + o.q, 3 * d, q, hd);
        copy_rows(t, hd, qkv + o.q + d, 3 * d, k, hd);
        copy_rows(t, hd, qkv + o.q + 2 * d, 3 * d, v, hd);
        head_forward<C>(a, q, k, v, hd, p, y, hd, kt, head_stats);
        if constexpr (kKeep == Keep::kLowProbs) copy_rows(t, t, p, t, probs + o.p, t);  // rounded
        copy_rows(t, hd, y, hd, ys + o.y, d);
      } else {
        head_forward<C>(a, qkv + o.q, qkv + o.q + d, qkv + o.q + 2 * d, 3 * d, p, ys + o.y, d, kt,
                        head_stats);
      }
    }
  });
}

// qkv, dqkv: [B, T, 3, H, hd] (T); probs: [B, H, T, T] (C, or T with kLowProbs; none with kStats); stats:
// [B, H, T, 2] (C, kStats); dy: [B, T, H, hd] (T); workspace: [threads, T * T + hd * T] (C), plus 7 T hd
// when T is not C (q, k, v, dy, dq, dk, dv converted), plus T * T + 64 unless kProbs (P in the compute type)
template <typename T, Keep kKeep = Keep::kProbs>
void self_attention_backward_cpu(const SelfAttentionArgs& a) {
  using C = acc_t<T>;
  using P = std::conditional_t<kKeep == Keep::kLowProbs, T, C>;
  const T* qkv = static_cast<const T*>(a.qkv);
  const P* probs = static_cast<const P*>(a.probs);
  const C* stats = static_cast<const C*>(a.stats);
  const T* dys = static_cast<const T*>(a.dy);
  T* dqkv = static_cast<T*>(a.dqkv);
  const int64_t t = a.t, hd = a.head_dim, d = a.heads * hd;
  constexpr bool convert = !std::is_same_v<T, C>;
  static_assert(convert || kKeep != Keep::kLowProbs, "probs are kept in a 16-bit dtype only");
  const int64_t area = self_attention_workspace(a, dtype_v<T>, true);  // P in scratch after it
  parallel_for(0, a.batch * a.heads, 1, [&](int64_t begin, int64_t end) {
    C* ds = scratch<C>(a, self_attention_workspace(a, dtype_v<T>, true, kKeep != Keep::kProbs));
    C* vt = ds + t * t;
    C* p_scratch = ds + area;
    for (int64_t bh = begin; bh < end; ++bh) {
      const HeadOffsets o = head_offsets(a, bh);
      // P: the kept one, read back from 16 bits, or made again from S, which scores(pa) writes into pa,
      // where the forward had it (aligned_as): vt is free until the head's backward fills it.
      auto probs_of = [&]([[maybe_unused]] auto&& scores) -> const C* {
        if constexpr (kKeep == Keep::kProbs) {
          return probs + o.p;
        } else if constexpr (kKeep == Keep::kLowProbs) {
          copy_rows(t, t, probs + o.p, t, p_scratch, t);
          return p_scratch;
        } else {
          C* pa = aligned_as(p_scratch, o.p);
          scores(pa);
          softmax_rows<C>(a, pa, nullptr, stats + bh * t * 2);
          return pa;
        }
      };
#if FRUGAL_ATTENTION_BF16_DOT
      if constexpr (std::is_same_v<T, BFloat16>) {
        if (hd % 2 == 0) {
          const uint16_t* q16 = reinterpret_cast<const uint16_t*>(qkv + o.q);
          const float* p16 = probs_of([&](float* pa) {
            bf16_head::head_scores(a, q16, q16 + d, 3 * d, pa, reinterpret_cast<uint32_t*>(vt));
          });
          bf16_head::head_backward(a, q16, q16 + d, q16 + 2 * d, 3 * d, p16,
                                   reinterpret_cast<const uint16_t*>(dys + o.y), d,
                                   reinterpret_cast<uint16_t*>(dqkv + o.q), ds, vt);
          continue;
        }
      }
#endif
      const C* q = nullptr;
      const C *k = nullptr, *v = nullptr, *dy = nullptr;
      int64_t in = 3 * d, out = d;
      C *dq = nullptr, *dk = nullptr, *dv = nullptr;
      if constexpr (convert) {
        C* cq = vt + hd * t;
        C *ck = cq + t * hd, *cv = ck + t * hd, *cdy = cv + t * hd;
        copy_rows(t, hd, qkv + o.q, 3 * d, cq, hd);
        copy_rows(t, hd, qkv + o.q + d, 3 * d, ck, hd);
        copy_rows(t, hd, qkv + o.q + 2 * d, 3 * d, cv, hd);
        copy_rows(t, hd, dys + o.y, d, cdy, hd);
        q = cq, k = ck, v = cv, dy = cdy, in = out = hd;
        dq = cdy + t * hd, dk = dq + t * hd, dv = dk + t * hd;
      } else {
        q = qkv + o.q, k = q + d, v = q + 2 * d, dy = dys + o.y;
        dq = dqkv + o.q, dk = dq + d, dv = dq + 2 * d;
      }
      const C* p = probs_of([&](C* pa) { head_scores(a, q, k, in, pa, vt); });
      head_backward<C>(a, q, k, v, in, p, dy, out, dq, dk, dv, ds, vt);
      if constexpr (convert) {
        copy_rows(t, hd, dq, hd, dqkv + o.q, 3 * d);
        copy_rows(t, hd, dk, hd, dqkv + o.q + d, 3 * d);
        copy_rows(t, hd, dv, hd, dqkv + o.q + 2 * d, 3 * d);
      }
    }
  });
}

const bool kRegistered = [] {
  cpu::for_types<float, double, Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_self_attention.set(DeviceType::CPU, dtype_v<T>, self_attention_forward_cpu<T>);
    op_self_attention_backward.set(DeviceType::CPU, dtype_v<T>, self_attention_backward_cpu<T>);
    op_self_attention_stats.set(DeviceType::CPU, dtype_v<T>, self_attention_forward_cpu<T, Keep::kStats>);
    op_self_attention_backward_stats.set(DeviceType::CPU, dtype_v<T>,
                                         self_attention_backward_cpu<T, Keep::kStats>);
  });
  cpu::for_types<Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_self_attention_low_probs.set(DeviceType::CPU, dtype_v<T>,
                                    self_attention_forward_cpu<T, Keep::kLowProbs>);
    op_self_attention_backward_low_probs.set(DeviceType::CPU, dtype_v<T>,
                                             self_attention_backward_cpu<T, Keep::kLowProbs>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
