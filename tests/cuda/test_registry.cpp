// Which kernels the CUDA backend registers in the op tables (core/op_table.h): registration needs no device,
// so this runs in every CUDA build, GPU or not. A missing entry here is a gap users would meet as a "no
// kernel for dtype ... on cuda:0" error.
#include <gtest/gtest.h>

#include "core/batch_norm.h"
#include "core/op_table.h"
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

namespace frugal {
namespace {

const Device kGpu = cuda(0);

template <typename Fn>
void expect_kernels(const OpTable<Fn>& table, std::initializer_list<DType> dtypes) {
  for (DType t : dtypes)
    EXPECT_TRUE(table.has(kGpu, t)) << table.name() << " has no CUDA kernel for " << dtype_name(t);
}

TEST(CudaKernels, EveryOpOfThisBackendIsRegistered) {
#ifndef FRUGAL_HAVE_CUDA
  GTEST_SKIP() << "frugal was built without CUDA";
#else
  ASSERT_TRUE(load_backend(DeviceType::CUDA)) << backend_error(DeviceType::CUDA);
  const auto floats = {DType::F32, DType::F16, DType::BF16};
  const auto all = {DType::F32, DType::F64, DType::F16, DType::BF16,
                    DType::I64, DType::I32, DType::U8,  DType::Bool};
#define FRUGAL_EXPECT_FLOATS(name, ...) expect_kernels(op_##name, floats);
  FRUGAL_UNARY_OPS(FRUGAL_EXPECT_FLOATS)
  FRUGAL_BINARY_OPS(FRUGAL_EXPECT_FLOATS)
  FRUGAL_REDUCE_OPS(FRUGAL_EXPECT_FLOATS)
#undef FRUGAL_EXPECT_FLOATS
  for (auto* t :
       {&op_neg, &op_abs, &op_relu, &op_clamp, &op_add, &op_sub, &op_mul, &op_pow, &op_maximum, &op_minimum})
    expect_kernels(*t, {DType::I64, DType::I32});
  for (auto* t : {&op_eq, &op_ne, &op_lt, &op_le, &op_gt, &op_ge})
    expect_kernels(*t, {DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8, DType::Bool});
  for (auto* t : {&op_sum, &op_max, &op_min, &op_argmax, &op_argmin})
    expect_kernels(*t, {DType::I64, DType::I32, DType::U8, DType::Bool});
  for (auto* t : {&op_where, &op_cast, &op_fill}) expect_kernels(*t, all);
  expect_kernels(op_copy_between_devices, all);
  expect_kernels(op_index_select, all);
  expect_kernels(op_gather, all);
  expect_kernels(op_scatter_add, {DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32});
  for (auto* t : {&op_gemm}) expect_kernels(*t, floats);
  expect_kernels(op_softmax, floats);
  expect_kernels(op_softmax_backward, floats);
  expect_kernels(op_cross_entropy, floats);
  expect_kernels(op_cross_entropy_backward, floats);
  expect_kernels(op_sgd_step, floats);
  expect_kernels(op_adam_step, floats);
  expect_kernels(op_adam8bit_step, floats);
  expect_kernels(op_sparse_adam_step, floats);
  expect_kernels(op_segment_sum_rows, floats);
  for (auto* t : {&op_layer_norm, &op_layer_norm_backward, &op_layer_norm_xhat, &op_layer_norm_backward_xhat,
                  &op_layer_norm_rounded, &op_layer_norm_affine})
    expect_kernels(*t, floats);
  for (auto* t : {&op_gelu_backward, &op_gelu_tanh_backward, &op_relu_backward}) expect_kernels(*t, floats);
  for (auto* t : {&op_attention_softmax, &op_attention_softmax_backward}) expect_kernels(*t, floats);
  for (auto* t : {&op_self_attention, &op_self_attention_backward}) expect_kernels(*t, floats);
  for (auto* t : {&op_self_attention_low_probs, &op_self_attention_backward_low_probs})
    expect_kernels(*t, {DType::F16, DType::BF16});
  expect_kernels(op_index_add, {DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32});
  expect_kernels(op_transpose2d, all);
  expect_kernels(op_non_finite_check_and_unscale, floats);
  for (auto* t : {&op_conv2d, &op_conv2d_backward_data, &op_conv2d_backward_weight})
    expect_kernels(*t, floats);
  for (auto* t : {&op_max_pool2d, &op_max_pool2d_backward, &op_avg_pool2d, &op_avg_pool2d_backward})
    expect_kernels(*t, floats);
  for (auto* t : {&op_batch_norm, &op_batch_norm_backward}) expect_kernels(*t, floats);
  // f64 arithmetic stays on the CPU (gradient checks); a GPU holds, moves and converts f64.
  EXPECT_FALSE(op_add.has(kGpu, DType::F64));
#endif
}

}  // namespace
}  // namespace frugal
