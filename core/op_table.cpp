// The op tables themselves, and the error for a missing kernel.
#include "core/op_table.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

#include "core/error.h"
#include "core/op_table_attention.h"
#include "core/op_table_conv.h"
#include "core/op_table_copy.h"
#include "core/op_table_index.h"
#include "core/op_table_linalg.h"
#include "core/op_table_norm.h"
#include "core/op_table_optim.h"
#include "core/op_table_reduce.h"
#include "core/op_table_softmax.h"
#include "core/op_table_sparse.h"
#include "core/quant_kernels.h"

namespace frugal {

#define FRUGAL_DEFINE_TABLE(name, ...) constinit OpTable<ElementwiseKernel> op_##name{#name};
FRUGAL_UNARY_OPS(FRUGAL_DEFINE_TABLE)
FRUGAL_BINARY_OPS(FRUGAL_DEFINE_TABLE)
FRUGAL_COMPARE_OPS(FRUGAL_DEFINE_TABLE)
#undef FRUGAL_DEFINE_TABLE
#define FRUGAL_DEFINE_TABLE(name) constinit OpTable<ReduceKernel> op_##name{#name};
FRUGAL_REDUCE_OPS(FRUGAL_DEFINE_TABLE)
#undef FRUGAL_DEFINE_TABLE

constinit OpTable<ElementwiseKernel> op_where{"where"};
constinit OpTable<ElementwiseKernel> op_cast{"cast"};
constinit OpTable<ElementwiseKernel> op_fill{"fill"};
constinit OpTable<ElementwiseKernel> op_add_widened{"add_widened"};
constinit OpTable<GemmKernel> op_gemm{"matmul"};
constinit OpTable<LinearKernel> op_linear{"linear"};
constinit OpTable<ReluBackwardBiasKernel> op_relu_backward_bias{"relu_backward_bias"};
constinit OpTable<SoftmaxKernel> op_softmax{"softmax"};
constinit OpTable<SoftmaxBackwardKernel> op_softmax_backward{"softmax_backward"};
constinit OpTable<SgdStepKernel> op_sgd_step{"sgd_step"};
constinit OpTable<AdamStepKernel> op_adam_step{"adam_step"};
constinit OpTable<Adam8bitStepKernel> op_adam8bit_step{"adam8bit_step"};
constinit OpTable<SegmentSumKernel> op_segment_sum_rows{"segment_sum_rows"};
constinit OpTable<SparseAdamStepKernel> op_sparse_adam_step{"sparse_adam_step"};
constinit OpTable<CsrMatmulKernel> op_csr_matmul{"csr_matmul"};
constinit OpTable<ValueRangeKernel> op_value_range{"value_range"};
constinit OpTable<QuantizeU8Kernel> op_quantize_u8{"quantize_u8"};
constinit OpTable<Int8LinearKernel> op_int8_linear{"int8_linear"};
constinit OpTable<IndexKernel> op_index_select{"index_select"};
constinit OpTable<IndexKernel> op_gather{"gather"};
constinit OpTable<IndexKernel> op_scatter_add{"scatter_add"};
constinit OpTable<CrossEntropyKernel> op_cross_entropy{"cross_entropy"};
constinit OpTable<CrossEntropyKernel> op_cross_entropy_backward{"cross_entropy_backward"};
constinit OpTable<ConvKernel> op_conv2d{"conv2d"};
constinit OpTable<ConvKernel> op_conv2d_backward_data{"conv2d_backward_data"};
constinit OpTable<ConvKernel> op_conv2d_backward_weight{"conv2d_backward_weight"};
constinit OpTable<ConvKernel> op_conv2d_backward{"conv2d_backward"};
constinit OpTable<ConvKernel> op_conv2d_relu_pool2{"conv2d_relu_pool2"};
constinit OpTable<PoolKernel> op_max_pool2d{"max_pool2d"};
constinit OpTable<PoolKernel> op_max_pool2d_backward{"max_pool2d_backward"};
constinit OpTable<PoolKernel> op_avg_pool2d{"avg_pool2d"};
constinit OpTable<PoolKernel> op_avg_pool2d_backward{"avg_pool2d_backward"};
constinit OpTable<AttentionSoftmaxKernel> op_attention_softmax{"attention_scores_softmax"};
constinit OpTable<AttentionSoftmaxKernel> op_attention_softmax_backward{"attention_scores_softmax_backward"};
constinit OpTable<UnscaleKernel> op_non_finite_check_and_unscale{"non_finite_check_and_unscale"};

namespace {
// Function-local: kernel libraries set their kernels during static initialisation, in any order.
std::mutex& tables_mutex() {
  static std::mutex m;
  return m;
}
std::vector<OpTableRef>& noted_tables() {
  static std::vector<OpTableRef> tables;
  return tables;
}
}  // namespace

void note_op_table(const OpTableRef& ref) {
  std::lock_guard<std::mutex> lock(tables_mutex());
  noted_tables().push_back(ref);
}

std::vector<OpTableRef> op_tables() {
  std::vector<OpTableRef> tables;
  {
    std::lock_guard<std::mutex> lock(tables_mutex());
    tables = noted_tables();
  }
  std::sort(tables.begin(), tables.end(),
            [](const OpTableRef& a, const OpTableRef& b) { return std::strcmp(a.name, b.name) < 0; });
  return tables;
}
constinit OpTable<LayerNormKernel> op_layer_norm{"layer_norm"};
constinit OpTable<LayerNormKernel> op_layer_norm_backward{"layer_norm_backward"};
constinit OpTable<LayerNormKernel> op_layer_norm_xhat{"layer_norm_xhat"};
constinit OpTable<LayerNormKernel> op_layer_norm_backward_xhat{"layer_norm_backward_xhat"};
constinit OpTable<LayerNormKernel> op_layer_norm_rounded{"layer_norm_rounded"};
constinit OpTable<LayerNormKernel> op_layer_norm_affine{"layer_norm_affine"};
constinit OpTable<ElementwiseKernel> op_gelu_backward{"gelu_backward"};
constinit OpTable<ElementwiseKernel> op_relu_backward{"relu_backward"};
constinit OpTable<ElementwiseKernel> op_gelu_tanh_backward{"gelu_tanh_backward"};
constinit OpTable<ElementwiseKernel> op_gelu_and_backward{"gelu_and_backward"};
constinit OpTable<SelfAttentionKernel> op_self_attention{"self_attention"};
constinit OpTable<SelfAttentionKernel> op_self_attention_backward{"self_attention_backward"};
constinit OpTable<SelfAttentionKernel> op_self_attention_low_probs{"self_attention_low_probs"};
constinit OpTable<SelfAttentionKernel> op_self_attention_backward_low_probs{
    "self_attention_backward_low_probs"};
constinit OpTable<SelfAttentionKernel> op_self_attention_stats{"self_attention_stats"};
constinit OpTable<SelfAttentionKernel> op_self_attention_backward_stats{"self_attention_backward_stats"};
constinit OpTable<IndexKernel> op_index_add{"index_add"};
constinit OpTable<DeviceCopyKernel> op_copy_between_devices{"copy between devices"};
constinit OpTable<TransposeKernel> op_transpose2d{"transpose2d"};

void throw_missing_kernel(const char* op, Device device, DType dtype, const void* const* row) {
  std::string supported;
  for (int i = 0; i < kNumDTypes; ++i)
    if (row[i]) supported += std::string(supported.empty() ? "" : ", ") + dtype_name(DType(i));
  if (supported.empty()) supported = "none (no kernels for this device are built in)";
  throw DTypeError(detail::str_cat(op, ": no kernel for dtype ", dtype_name(dtype), " on ", device, "; ", op,
                                   " on ", device, " supports: ", supported));
}

}  // namespace frugal
