// CUDA kernels of the activations' one-pass gradients (op_gelu_backward, op_gelu_tanh_backward,
// op_relu_backward, op_gelu_and_backward; formulas in core/op_table.h): operands dx, dy, x of one dtype
// through the elementwise launcher, f16/bf16 computing in f32. The math is kernels/cuda/math.h's.
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

// op_gelu_and_backward (operands dy, y, x): gelu's kernel into y, then gelu_backward's over dy in place,
// so both results are those two ops' on the GPU bit for bit. Two passes over x: the CPU kernel's one pass
// (Note [gelu_linear's backward in one pass over x]) is not written for the GPU yet.
template <typename T>
void gelu_and_backward_cuda(const Loop& loop, const OpArgs&) {
  Loop forward = loop;  // y = gelu(x)
  forward.nops = 2;
  forward.data[0] = loop.data[1];
  forward.strides[0] = loop.strides[1];
  forward.data[1] = loop.data[2];
  forward.strides[1] = loop.strides[2];
  gpu::launch_elementwise<T, T>(forward, gpu::UnaryFn<T, math::Gelu>{math::Gelu{}},
                                "launch of gelu_and_backward's gelu");
  Loop backward = loop;  // dy = gelu_backward(dy, x)
  backward.data[1] = loop.data[0];
  backward.strides[1] = loop.strides[0];
  activation_backward_cuda<T, math::GeluBackward>(backward, {});
}

const bool kRegistered = [] {
  gpu::for_types(gpu::Floating{}, [](auto t) {
    using T = decltype(t);
    op_gelu_backward.set(DeviceType::CUDA, dtype_v<T>, activation_backward_cuda<T, math::GeluBackward>);
    op_gelu_tanh_backward.set(DeviceType::CUDA, dtype_v<T>,
                              activation_backward_cuda<T, math::GeluTanhBackward>);
    op_relu_backward.set(DeviceType::CUDA, dtype_v<T>, activation_backward_cuda<T, math::ReluBackward>);
    op_gelu_and_backward.set(DeviceType::CUDA, dtype_v<T>, gelu_and_backward_cuda<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
