// CUDA elementwise ops of two inputs (FRUGAL_BINARY_OPS and FRUGAL_COMPARE_OPS in core/op_table.h) and where:
// f32, f16 and bf16 computing in f32, i64 and i32 for the arithmetic, every dtype for the comparisons and
// where. Broadcasting is the Loop's (stride 0); a scalar operand is read once per thread.
#include "core/op_table.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/types.cuh"

namespace frugal {
namespace {

using gpu::BinaryFn;
using gpu::for_types;
using gpu::launch_elementwise;
using gpu::Types;

template <typename T, typename Op>
void binary_cuda(const Loop& loop, const OpArgs&) {
  launch_elementwise<T, T, T>(loop, BinaryFn<T, Op>{Op{}}, "launch of an elementwise kernel");
}

template <typename T, typename Op>
struct CompareFn {
  Op op;
  __device__ bool operator()(T x, T y) const { return op(gpu::load(x), gpu::load(y)); }
};
template <typename T, typename Op>
void compare_cuda(const Loop& loop, const OpArgs&) {
  launch_elementwise<bool, T, T>(loop, CompareFn<T, Op>{Op{}}, "launch of a comparison kernel");
}

template <typename T>
struct WhereFn {
  __device__ T operator()(bool c, T x, T y) const { return c ? x : y; }
};
template <typename T>
void where_cuda(const Loop& loop, const OpArgs&) {
  launch_elementwise<T, bool, T, T>(loop, WhereFn<T>{}, "launch of the where kernel");
}

const bool kRegistered = [] {
  const gpu::Floating floating;
  const Types<float, Half, BFloat16, int64_t, int32_t> numeric;
  auto reg_all = [](auto types, auto reg) { for_types(types, reg); };
#define FRUGAL_REG(name, Op, types, kernel)                           \
  reg_all(types, [](auto t) {                                         \
    using T = decltype(t);                                            \
    op_##name.set(DeviceType::CUDA, dtype_v<T>, kernel<T, math::Op>); \
  });
  FRUGAL_REG(add, Add, numeric, binary_cuda)
  FRUGAL_REG(sub, Sub, numeric, binary_cuda)
  FRUGAL_REG(mul, Mul, numeric, binary_cuda)
  FRUGAL_REG(div, Div, floating, binary_cuda)
  FRUGAL_REG(pow, Pow, numeric, binary_cuda)
  FRUGAL_REG(maximum, Maximum, numeric, binary_cuda)
  FRUGAL_REG(minimum, Minimum, numeric, binary_cuda)
  const Types<float, Half, BFloat16, int64_t, int32_t, uint8_t, bool> comparable;
  FRUGAL_REG(eq, Eq, comparable, compare_cuda)
  FRUGAL_REG(ne, Ne, comparable, compare_cuda)
  FRUGAL_REG(lt, Lt, comparable, compare_cuda)
  FRUGAL_REG(le, Le, comparable, compare_cuda)
  FRUGAL_REG(gt, Gt, comparable, compare_cuda)
  FRUGAL_REG(ge, Ge, comparable, compare_cuda)
#undef FRUGAL_REG
  for_types(gpu::AllTypes{},
            [](auto t) { op_where.set(DeviceType::CUDA, dtype_v<decltype(t)>, where_cuda<decltype(t)>); });
  return true;
}();

}  // namespace
}  // namespace frugal
