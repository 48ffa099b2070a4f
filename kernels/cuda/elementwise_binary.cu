// CUDA elementwise ops of two inputs, registered from core/op_list.h (dtype classes mapped by
// kernels/cuda/elementwise.cuh: f32, f16 and bf16 computing in f32, i64 and i32 for the arithmetic, bool for
// add and mul, every dtype but f64 for the comparisons), and where (every dtype). Broadcasting is the Loop's
// (stride 0); a scalar operand is read once per thread.
#include "core/op_table.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/types.cuh"

namespace frugal {
namespace {

using gpu::BinaryFn;
using gpu::for_types;
using gpu::launch_elementwise;

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
#define FRUGAL_REG_BINARY(name, F, dtypes, ...)                           \
  for_types(gpu::dtypes##_types{}, [](auto t) {                           \
    using T = decltype(t);                                                \
    op_##name.set(DeviceType::CUDA, dtype_v<T>, binary_cuda<T, math::F>); \
  });
#define FRUGAL_REG_COMPARE(name, F)                                        \
  for_types(gpu::all_types{}, [](auto t) {                                 \
    using T = decltype(t);                                                 \
    op_##name.set(DeviceType::CUDA, dtype_v<T>, compare_cuda<T, math::F>); \
  });
  FRUGAL_BINARY_OP_LIST(FRUGAL_REG_BINARY)
  FRUGAL_COMPARE_OP_LIST(FRUGAL_REG_COMPARE)
#undef FRUGAL_REG_BINARY
#undef FRUGAL_REG_COMPARE
  for_types(gpu::AllTypes{},
            [](auto t) { op_where.set(DeviceType::CUDA, dtype_v<decltype(t)>, where_cuda<decltype(t)>); });
  return true;
}();

}  // namespace
}  // namespace frugal
