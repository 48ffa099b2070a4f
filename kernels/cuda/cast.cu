// CUDA casts between every pair of dtypes (op_cast, keyed by the output dtype, args.a the input's) and fill.
// A cast computes through the source's compute type as the CPU kernel does: to bool is != 0, floats to
// integers as Note [float to integer casts] (kernels/cpu/elementwise.cpp) says, the 16-bit floats round to
// nearest even. Same-dtype contiguous copies are a
// cudaMemcpyAsync.
#include "core/op_table.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/types.cuh"

namespace frugal {
namespace {

using gpu::for_types;
using gpu::launch_elementwise;

template <typename To, typename From>
struct CastFn {
  __device__ To operator()(From v) const { return gpu::store<To>(math::convert<acc_t<To>>(gpu::load(v))); }
};

template <typename To>
void cast_cuda(const Loop& loop, const OpArgs& args) {
  visit_dtype(DType(int(args.a)), [&](auto from_tag) {
    using From = decltype(from_tag);
    if constexpr (std::is_same_v<To, From>) {
      if (loop.ndim == 1 && loop.strides[0][0] == int64_t(sizeof(To)) &&
          loop.strides[1][0] == int64_t(sizeof(To))) {
        gpu::LaunchOn on(loop.data[0]);
        FRUGAL_CUDA_CHECK(cudaMemcpyAsync(loop.data[0], loop.data[1], size_t(loop.numel) * sizeof(To),
                                          cudaMemcpyDeviceToDevice, on.stream));
        return;
      }
    }
    launch_elementwise<To, From>(loop, CastFn<To, From>{}, "launch of a cast kernel");
  });
}

template <typename T>
struct FillFn {
  T value;
  __device__ T operator()() const { return value; }
};
// The value is converted on the host, as the CPU kernel converts it.
template <typename T>
void fill_cuda(const Loop& loop, const OpArgs& args) {
  T value;
  if constexpr (std::is_same_v<T, bool>)
    value = args.a != 0;
  else if constexpr (std::is_integral_v<T>)
    value = math::float_to_int<T>(args.a);  // Note [float to integer casts]
  else
    value = T(acc_t<T>(args.a));
  launch_elementwise<T>(loop, FillFn<T>{value}, "launch of the fill kernel");
}

const bool kRegistered = [] {
  for_types(gpu::AllTypes{}, [](auto t) {
    using T = decltype(t);
    op_cast.set(DeviceType::CUDA, dtype_v<T>, cast_cuda<T>);
    op_fill.set(DeviceType::CUDA, dtype_v<T>, fill_cuda<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
