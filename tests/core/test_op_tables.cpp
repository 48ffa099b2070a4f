// The dtype coverage of the CPU op tables (DESIGN.md, Precision): every op with an f32 kernel has f16 and
// bf16 kernels too (stored as such, computed in f32), unless the allow-list below says why not.
#include <map>
#include <set>

#include "core/op_table.h"
#include "core/op_table_norm.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

// Ops whose CPU f32 kernel deliberately has no f16/bf16 twin, each with the reason.
const std::map<std::string, std::string> kAllowedWithoutHalf = {
    {"linear",
     "the fused linear layer (oneDNN's matmul primitive, f32 and bf16: this CPU has no f16 dot products); "
     "ops::linear and ops::linear_relu compose the GEMM, the bias and relu_ for f16"},
    {"csr_matmul",
     "nn::SparseLinear's CSR product: built from a pruned f32 Linear, it holds f32 values only"},
    {"conv2d_backward",
     "the fused convolution backward (oneDNN's two direction primitives sharing one dy, f32 and bf16); "
     "ops::conv2d_backward composes relu_backward and the per-direction ops for f16"},
    {"value_range",
     "nn::quant's dynamic input quantisation: the int8 layers take f32 inputs only (core/quant_kernels.h)"},
    {"quantize_u8", "nn::quant's input codes: the int8 layers take f32 inputs only (core/quant_kernels.h)"},
    {"conv2d_relu_pool2",
     "inference's convolution pooled from oneDNN's blocked f32 output; ops::conv2d_relu_pool2 composes "
     "conv2d_relu and max_pool2d for the other dtypes"},
};

TEST(OpTables, EveryF32CpuKernelHasF16AndBf16) {
  const auto tables = op_tables();
  std::set<std::string> names;
  for (const OpTableRef& t : tables) names.insert(t.name);
  // The sweep sees the tables at all: a few from each kernel file.
  for (const char* expected : {"add", "exp", "sum", "cast", "matmul", "softmax", "conv2d",
                               "conv2d_backward_weight", "max_pool2d_backward", "avg_pool2d_backward",
                               "cross_entropy", "index_select", "adam_step", "attention_scores_softmax"})
    EXPECT_TRUE(names.count(expected)) << "op table " << expected << " was not noted";
  for (const OpTableRef& t : tables) {
    if (!t.has(t.table, kCPU, DType::F32)) continue;
    const bool f16 = t.has(t.table, kCPU, DType::F16), bf16 = t.has(t.table, kCPU, DType::BF16);
    if (kAllowedWithoutHalf.count(t.name)) {
      EXPECT_FALSE(f16 && bf16) << t.name
                                << " is allowed to lack f16/bf16 but has both: drop it from the list";
      continue;
    }
    EXPECT_TRUE(f16) << t.name << " has a CPU f32 kernel but no f16 kernel";
    EXPECT_TRUE(bf16) << t.name << " has a CPU f32 kernel but no bf16 kernel";
  }
  for (const auto& [name, why] : kAllowedWithoutHalf)
    EXPECT_TRUE(names.count(name)) << name << " is on the allow-list but no such op table exists";
}

// The type-erased row hooks the stand-in devices use: every table's CUDA row takes the CPU's kernels, the
// very functions, then gets back what it had (nothing in a build without CUDA, the CUDA kernels otherwise).
TEST(OpTables, CopyRowGivesEveryDtypesKernelAndSetRowRestores) {
  const Device gpu = cuda(0);
#ifdef FRUGAL_HAVE_CUDA
  ASSERT_TRUE(load_backend(DeviceType::CUDA)) << backend_error(DeviceType::CUDA);  // fills the CUDA rows
#else
  EXPECT_FALSE(load_backend(DeviceType::CUDA));
#endif
  auto gpu_has = [&] {
    std::vector<bool> has;
    for (const OpTableRef& t : op_tables())
      for (int d = 0; d < kNumDTypes; ++d) has.push_back(t.has(t.table, gpu, DType(d)));
    return has;
  };
  const std::vector<bool> before = gpu_has();
  ElementwiseKernel* cuda_add = op_add.has(gpu, DType::F32) ? op_add.get(gpu, DType::F32) : nullptr;
  const testing::SavedKernelRows saved = testing::use_cpu_kernels_on(DeviceType::CUDA);
  EXPECT_EQ(saved.rows.size(), op_tables().size());
  for (const OpTableRef& t : op_tables())
    for (int d = 0; d < kNumDTypes; ++d)
      EXPECT_EQ(t.has(t.table, gpu, DType(d)), t.has(t.table, kCPU, DType(d))) << t.name << " " << d;
  EXPECT_EQ(op_add.get(gpu, DType::F32), op_add.get(kCPU, DType::F32));
  EXPECT_EQ(op_layer_norm_xhat.get(gpu, DType::BF16), op_layer_norm_xhat.get(kCPU, DType::BF16));
  testing::restore_kernels(saved);
  EXPECT_EQ(gpu_has(), before);
  EXPECT_EQ(op_add.has(gpu, DType::F32) ? op_add.get(gpu, DType::F32) : nullptr, cuda_add);
#ifdef FRUGAL_HAVE_CUDA
  EXPECT_NE(cuda_add, nullptr);
  EXPECT_NE(cuda_add, op_add.get(kCPU, DType::F32));
#else
  EXPECT_EQ(cuda_add, nullptr);
#endif
}

}  // namespace
}  // namespace frugal
