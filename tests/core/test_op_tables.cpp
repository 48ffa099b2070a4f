// The dtype coverage of the CPU op tables (DESIGN.md, Precision): every op with an f32 kernel has f16 and
// bf16 kernels too (stored as such, computed in f32), unless the allow-list below says why not.
#include <map>
#include <set>

#include "core/op_table.h"
#include "tests/test_util.h"

namespace frugal {
namespace {

// Ops whose CPU f32 kernel deliberately has no f16/bf16 twin, each with the reason.
const std::map<std::string, std::string> kAllowedWithoutHalf = {
    {"linear_relu",
     "a fused f32 GEMM (oneDNN's matmul with a ReLU post-op); ops::linear_relu composes linear "
     "and relu_ for f16/bf16"},
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

}  // namespace
}  // namespace frugal
