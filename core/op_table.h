// The op table: one table per op, keyed by (device type, dtype), filled in by the kernel libraries when they
// load (kernels/cpu, kernels/cuda). A missing entry is an error naming op, device and dtype, never a
// fallback.
//
// Adding an op (STYLE.md rule 1): an elementwise op is its line in core/op_list.h (Note [adding an
// elementwise op] there); another op is its own table here, its CPU kernel, its CUDA kernel, its public
// function in core/ops.h, its backward rule, its test.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "device.h"
#include "dtype.h"
#include "loop.h"
#include "op_list.h"

namespace frugal {

// Kernel signatures. Kernels never allocate and never know about autograd.
using ElementwiseKernel = void(const Loop& loop, const OpArgs& args);

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

// C[b] = alpha * A[b] @ B[b] + beta * C[b] for b < batch; A is m x k, B is k x n, C is m x n (contiguous
// rows). Each of A and B has a unit stride along rows or columns (the op layer copies otherwise). Strides in
// elements.
struct GemmArgs {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int64_t a_batch = 0, a_row = 0, a_col = 1;
  int64_t b_batch = 0, b_row = 0, b_col = 1;
  int64_t c_batch = 0, c_row = 0;
  float alpha = 1, beta = 0;
};
using GemmKernel = void(const GemmArgs& args);

// A linear layer followed by ReLU, the bias and the ReLU applied as the GEMM stores C: y [m, n] =
// max(x [m, k] w^T + bias, 0), x and y contiguous, w [n, k] contiguous, bias [n] or null. Registered where a
// device has such a fused GEMM (f32 through oneDNN on the CPU); ops::linear_relu composes it elsewhere.
struct LinearReluArgs {
  int64_t m = 0, n = 0, k = 0;
  const void* x = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;
  void* y = nullptr;
};
using LinearReluKernel = void(const LinearReluArgs& args);

// ReLU's backward and the bias gradient in one pass over contiguous [rows, cols] g and y (ReLU's output):
// gz = y > 0 ? g : 0 and dbias [cols] = the column sums of gz, summed in the order ops::sum(gz, {0}) uses
// (on the CPU, Note [pairwise sums] in kernels/cpu/cascade.h).
struct ReluBackwardBiasArgs {
  int64_t rows = 0, cols = 0;
  const void* g = nullptr;
  const void* y = nullptr;
  void* gz = nullptr;
  void* dbias = nullptr;
};
using ReluBackwardBiasKernel = void(const ReluBackwardBiasArgs& args);

// Softmax (or log-softmax) over the last dim of a contiguous [rows, cols] input into a contiguous output.
struct SoftmaxArgs {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t rows = 0, cols = 0;
  bool log = false;
};
using SoftmaxKernel = void(const SoftmaxArgs& args);

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

[[noreturn]] void throw_missing_kernel(const char* op, Device device, DType dtype, const void* const* row);

// One device type's kernels of a table, one per dtype, with their type erased (any function pointer converts
// to void (*)() and back unchanged).
using ErasedKernelRow = std::array<void (*)(), kNumDTypes>;

// A table seen without its kernel type, for code that sweeps every table (the dtype-coverage test, the test
// suites' stand-in GPUs).
//   copy_row(table, from, to): device type `to` takes the kernel of every dtype that `from` has (none where
//                              `from` has none); returns `to`'s kernels from before, for set_row to restore.
struct OpTableRef {
  const char* name = nullptr;
  void* table = nullptr;
  bool (*has)(const void* table, Device device, DType dtype) = nullptr;
  ErasedKernelRow (*copy_row)(void* table, DeviceType from, DeviceType to) = nullptr;
  void (*set_row)(void* table, DeviceType device, const ErasedKernelRow& row) = nullptr;
};
// Every table that has had a kernel set so far (tables note themselves on their first set), by name.
std::vector<OpTableRef> op_tables();
void note_op_table(const OpTableRef& ref);

template <typename Fn>
class OpTable {
 public:
  explicit constexpr OpTable(const char* name) : name_(name) {}
  const char* name() const { return name_; }
  void set(DeviceType device, DType dtype, Fn* fn) {
    if (!noted_) {
      note_op_table(
          {name_, this,
           [](const void* t, Device d, DType dt) { return static_cast<const OpTable*>(t)->has(d, dt); },
           [](void* t, DeviceType from, DeviceType to) {
             OpTable& table = *static_cast<OpTable*>(t);
             const ErasedKernelRow old = table.erased_row(to);
             table.set_erased_row(to, table.erased_row(from));
             return old;
           },
           [](void* t, DeviceType d, const ErasedKernelRow& row) {
             static_cast<OpTable*>(t)->set_erased_row(d, row);
           }});
      noted_ = true;
    }
    table_[int(device)][int(dtype)] = fn;
  }
  bool has(Device device, DType dtype) const { return table_[int(device.type)][int(dtype)] != nullptr; }
  Fn* get(Device device, DType dtype) const {
    Fn* fn = table_[int(device.type)][int(dtype)];
    if (!fn) [[unlikely]] {
      const void* row[kNumDTypes];
      for (int i = 0; i < kNumDTypes; ++i)
        row[i] = reinterpret_cast<const void*>(table_[int(device.type)][i]);
      throw_missing_kernel(name_, device, dtype, row);
    }
    return fn;
  }

 private:
  ErasedKernelRow erased_row(DeviceType device) const {
    ErasedKernelRow row;
    for (int i = 0; i < kNumDTypes; ++i) row[i] = reinterpret_cast<void (*)()>(table_[int(device)][i]);
    return row;
  }
  void set_erased_row(DeviceType device, const ErasedKernelRow& row) {
    for (int i = 0; i < kNumDTypes; ++i) table_[int(device)][i] = reinterpret_cast<Fn*>(row[i]);
  }

  const char* name_;
  bool noted_ = false;
  Fn* table_[kNumDeviceTypes][kNumDTypes] = {};
};

// The elementwise ops, from core/op_list.h: X(name, ...) for each, a table op_<name> each. The ops with
// parameters (FRUGAL_UNARY_PARAM_OP_LIST) read them from OpArgs a and b.
#define FRUGAL_UNARY_OPS(X) FRUGAL_UNARY_OP_LIST(X) FRUGAL_UNARY_PARAM_OP_LIST(X)
#define FRUGAL_BINARY_OPS(X) FRUGAL_BINARY_OP_LIST(X)
#define FRUGAL_COMPARE_OPS(X) FRUGAL_COMPARE_OP_LIST(X)
// Reductions over the dims ReduceArgs describes; argmax writes i64.
#define FRUGAL_REDUCE_OPS(X) X(sum) X(max) X(min) X(argmax) X(argmin) X(var)

#define FRUGAL_DECLARE_TABLE(name, ...) extern OpTable<ElementwiseKernel> op_##name;
FRUGAL_UNARY_OPS(FRUGAL_DECLARE_TABLE)
FRUGAL_BINARY_OPS(FRUGAL_DECLARE_TABLE)
FRUGAL_COMPARE_OPS(FRUGAL_DECLARE_TABLE)
#undef FRUGAL_DECLARE_TABLE
#define FRUGAL_DECLARE_TABLE(name) extern OpTable<ReduceKernel> op_##name;
FRUGAL_REDUCE_OPS(FRUGAL_DECLARE_TABLE)
#undef FRUGAL_DECLARE_TABLE

extern OpTable<ElementwiseKernel> op_where;  // operands: out, cond (bool), a, b; keyed by a's dtype
extern OpTable<ElementwiseKernel> op_cast;  // operands: out, in; keyed by the OUTPUT dtype; args.a = in dtype
extern OpTable<ElementwiseKernel> op_fill;  // operands: out; args.a = the value
extern OpTable<GemmKernel> op_gemm;
extern OpTable<LinearReluKernel> op_linear_relu;
extern OpTable<ReluBackwardBiasKernel> op_relu_backward_bias;
extern OpTable<SoftmaxKernel> op_softmax;
// Optimizer updates (optim/): one fused pass over a parameter, its gradient and its state, each contiguous
// with n elements. Keyed by the parameter's dtype; the gradient has that dtype too, the state is f32 for
// f16/bf16 parameters and the parameter's dtype otherwise (the compute type, acc_t). Formulas: optim/sgd.h,
// optim/adam.h.
struct SgdStepArgs {
  void* param = nullptr;
  const void* grad = nullptr;
  void* momentum_buffer = nullptr;  // null when momentum is 0
  int64_t n = 0;
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  bool first_step = false;  // the buffer starts as the gradient
};
using SgdStepKernel = void(const SgdStepArgs& args);
extern OpTable<SgdStepKernel> op_sgd_step;
struct AdamStepArgs {
  void* param = nullptr;
  const void* grad = nullptr;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  void* max_exp_avg_sq = nullptr;  // amsgrad only
  int64_t n = 0;
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  double step_size = 0;                 // lr / (1 - beta1^step)
  double bias_correction2_sqrt = 1;     // sqrt(1 - beta2^step)
  bool decoupled_weight_decay = false;  // AdamW
  bool amsgrad = false;
};
using AdamStepKernel = void(const AdamStepArgs& args);
extern OpTable<AdamStepKernel> op_adam_step;
// Sparse rows (autograd/sparse.h, optim/sparse_adam.h). Keyed by the values' dtype.
//   segment_sum_rows: out[s, :] = sum over k in [starts[s], starts[s + 1]) of values[order[k], :], summed in
//                     k order (values [n, dim], order [n], starts [segments + 1], out [segments, dim])
struct SegmentSumArgs {
  const void* values = nullptr;
  const int64_t* order = nullptr;
  const int64_t* starts = nullptr;
  void* out = nullptr;
  int64_t segments = 0, dim = 0;
};
using SegmentSumKernel = void(const SegmentSumArgs& args);
extern OpTable<SegmentSumKernel> op_segment_sum_rows;
// SparseAdam's lazy update of the rows `indices` (unique) of a [rows, dim] parameter and its state (the
// state's dtype as for op_adam_step), as torch.optim.SparseAdam computes it per element of those rows:
//   m += (1 - beta1) * (g - m);  v += (1 - beta2) * (g * g - v)
//   param -= step_size * m / (sqrt(v) + eps),  step_size = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
struct SparseAdamStepArgs {
  void* param = nullptr;  // [rows, dim]
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  const int64_t* indices = nullptr;  // [nnz], unique, in [0, rows)
  const void* values = nullptr;      // [nnz, dim], the parameter's dtype
  int64_t nnz = 0, dim = 0;
  double beta1 = 0, beta2 = 0, eps = 0, step_size = 0;
};
using SparseAdamStepKernel = void(const SparseAdamStepArgs& args);
extern OpTable<SparseAdamStepKernel> op_sparse_adam_step;
extern OpTable<IndexKernel> op_index_select;
extern OpTable<IndexKernel> op_gather;
extern OpTable<IndexKernel> op_scatter_add;

// Fused softmax + cross-entropy over contiguous [rows, classes] logits with i64 targets [rows]; one pass over
// each row in each direction (nn/functional.h). Per-row tensors (loss, lse, grad) are f32 for f16/bf16 logits
// and of the logits' dtype otherwise.
//   forward:  loss[r] = lse[r] - (1 - eps) x[r, t] - eps / C sum_j x[r, j], lse[r] = log sum_j exp(x[r, j])
//   backward: d_logits[r, j] = grad[r] (exp(x[r, j] - lse[r]) - (1 - eps) [j == t] - eps / C)
// Rows whose target is ignore_index give loss 0 and a zero gradient. Targets are checked by the op layer.
struct CrossEntropyArgs {
  const void* logits = nullptr;
  const int64_t* target = nullptr;
  void* loss = nullptr;        // forward out [rows]
  void* lse = nullptr;         // forward out, backward in [rows]
  const void* grad = nullptr;  // backward in [rows]
  void* d_logits = nullptr;    // backward out [rows, classes]
  int64_t rows = 0, classes = 0;
  int64_t ignore_index = -100;
  double label_smoothing = 0;
};
using CrossEntropyKernel = void(const CrossEntropyArgs& args);
extern OpTable<CrossEntropyKernel> op_cross_entropy;
extern OpTable<CrossEntropyKernel> op_cross_entropy_backward;

// 2-D convolution over contiguous NCHW tensors, PyTorch semantics. With ih = oh * stride_h - pad_h + kh *
// dil_h (iw likewise; positions outside the input read as zero) and c running over input channel group
// g = o / (out_channels / groups):
//   forward:         y[n, o, oh, ow]   = bias[o] + sum_{c, kh, kw} x[n, c, ih, iw] * weight[o, c', kh, kw]
//   backward_data:   dx[n, c, ih, iw]  = sum_{o, kh, kw} dy[n, o, oh, ow] * weight[o, c', kh, kw]
//   backward_weight: dweight[o, c', kh, kw] = sum_{n, oh, ow} dy[n, o, oh, ow] * x[n, c, ih, iw];
//                    dbias[o] = sum_{n, oh, ow} dy[n, o, oh, ow] (when dbias is not null)
// Each direction reads the pointers it names and overwrites its output(s) entirely.
struct ConvArgs {
  int64_t n = 0, c = 0, h = 0, w = 0;  // x: [n, c, h, w]
  int64_t o = 0, kh = 0, kw = 0;       // weight: [o, c / groups, kh, kw]
  int64_t oh = 0, ow = 0;              // y: [n, o, oh, ow]
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1, groups = 1;
  const void* x = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;  // forward: null when there is no bias
  const void* dy = nullptr;
  void* y = nullptr;
  void* dx = nullptr;
  void* dweight = nullptr;
  void* dbias = nullptr;  // backward_weight: null when there is no bias
};
using ConvKernel = void(const ConvArgs& args);
extern OpTable<ConvKernel> op_conv2d;
extern OpTable<ConvKernel> op_conv2d_backward_data;
extern OpTable<ConvKernel> op_conv2d_backward_weight;

// 2-D pooling over the n * c planes of contiguous NCHW tensors, PyTorch semantics. Window (oh, ow) covers
// ih = oh * stride_h - pad_h + i * dil_h for i < kh (iw likewise); padding never wins a max and counts in
// an average only with count_include_pad.
//   max:     y = the largest element of the window (the first one on ties; NaN propagates);
//            indices[n, c, oh, ow] = ih * w + iw of that element (PyTorch's convention)
//   max backward: dx (zeroed by the kernel) gets dy at each index, summed where windows overlap
//   avg:     y = sum of the window / (window size, or count of in-range elements without count_include_pad)
//   avg backward: dx (zeroed by the kernel) gets dy / divisor at every in-range window element
struct PoolArgs {
  int64_t planes = 0, h = 0, w = 0, oh = 0,
          ow = 0;  // x, dx: [planes, h, w]; y, dy, indices: [planes, oh, ow]
  int64_t kh = 1, kw = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  bool count_include_pad = true;
  const void* x = nullptr;
  const void* dy = nullptr;
  void* y = nullptr;
  void* dx = nullptr;
  int64_t* indices = nullptr;           // max forward: written
  const int64_t* indices_in = nullptr;  // max backward: read
};
using PoolKernel = void(const PoolArgs& args);
extern OpTable<PoolKernel> op_max_pool2d;
extern OpTable<PoolKernel> op_max_pool2d_backward;
extern OpTable<PoolKernel> op_avg_pool2d;
extern OpTable<PoolKernel> op_avg_pool2d_backward;

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

// Loss scaling (optim/grad_scaler.h): one pass over a contiguous gradient of n elements, keyed by its dtype.
//   *found_inf = 1 when some element is inf or nan (never set back to 0);
//   grad[i] *= inv_scale, in f32 for f16/bf16 (as PyTorch's _amp_foreach_non_finite_check_and_unscale_;
//   skipped when inv_scale is 1, which makes the pass a check only)
// found_inf is one f32 in the gradient's device memory (a 0-d tensor's data), as PyTorch's found_inf tensor:
// a CUDA kernel ORs into it on the stream without waiting, and whoever needs the answer reads it once for
// all the gradients of that device (Note [one found_inf per device] in optim/grad_scaler.cpp).
struct UnscaleArgs {
  void* grad = nullptr;
  int64_t n = 0;
  float inv_scale = 1;
  float* found_inf = nullptr;
};
using UnscaleKernel = void(const UnscaleArgs& args);
extern OpTable<UnscaleKernel> op_non_finite_check_and_unscale;
// Fused layer normalisation over contiguous [rows, cols] rows (nn/functional.h, layer_norm):
//   forward:  mean[r] = sum_j x[r, j] / cols,  rstd[r] = 1 / sqrt(sum_j (x[r, j] - mean[r])^2 / cols + eps),
//             y[r, j] = (x[r, j] - mean[r]) rstd[r] weight[j] + bias[j]
//   backward: with xh = (x - mean) rstd and g = dy weight (g = dy without a weight),
//             dx[r, j] = rstd[r] (g[r, j] - mean_k g[r, k] - xh[r, j] mean_k (g xh)[r, k]),
//             dweight[j] = sum_r dy[r, j] xh[r, j],  dbias[j] = sum_r dy[r, j]
// x, y, dy, dx have the table's dtype; weight, bias, dweight, dbias, mean, rstd and the workspace have its
// compute type (f32 for f16/bf16, the dtype itself otherwise). weight and bias (forward) and dx, dweight and
// dbias (backward) may be null. The backward sums dweight and dbias per chunk of rows (`chunks` equal spans,
// chosen by the op layer from the shape alone) into workspace [chunks, 2, cols], then over the chunks in
// order, so the results do not depend on the number of threads.
// The x-hat forms (Note [layer norm saves x-hat] in autograd/grad_norm.cpp): op_layer_norm_xhat is the
// forward that also writes xh into xhat (rounded to xhat_dtype; y as op_layer_norm's, bit for bit), and
// op_layer_norm_backward_xhat the backward from xhat (read as xhat_dtype) and rstd instead of x and mean.
// Both are keyed by x's dtype; xhat_dtype is any floating dtype (f32, f64, f16, bf16).
struct LayerNormArgs {
  const void* x = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  void* y = nullptr;          // forward out
  void* mean = nullptr;       // forward out, backward in [rows]
  void* rstd = nullptr;       // forward out, backward in [rows]
  const void* dy = nullptr;   // backward in
  void* dx = nullptr;         // backward out
  void* dweight = nullptr;    // backward out [cols]
  void* dbias = nullptr;      // backward out [cols]
  void* workspace = nullptr;  // backward scratch [chunks, 2, cols]
  void* xhat = nullptr;       // x-hat forms: forward out, backward in [rows, cols]
  DType xhat_dtype = DType::F32;
  int64_t rows = 0, cols = 0, chunks = 1;
  double eps = 1e-5;
};
using LayerNormKernel = void(const LayerNormArgs& args);
extern OpTable<LayerNormKernel> op_layer_norm;
extern OpTable<LayerNormKernel> op_layer_norm_backward;
extern OpTable<LayerNormKernel> op_layer_norm_xhat;
extern OpTable<LayerNormKernel> op_layer_norm_backward_xhat;

// GELU's gradient in one pass (autograd/grad_elementwise.cpp): operands out (dx), dy, x, all of x's dtype
// (the table's key), f16/bf16 computing in f32. With Phi and phi the standard normal CDF and density:
//   gelu_backward:      dx = dy (Phi(x) + x phi(x))
//   gelu_tanh_backward: dx = dy ((1 + t) / 2 + x (1 - t^2) k (1 + 3 c x^2) / 2),
//                       t = tanh(k (x + c x^3)), k = sqrt(2 / pi), c = 0.044715
extern OpTable<ElementwiseKernel> op_gelu_backward;
// ReLU's gradient from its output in one pass: operands out (dx), dy, y, all of y's dtype (the table's key);
// dx = y > 0 ? dy : 0, the values where(y > 0, dy, 0) selects (a NaN y gives 0).
extern OpTable<ElementwiseKernel> op_relu_backward;
extern OpTable<ElementwiseKernel> op_gelu_tanh_backward;

// Fused multi-head self-attention over q, k, v packed as one [B, T, 3, H, hd] tensor (the output of one
// Linear d -> 3d, nn/attention.h), per head (b, h), with scale s and, when causal, key j allowed for query i
// only when j <= i:
//   forward:  P = softmax(s Q K^T) over the allowed keys (0 elsewhere) into probs [B, H, T, T];
//             Y = P V into y [B, T, H, hd] (the heads already merged)
//   backward: dV = P^T dY, dP = dY V^T, dS = s P (dP - rowsum(dP P)), dQ = dS K, dK = dS^T Q, into dqkv
//             [B, T, 3, H, hd]
// qkv, y, dy, dqkv have the table's dtype; probs and the workspace its compute type (f32 for f16/bf16).
// workspace: per-thread scratch for `threads` threads (the op layer's num_threads(), at least the number the
// kernel runs on) of self_attention_workspace(args, dtype, backward, low_probs) elements each.
// The low-probs forms (f16/bf16 only) keep probs in the table's dtype, for the backward: half the bytes of
// the largest tensor attention keeps, and one relative rounding error per entry of P, as the composite's
// f16/bf16 P has. Their forward computes y from P before the rounding, so y is op_self_attention's bit for
// bit.
struct SelfAttentionArgs {
  const void* qkv = nullptr;  // forward and backward in
  void* probs = nullptr;      // forward out, backward in
  void* y = nullptr;          // forward out
  const void* dy = nullptr;   // backward in
  void* dqkv = nullptr;       // backward out
  void* workspace = nullptr;  // scratch
  int64_t batch = 0, t = 0, heads = 0, head_dim = 0, threads = 1;
  double scale = 1;
  bool causal = false;
};
// Per-thread scratch elements: K^T (forward) or dS and V^T (backward), plus converted copies of one head's
// operands when the dtype is not its own compute type.
// (low_probs: plus one head's P in the compute type, and 64 elements to align it.)
inline int64_t self_attention_workspace(const SelfAttentionArgs& a, DType dtype, bool backward,
                                        bool low_probs = false) {
  const bool convert = dtype == DType::F16 || dtype == DType::BF16;
  const int64_t th = a.t * a.head_dim;
  return (backward ? a.t * a.t + th + (convert ? 7 * th : 0) : th + (convert ? 4 * th : 0)) +
         (low_probs ? a.t * a.t + 64 : 0);
}
using SelfAttentionKernel = void(const SelfAttentionArgs& args);
extern OpTable<SelfAttentionKernel> op_self_attention;
extern OpTable<SelfAttentionKernel> op_self_attention_backward;
extern OpTable<SelfAttentionKernel> op_self_attention_low_probs;
extern OpTable<SelfAttentionKernel> op_self_attention_backward_low_probs;

// index_select's transpose, over IndexArgs' [outer, dim_size, inner] layout: out[o, index[i], j] +=
// src[o, i, j] for i < n_index (src [outer, n_index, inner], index 1-d, duplicates accumulate; out starts as
// a copy of x). One vectorised row add per index instead of scatter_add's per-element index.
extern OpTable<IndexKernel> op_index_add;
// Copies nbytes of contiguous bytes between two devices (cpu <-> cuda:N), returning once they are in place.
// Keyed by the type of the device that is not the cpu, one kernel for every dtype (the bytes cross as they
// are): ops::copy_ converts dtype, shape and layout on one side first.
struct DeviceCopyArgs {
  void* dst = nullptr;
  const void* src = nullptr;
  int64_t nbytes = 0;
  Device dst_device, src_device;
};
using DeviceCopyKernel = void(const DeviceCopyArgs& args);
extern OpTable<DeviceCopyKernel> op_copy_between_devices;

// out [cols, rows] = in [rows, cols]^T, in's rows in_stride elements apart (unit column stride), out
// contiguous. Keyed by the dtype (the copy is by element). Cache-blocked: a strided element-by-element copy
// misses the cache once per element of the transposed side.
struct TransposeArgs {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t rows = 0, cols = 0, in_stride = 0;
};
using TransposeKernel = void(const TransposeArgs& args);
extern OpTable<TransposeKernel> op_transpose2d;

}  // namespace frugal
