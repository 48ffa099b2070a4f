// CUDA elementwise ops of one input, registered from core/op_list.h (its dtype classes as
// kernels/cuda/elementwise.cuh maps them: f32, f16 and bf16 computing in f32, i64 and i32 for the numeric
// ones). The math is kernels/math.h's functors, shared with the CPU.
#include "core/op_table.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/types.cuh"

namespace frugal {
namespace {

using gpu::for_types;
using gpu::launch_elementwise;
using gpu::UnaryFn;

template <typename T, typename Op>
void unary_cuda(const Loop& loop, const OpArgs&) {
  launch_elementwise<T, T>(loop, UnaryFn<T, Op>{Op{}}, "launch of an elementwise kernel");
}

// An op with two Scalar parameters: its functor built from them once per launch.
template <typename T, template <typename> class Op>
void unary_param_cuda(const Loop& loop, const OpArgs& args) {
  using C = acc_t<T>;
  launch_elementwise<T, T>(loop, UnaryFn<T, Op<C>>{Op<C>(args.a, args.b)}, "launch of an elementwise kernel");
}

const bool kRegistered = [] {
#define FRUGAL_REG_UNARY(name, F, dtypes, ...)                           \
  for_types(gpu::dtypes##_types{}, [](auto t) {                          \
    using T = decltype(t);                                               \
    op_##name.set(DeviceType::CUDA, dtype_v<T>, unary_cuda<T, math::F>); \
  });
#define FRUGAL_REG_UNARY_PARAM(name, F, dtypes, ...)                           \
  for_types(gpu::dtypes##_types{}, [](auto t) {                                \
    using T = decltype(t);                                                     \
    op_##name.set(DeviceType::CUDA, dtype_v<T>, unary_param_cuda<T, math::F>); \
  });
  FRUGAL_UNARY_OP_LIST(FRUGAL_REG_UNARY)
  FRUGAL_UNARY_PARAM_OP_LIST(FRUGAL_REG_UNARY_PARAM)
#undef FRUGAL_REG_UNARY
#undef FRUGAL_REG_UNARY_PARAM
  return true;
}();

}  // namespace
}  // namespace frugal
