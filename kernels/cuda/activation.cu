// CUDA kernels of the activations' one-pass gradients (op_gelu_backward, op_gelu_tanh_backward,
// op_relu_backward; formulas in core/op_table.h): operands dx, dy, x of one dtype through the elementwise
// launcher, f16/bf16 computing in f32. The math is kernels/cuda/math.h's.
#include "core/op_table.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/types.cuh"

namespace frugal {
namespace {

template <typename T, typename Op>
void activation_backward_cuda(const Loop& loop, const OpArgs&) {
  gpu::launch_elementwise<T, T, T>(loop, gpu::BinaryFn<T, Op>{Op{}},
                                   "launch of an activation gradient kernel");
}

const bool kRegistered = [] {
  gpu::for_types(gpu::Floating{}, [](auto t) {
    using T = decltype(t);
    op_gelu_backward.set(DeviceType::CUDA, dtype_v<T>, activation_backward_cuda<T, math::GeluBackward>);
    op_gelu_tanh_backward.set(DeviceType::CUDA, dtype_v<T>,
                              activation_backward_cuda<T, math::GeluTanhBackward>);
    op_relu_backward.set(DeviceType::CUDA, dtype_v<T>, activation_backward_cuda<T, math::ReluBackward>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
