// Which ops have a CPU kernel for f32, f16, bf16 (or i64, i32, bool) but no CUDA kernel for that dtype:
// found by sweeping every op table (op_tables(), as tests/core/test_op_tables.cpp does for the CPU's dtypes),
// so that a new CPU op without its CUDA twin shows up here instead of as a "no kernel ... on cuda:0" error in
// a user's model. Registration needs no device: this runs in every CUDA build, GPU or not.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "core/op_table.h"

namespace frugal {
namespace {

// Ops deliberately without CUDA kernels, with the reason (name -> why): a fused variant the op layer uses
// only where a device registers it, composing the ops it fuses (which have CUDA kernels) elsewhere, or a
// CPU-only module's kernel. A CUDA kernel for them (cuBLASLt's RELU_BIAS epilogue; a masked copy with column
// sums) is a later step.
const std::map<std::string, std::string> kAllowedWithoutCuda = {
    {"linear",
     "the fused Linear (+ ReLU); without it ops::linear runs the GEMM onto the bias rows and "
     "ops::linear_relu "
     "then relu_"},
    {"relu_backward_bias",
     "its backward's one pass; without it ops::linear_relu_backward runs relu_backward, "
     "then sum"},
    {"csr_matmul",
     "nn::SparseLinear's CSR product, for CPU inference of a pruned Linear (it refuses other devices); a GPU "
     "one would be cuSPARSE's SpMM, a later step"},
    {"conv2d_backward",
     "the fused convolution backward of oneDNN's CPU primitives; on a GPU ops::conv2d_backward composes "
     "relu_backward and cuDNN's two directions"},
    {"conv2d_relu_pool2",
     "inference's convolution pooled from oneDNN's blocked output on the CPU; on a GPU nn::Sequential runs "
     "cuDNN's convolution and the pool over chunks of images, and ops::conv2d_relu_pool2 composes them"},
    {"self_attention_stats",
     "the fused attention that keeps each row's softmax statistics, not the probabilities (Note [attention "
     "keeps row statistics]); on a GPU self_attention keeps the probabilities (cuBLASLt's batched GEMMs)"},
    {"self_attention_backward_stats", "its backward, which computes the probabilities again"},
    {"add_widened",
     "add of an f32 and a 16-bit tensor reading the 16-bit one as it is (autocast's residual adds); "
     "elsewhere "
     "ops::add casts it to f32 first, then adds"},
};

TEST(CudaCoverage, EveryCpuKernelHasACudaTwin) {
#ifndef FRUGAL_HAVE_CUDA
  GTEST_SKIP() << "frugal was built without CUDA";
#else
  ASSERT_TRUE(load_backend(DeviceType::CUDA)) << backend_error(DeviceType::CUDA);
  const Device gpu = cuda(0);
  std::set<std::string> names;
  for (const OpTableRef& t : op_tables()) {
    names.insert(t.name);
    if (kAllowedWithoutCuda.count(t.name)) continue;
    // f64 arithmetic stays on the CPU (gradient checks; a GPU holds, moves and converts f64), and u8
    // arithmetic (add, mul, clamp, scatter_add, ...) has no CUDA kernels yet: nothing on the GPU path uses
    // it.
    for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::Bool}) {
      if (!t.has(t.table, kCPU, dt)) continue;
      EXPECT_TRUE(t.has(t.table, gpu, dt))
          << t.name << " has a CPU " << dtype_name(dt) << " kernel but no CUDA one";
    }
  }
  for (const auto& [name, why] : kAllowedWithoutCuda)
    EXPECT_TRUE(names.count(name)) << name << " is on the allow-list but no such op table exists";
  // The sweep sees the tables of the GPT path at all.
  for (const char* expected :
       {"layer_norm", "layer_norm_backward", "layer_norm_xhat", "layer_norm_backward_xhat",
        "self_attention_low_probs", "self_attention_backward_low_probs", "gelu_backward", "self_attention",
        "self_attention_backward", "attention_scores_softmax", "index_add", "transpose2d",
        "non_finite_check_and_unscale", "cross_entropy", "adam_step", "conv2d", "max_pool2d", "batch_norm"})
    EXPECT_TRUE(names.count(expected)) << "op table " << expected << " was not noted";
#endif
}

}  // namespace
}  // namespace frugal
