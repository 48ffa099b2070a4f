// CPU kernels of the fused self-attention (op_self_attention, formulas in core/op_table.h). The heads run in
// parallel, one head's matrices at a time on one thread: its q, k, v are read in place from the packed qkv
// rows (no head split copies), its output is written in place into the merged [B, T, H * hd] rows (no merge
// copy), and each head's T x T products are small enough to stay in L1/L2. The per-head products are small
// register-blocked loops that skip the blocks a causal mask zeroes (bf16 ones on VDPBF16PS where the CPU has
// it: Note [the attention's products in bf16]). The reference is the composite of matmul,
// attention_scores_softmax and views (nn::functional::self_attention_composite).
#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/error.h"
#include "core/op_table_attention.h"
#include "core/parallel.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/register.h"
#include "kernels/cpu/transpose_block.h"
#include "kernels/cpu/vec.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif
// The products of bf16 heads on VDPBF16PS (Note [the attention's products in bf16]); stride / 2 in
// pack_pairs needs the 8 x 8 transposes of transpose_block.h.
#if FRUGAL_BF16_SIMD && defined(__AVX512BW__) && FRUGAL_TRANSPOSE_AVX
#define FRUGAL_ATTENTION_BF16_DOT 1
#endif

namespace frugal {
namespace {

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

struct Range {           // the bounds of a causal product; the defaults give the whole product
  bool lower_k = false;  // c <= i: k ends after row i (A lower triangular)
  bool upper_k = false;  // c >= i: k starts at row i (A upper triangular)
  bool lower_n = false;  // j <= i: columns end after row i (C's lower triangle wanted)
};

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

// S = Q K^T of one head into p [t, t] (rows of q `in` apart; kt: scratch [hd, t] for K^T, so that the rows of
// S come from rows of K^T). Causal: the blocks right of the diagonal are skipped.
template <typename C>
void head_scores(const SelfAttentionArgs& a, const C* q, const C* k, int64_t in, C* p, C* kt) {
  Range lower_n;
  lower_n.lower_n = a.causal;
  transpose(a.t, a.head_dim, k, in, kt);
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
inline __mmask16 first_lanes(int64_t count) {
  return count >= 16 ? __mmask16(0xffff) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}

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
  transpose(t, hd, v, in, vt);
  small_gemm(t, t, hd, dy, out, 1, vt, t, ds, t, lower_n);  // dP = dY V^T, then dS in place
  for (int64_t i = 0; i < t; ++i) softmax_backward_row(p + i * t, ds + i * t, allowed(a, i), t, scale);
  small_gemm(t, hd, t, ds, t, 1, k, in, dq, in, lower_k);  // dQ = dS K
  small_gemm(t, hd, t, ds, 1, t, q, in, dk, in, upper_k);  // dK = dS^T Q
}

#if FRUGAL_ATTENTION_BF16_DOT
// Note [the attention's products in bf16]: with bf16 operands and a CPU with AVX512_BF16, a head's seven
// products (S = Q K^T, in the forward and again in the stats forms' backward; Y = P V; dV = P^T dY,
// dP = dY V^T, dQ = dS K, dK = dS^T Q) run on VDPBF16PS: 32 products of bf16 pairs summed into 16 f32
// lanes per instruction, twice the f32 FMA's rate. The f32 path converted q, k, v, dy to f32 and ran
// everything in f32; here:
// - q, k, v and dy are read where they lie in the packed rows, as bf16. Only the softmax and dS = s P (dP -
//   rowsum(dP P)) stay in f32, on the f32 S and dP the products return.
// - P and dS are rounded to bf16 to be multiplied (as PyTorch's bf16 attention does; the composite rounds
//   them too): one relative rounding of 2^-9 per entry, within the bf16 tolerance the results are tested
//   to. Every form (probs, low probs, stats) rounds the same P, so their y and gradients stay equal.
// - An operand's pairs along the summed dimension must sit side by side. A row-major operand has them
//   (q, dy, the rounded P and dS: their element (r, c) at r * row + c); K^T and V^T as the right operand are
//   K's and V's rows read as 32-bit pairs and transposed (pack_pairs); every other operand is interleaved,
//   rows 2p and 2p + 1 zipped into pair row p (interleave_rows), and a transposed left operand (P^T, dS^T)
//   is P's or dS's interleaving read with its pair and row strides exchanged.
// - VDPBF16PS treats bf16 subnormal inputs as 0 and flushes subnormal sums: products below 2^-126 are
//   lost, far under what bf16 data can resolve here.
// Odd head sizes take the f32 path (q's and dy's pairs would run past a row). Tested
// (tests/nn/test_self_attention.cpp): y against a naive forward in double that rounds P the same way, the
// gradients against the f32 kernels', every form against the composite. W3's attention (bf16, 2 threads):
// forward 510 -> 280-300 us, backward 875 -> 560-590 us.
namespace bf16dot {

inline __m512bh as_bh(__m512i x) {
  __m512bh r;
  std::memcpy(&r, &x, sizeof(r));
  return r;
}

inline uint32_t load_pair(const uint16_t* p) {
  uint32_t r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}

// v's lanes in m to c: as floats, or rounded to bf16 (Out = uint16_t). VDPBF16PS flushes subnormal sums,
// so v holds none, and VCVTNEPS2BF16 rounds it as core/half.h does (cpu::f32x16_to_bf16).
template <typename Out>
inline void store_lanes(Out* c, __mmask16 m, __m512 v) {
  if constexpr (std::is_same_v<Out, float>)
    _mm512_mask_storeu_ps(c, m, v);
  else
    _mm256_mask_storeu_epi16(c, m, cpu::f32x16_to_bf16(v));
}

// An MR x 32 block of C (rows crs apart; nr <= 32 columns stored; f32, or bf16 bits rounded from the f32
// sums) = A B over pairs [p0, p1): A's element (r, 2p + h) at a[r * a_row + p * a_pair + h], B's pair row p
// at b + p * brs (u32).
template <int MR, typename Out>
void block(int64_t nr, int64_t p0, int64_t p1, const uint16_t* a, int64_t a_row, int64_t a_pair,
           const uint32_t* b, int64_t brs, Out* c, int64_t crs) {
  const __mmask16 m0 = first_lanes(nr), m1 = first_lanes(nr - 16);
  __m512 lo[MR], hi[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  for (int64_t p = p0; p < p1; ++p) {
    const __m512bh b0 = as_bh(_mm512_maskz_loadu_epi32(m0, b + p * brs));
    const __m512bh b1 = as_bh(_mm512_maskz_loadu_epi32(m1, b + p * brs + 16));
    const uint16_t* ap = a + p * a_pair;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512bh av = as_bh(_mm512_set1_epi32(int32_t(load_pair(ap + r * a_row))));
      lo[r] = _mm512_dpbf16_ps(lo[r], av, b0);
      hi[r] = _mm512_dpbf16_ps(hi[r], av, b1);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    store_lanes(c + r * crs, m0, lo[r]);
    store_lanes(c + r * crs + 16, m1, hi[r]);
  }
}

// block<mr> for mr = 1..8, by mr - 1.
template <typename Out>
using BlockFn = void (*)(int64_t, int64_t, int64_t, const uint16_t*, int64_t, int64_t, const uint32_t*,
                         int64_t, Out*, int64_t);
template <typename Out>
constexpr BlockFn<Out> kBlocks[8] = {block<1, Out>, block<2, Out>, block<3, Out>, block<4, Out>,
                                     block<5, Out>, block<6, Out>, block<7, Out>, block<8, Out>};

// C [m, n] = A [m, k] B [k, n] with A as block()'s and B interleaved (u32 [ceil(k / 2), n], rows brs
// apart); C f32, or bf16 (Out = uint16_t: the head's results, written in place). `range` skips what a
// causal mask zeroes, as small_gemm's. With lower_k an odd k1 takes the pair (k1 - 1, k1): A's element k1
// of those rows is 0 (past the diagonal), and B has the row.
template <typename Out>
void gemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_row, int64_t a_pair,
          const uint32_t* b, int64_t brs, Out* c, int64_t crs, Range range = {}) {
  constexpr int64_t MR = 8, NR = 32;
  for (int64_t i = 0; i < m; i += MR) {
    const int64_t mr = std::min(MR, m - i), last = i + mr - 1;
    const int64_t k0 = range.upper_k ? std::min(i, k) : 0, k1 = range.lower_k ? std::min(last + 1, k) : k;
    const int64_t p0 = k0 / 2, p1 = (k1 + 1) / 2;  // i is even: k0 starts a pair
    const int64_t n1 = range.lower_n ? std::min((last + NR) / NR * NR, n) : n;
    for (int64_t j = 0; j < n1; j += NR)
      kBlocks<Out>[mr - 1](std::min(NR, n1 - j), p0, p1, a + i * a_row, a_row, a_pair, b + j, brs,
                           c + i * crs + j, crs);
  }
}

// The pair rows of src [rows, cols] (bf16 bits, rows `stride` apart): dst[p * cols + j] = src[2p][j] |
// src[2p + 1][j] << 16, p < ceil(rows / 2), the second of an odd last row's pair 0.
inline void interleave_rows(const uint16_t* src, int64_t stride, int64_t rows, int64_t cols, uint32_t* dst) {
  // zip[2q] = q, zip[2q + 1] = 32 + q: element q of the first row, then of the second.
  alignas(64) static const std::array<uint16_t, 32> zip = [] {
    std::array<uint16_t, 32> z{};
    for (int q = 0; q < 16; ++q) z[size_t(2 * q)] = uint16_t(q), z[size_t(2 * q + 1)] = uint16_t(32 + q);
    return z;
  }();
  const __m512i order = _mm512_load_si512(zip.data());
  for (int64_t p = 0; 2 * p < rows; ++p) {
    const uint16_t* r0 = src + 2 * p * stride;
    const uint16_t* r1 = r0 + stride;
    const bool second = 2 * p + 1 < rows;
    for (int64_t j = 0; j < cols; j += 16) {
      const __mmask16 k = first_lanes(cols - j);
      const __m512i x = _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(k, r0 + j));
      const __m512i y =
          _mm512_castsi256_si512(second ? _mm256_maskz_loadu_epi16(k, r1 + j) : _mm256_setzero_si256());
      _mm512_mask_storeu_epi32(dst + p * cols + j, k, _mm512_permutex2var_epi16(x, order, y));
    }
  }
}

// rows x cols of f32 src (rows `stride` apart) rounded to bf16 rows of dst (rows dst_stride apart), as
// core/half.h rounds (cpu::from_f32); a pad column (dst_stride > cols) is set to 0.
inline void round_rows(const float* src, int64_t stride, int64_t rows, int64_t cols, uint16_t* dst,
                       int64_t dst_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    cpu::from_f32(src + r * stride, reinterpret_cast<BFloat16*>(dst + r * dst_stride), cols);
    if (dst_stride > cols) dst[r * dst_stride + cols] = 0;
  }
}

// interleave_rows of f32 src [rows, cols] (rows `stride` apart) rounded to bf16 as round_rows does.
inline void interleave_rows_f32(const float* src, int64_t stride, int64_t rows, int64_t cols, uint32_t* dst) {
  for (int64_t p = 0; 2 * p < rows; ++p) {
    const float* r0 = src + 2 * p * stride;
    const float* r1 = r0 + stride;
    const bool second = 2 * p + 1 < rows;
    uint32_t* out = dst + p * cols;
    int64_t j = 0;
    for (; j + 16 <= cols; j += 16) {
      const __m512 x = _mm512_loadu_ps(r0 + j), y = second ? _mm512_loadu_ps(r1 + j) : _mm512_setzero_ps();
      if (cpu::bf16_flushes(x) | cpu::bf16_flushes(y)) break;  // subnormals: the scalar rounding below
      const __m512i lo = _mm512_cvtepu16_epi32(cpu::f32x16_to_bf16(x));
      const __m512i hi = _mm512_cvtepu16_epi32(cpu::f32x16_to_bf16(y));
      _mm512_storeu_si512(out + j, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
    for (; j < cols; ++j)
      out[j] = uint32_t(BFloat16(r0[j]).bits) | (second ? uint32_t(BFloat16(r1[j]).bits) << 16 : 0u);
  }
}

// K's (or V's) rows [t, hd] (rows `stride` apart, hd even) as the right operand of a product with K^T:
// dst[p * t + j] = the pair (K[j][2p], K[j][2p + 1]), p < hd / 2: the 32-bit pairs transposed, 8 x 8 at a
// time.
inline void pack_pairs(const uint16_t* src, int64_t stride, int64_t t, int64_t hd, uint32_t* dst) {
  const int64_t pairs = hd / 2;
  int64_t j = 0;
  for (; j + 8 <= t; j += 8) {
    int64_t p = 0;
    for (; p + 8 <= pairs; p += 8) {
      // 8 rows of 8 pairs, rows stride / 2 pairs apart (stride is even: the packed rows' 3 d), as floats
      // (the transpose only moves bits).
      __m256 c[8];
      cpu::transpose8x8_load(reinterpret_cast<const float*>(src + j * stride + 2 * p), stride / 2, c);
      for (int q = 0; q < 8; ++q) _mm256_storeu_ps(reinterpret_cast<float*>(dst + (p + q) * t + j), c[q]);
    }
    for (; p < pairs; ++p)
      for (int i = 0; i < 8; ++i) dst[p * t + j + i] = load_pair(src + (j + i) * stride + 2 * p);
  }
  for (; j < t; ++j)
    for (int64_t p = 0; p < pairs; ++p) dst[p * t + j] = load_pair(src + j * stride + 2 * p);
}

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

}  // namespace bf16dot
#endif

// rows x cols of src (rows `stride` apart) to contiguous dst, converted; and back.
template <typename To, typename From>
void copy_rows(int64_t rows, int64_t cols, const From* src, int64_t src_stride, To* dst, int64_t dst_stride) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * dst_stride + c] = To(src[r * src_stride + c]);
}

// Asks for the cache lines of `rows` rows of `cols` elements, `stride` elements apart: the next head's
// operands, fetched while this head computes (they are strided rows of a large tensor, which the hardware
// prefetchers follow late).
template <typename T>
inline void prefetch_rows(const T* p, int64_t rows, int64_t cols, int64_t stride) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; c += 64 / int64_t(sizeof(T))) __builtin_prefetch(p + r * stride + c);
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
        for (int w = 0; w < 3; ++w) prefetch_rows(qkv + next.q + w * d, t, hd, 3 * d);
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
          bf16dot::head_forward(a, q16, q16 + d, q16 + 2 * d, 3 * d, p, reinterpret_cast<uint16_t*>(ys + o.y),
                                d, kt, head_stats, low);
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
            bf16dot::head_scores(a, q16, q16 + d, 3 * d, pa, reinterpret_cast<uint32_t*>(vt));
          });
          bf16dot::head_backward(a, q16, q16 + d, q16 + 2 * d, 3 * d, p16,
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
