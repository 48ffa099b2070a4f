// The op tables of one family, with their argument structs. Attention: the fused attention softmax and the
// fused multi-head self-attention (nn/attention.h, kernels/*/attention.*, kernels/cpu/self_attention.cpp).
// The tables themselves are core/op_table.h's OpTable; a family's header is included only by its ops, its
// kernels and their tests, so a new op of one family recompiles only that family.
#pragma once

#include <algorithm>

#include "op_table.h"

namespace frugal {

// Fused attention probabilities over contiguous [rows, T] scores, rows a multiple of T (each T x T matrix
// one head's scores): row r is query i = r % T; with causal, key j is allowed when j <= i, else every j.
//   forward:  y[r, j] = exp(scale x[r, j] - m) / sum_{allowed k} exp(scale x[r, k] - m), m the allowed max;
//             y = 0 where j is not allowed
//   backward: dx[r, j] = scale y[r, j] (dy[r, j] - sum_{allowed k} dy[r, k] y[r, k]); 0 where not allowed
// f16/bf16 compute in f32. Only the allowed prefix of each row is read (nn/attention.h).
struct AttentionSoftmaxArgs {
  const void* x = nullptr;   // forward in
  void* y = nullptr;         // forward out, backward in
  const void* dy = nullptr;  // backward in
  void* dx = nullptr;        // backward out
  int64_t rows = 0, t = 0;
  double scale = 1;
  bool causal = false;
};
using AttentionSoftmaxKernel = void(const AttentionSoftmaxArgs& args);
extern OpTable<AttentionSoftmaxKernel> op_attention_softmax;
extern OpTable<AttentionSoftmaxKernel> op_attention_softmax_backward;

// Fused multi-head self-attention over q, k, v packed as one [B, T, 3, H, hd] tensor (the output of one
// Linear d -> 3d, nn/attention.h), per head (b, h), with scale s and, when causal, key j allowed for query i
// only when j <= i:
//   forward:  P = softmax(s Q K^T) over the allowed keys (0 elsewhere) into probs [B, H, T, T];
//             Y = P V into y [B, T, H, hd] (the heads already merged)
//   backward: dV = P^T dY, dP = dY V^T, dS = s P (dP - rowsum(dP P)), dQ = dS K, dK = dS^T Q, into dqkv
//             [B, T, 3, H, hd]
// qkv, y, dy, dqkv have the table's dtype; probs and the workspace its compute type (f32 for f16/bf16).
// workspace: per-thread scratch for `threads` threads (the op layer's num_threads(), at least the number the
// kernel runs on) of self_attention_workspace(args, dtype, backward, probs_in_scratch) elements each.
// The low-probs forms (f16/bf16 only) keep probs in the table's dtype, for the backward: half the bytes of
// the largest tensor attention keeps, and one relative rounding error per entry of P, as the composite's
// f16/bf16 P has. Their forward computes y from P before the rounding, so y is op_self_attention's bit for
// bit.
// The stats forms keep no P at all (Note [attention keeps row statistics]): the forward writes, for each row
// i of each head, the pair stats[2 ((b H + h) T + i) + {0, 1}] = (m_i, 1 / l_i), the row's max of s S and its
// sum of exp(s S - m_i) over the allowed keys, in the compute type; the backward computes P again as exp(s Q
// K^T - m) / l with the same product and the same vector exp at the same alignment, so P, y and dqkv are
// op_self_attention's bit for bit, for 2 T numbers a head row instead of T^2.
struct SelfAttentionArgs {
  const void* qkv = nullptr;  // forward and backward in
  void* probs = nullptr;      // forward out, backward in
  void* stats = nullptr;      // the stats forms' (m, 1 / l) a row, instead of probs: forward out, backward in
  void* y = nullptr;          // forward out
  const void* dy = nullptr;   // backward in
  void* dqkv = nullptr;       // backward out
  void* workspace = nullptr;  // scratch
  int64_t batch = 0, t = 0, heads = 0, head_dim = 0, threads = 1;
  double scale = 1;
  bool causal = false;
};
// Per-thread scratch elements of the CPU's bf16 products (Note [the attention's products in bf16] in
// kernels/cpu/attention_bf16.h), past dS in the backward: K's (then V's) pairs transposed [hd / 2, T];
// forward: V interleaved [ceil(T / 2), hd] and P rounded [T, T + T % 2]; backward: dY, K and Q
// interleaved, P and dS interleaved [ceil(T / 2), T], and dS rounded [T, T + T % 2].
inline int64_t self_attention_bf16_scratch(int64_t t, int64_t hd, bool backward) {
  const int64_t pairs = (t + 1) / 2, padded = t + t % 2;
  return backward ? hd / 2 * t + 3 * pairs * hd + 2 * pairs * t + t * padded / 2
                  : hd / 2 * t + pairs * hd + t * padded / 2;
}
// Per-thread scratch elements: K^T (forward) or dS and V^T (backward), plus converted copies of one head's
// operands when the dtype is not its own compute type, or for bf16 the room of its CPU products where that
// is more. (probs_in_scratch, for the low-probs and the stats forms: plus one head's P in the compute type,
// and 64 elements to align it.)
inline int64_t self_attention_workspace(const SelfAttentionArgs& a, DType dtype, bool backward,
                                        bool probs_in_scratch = false) {
  const bool convert = dtype == DType::F16 || dtype == DType::BF16;
  const int64_t th = a.t * a.head_dim;
  const int64_t own = th + (convert ? (backward ? 7 : 4) * th : 0);
  const int64_t products = dtype == DType::BF16 ? self_attention_bf16_scratch(a.t, a.head_dim, backward) : 0;
  return (backward ? a.t * a.t : 0) + std::max(own, products) + (probs_in_scratch ? a.t * a.t + 64 : 0);
}
using SelfAttentionKernel = void(const SelfAttentionArgs& args);
extern OpTable<SelfAttentionKernel> op_self_attention;
extern OpTable<SelfAttentionKernel> op_self_attention_backward;
extern OpTable<SelfAttentionKernel> op_self_attention_low_probs;
extern OpTable<SelfAttentionKernel> op_self_attention_backward_low_probs;
extern OpTable<SelfAttentionKernel> op_self_attention_stats;
extern OpTable<SelfAttentionKernel> op_self_attention_backward_stats;

}  // namespace frugal
