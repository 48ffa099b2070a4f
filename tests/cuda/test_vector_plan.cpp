// Which elementwise loops the CUDA kernels run on 16-byte vectors (kernels/cuda/vector_plan.h), decided from
// the Loop on the host: contiguous tensors, scalars and broadcast rows or columns do; transposed, misaligned
// or ragged layouts do not. Runs on every machine.
#include "kernels/cuda/vector_plan.h"

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace frugal {
namespace {

using gpu::plan_vectors;

// The plan for out = op(inputs...), all f32 (vectors of 4) unless sizes say otherwise.
gpu::VectorPlan plan(const Tensor& out, std::initializer_list<const Tensor*> inputs, int vec = 4) {
  std::vector<const Tensor*> ops{&out};
  ops.insert(ops.end(), inputs.begin(), inputs.end());
  Loop loop;
  switch (ops.size()) {
    case 1:
      loop = make_loop({ops[0]});
      break;
    case 2:
      loop = make_loop({ops[0], ops[1]});
      break;
    default:
      loop = make_loop({ops[0], ops[1], ops[2]});
  }
  std::vector<size_t> sizes;
  for (const Tensor* t : ops) sizes.push_back(size_t(t->element_size()));
  return plan_vectors(loop, vec, sizes.data(), int(ops.size()));
}

TEST(CudaVectorPlan, ContiguousScalarsAndBroadcastRowsRunOnVectors) {
  const Tensor a = zeros({1001}), b = zeros({1001}), out = zeros({1001});
  EXPECT_TRUE(plan(out, {&a, &b}).vectorizable);  // a ragged 1-D tail is fine
  EXPECT_EQ(plan(out, {&a, &b}).repeats, 0u);
  const Tensor s = zeros({});
  auto p = plan(out, {&a, &s});
  EXPECT_TRUE(p.vectorizable);
  EXPECT_EQ(p.repeats, 2u);  // the second input is one element
  const Tensor m = zeros({64, 128}), row = zeros({128}), col = zeros({64, 1}), mo = zeros({64, 128});
  p = plan(mo, {&m, &row});
  EXPECT_TRUE(p.vectorizable);
  EXPECT_EQ(p.repeats, 0u);  // the row steps along the innermost dim; it repeats down the outer one
  p = plan(mo, {&col, &m});
  EXPECT_TRUE(p.vectorizable);
  EXPECT_EQ(p.repeats, 1u);                           // the column is one element per row
  EXPECT_TRUE(plan(zeros({7, 9}), {}).vectorizable);  // fill of a matrix, merged into one run
  const Tensor cond = zeros({64, 128}, DType::Bool);
  const size_t where_sizes[] = {4, 1, 4, 4};
  const Loop wl = make_loop({&mo, &cond, &m, &row});
  EXPECT_TRUE(plan_vectors(wl, 4, where_sizes, 4).vectorizable);  // bool vectors of 4 bytes
}

TEST(CudaVectorPlan, TransposedMisalignedAndRaggedLayoutsDoNot) {
  const Tensor m = zeros({64, 128}), out = zeros({128, 64});
  const Tensor mt = m.t();
  EXPECT_FALSE(plan(out, {&mt}).vectorizable);  // the input steps by a row along the innermost dim
  const Tensor a = zeros({1001}), shifted = a.narrow(0, 1, 1000), o = zeros({1000});
  EXPECT_FALSE(plan(o, {&shifted}).vectorizable);  // 4 bytes past a 16-byte boundary
  const Tensor wide = zeros({64, 130}), row = zeros({130}), wo = zeros({64, 130});
  EXPECT_FALSE(plan(wo, {&wide, &row}).vectorizable);  // rows of 130 are not whole vectors of 4
  const Tensor cut = wide.narrow(1, 0, 128), co = zeros({64, 128});
  EXPECT_FALSE(plan(co, {&cut}).vectorizable);  // whole vectors, but rows 520 bytes apart
  const Tensor h = zeros({64, 12}, DType::BF16), ho = zeros({64, 12}, DType::BF16);
  EXPECT_TRUE(plan(ho, {&h}, 8).vectorizable);  // contiguous: merged into one run of 768
  const Tensor hrow = zeros({12}, DType::BF16);
  EXPECT_FALSE(plan(ho, {&h, &hrow}, 8).vectorizable);  // rows of 12 are not whole vectors of 8
}

}  // namespace
}  // namespace frugal
