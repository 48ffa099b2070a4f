// CUDA elementwise ops of one input (FRUGAL_UNARY_OPS in core/op_table.h): f32, f16 and bf16 computing in
// f32, and the integer forms of neg, abs, relu and clamp. The math is kernels/cuda/math.h's.
#include "core/op_table.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/types.cuh"

namespace frugal {
namespace {

using gpu::for_types;
using gpu::launch_elementwise;
using gpu::Types;
using gpu::UnaryFn;

template <typename T, typename Op>
void unary_cuda(const Loop& loop, const OpArgs&) {
  launch_elementwise<T, T>(loop, UnaryFn<T, Op>{Op{}}, "launch of an elementwise kernel");
}

template <typename T>
void clamp_cuda(const Loop& loop, const OpArgs& args) {
  using C = acc_t<T>;
  launch_elementwise<T, T>(loop, UnaryFn<T, math::Clamp<C>>{math::Clamp<C>(args.a, args.b)},
                           "launch of the clamp kernel");
}

const bool kRegistered = [] {
  const gpu::Floating floating;
  const Types<int64_t, int32_t> integers;
  auto reg_all = [](auto types, auto reg) { for_types(types, reg); };
#define FRUGAL_REG(name, Op, types)                                       \
  reg_all(types, [](auto t) {                                             \
    using T = decltype(t);                                                \
    op_##name.set(DeviceType::CUDA, dtype_v<T>, unary_cuda<T, math::Op>); \
  });
  FRUGAL_REG(neg, Neg, floating)
  FRUGAL_REG(abs, Abs, floating)
  FRUGAL_REG(exp, Exp, floating)
  FRUGAL_REG(log, Log, floating)
  FRUGAL_REG(sqrt, Sqrt, floating)
  FRUGAL_REG(rsqrt, Rsqrt, floating)
  FRUGAL_REG(relu, Relu, floating)
  FRUGAL_REG(gelu, Gelu, floating)
  FRUGAL_REG(gelu_tanh, GeluTanh, floating)
  FRUGAL_REG(sigmoid, Sigmoid, floating)
  FRUGAL_REG(tanh, Tanh, floating)
  FRUGAL_REG(silu, Silu, floating)
  FRUGAL_REG(erf, Erf, floating)
  FRUGAL_REG(neg, Neg, integers)
  FRUGAL_REG(abs, Abs, integers)
  FRUGAL_REG(relu, Relu, integers)
#undef FRUGAL_REG
  for_types(Types<float, Half, BFloat16, int64_t, int32_t>{},
            [](auto t) { op_clamp.set(DeviceType::CUDA, dtype_v<decltype(t)>, clamp_cuda<decltype(t)>); });
  return true;
}();

}  // namespace
}  // namespace frugal
