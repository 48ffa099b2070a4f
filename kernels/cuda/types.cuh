// Type lists for the CUDA registration blocks: for_types(Types<float, Half>{}, [](auto t) { ... }).
#pragma once

namespace frugal::gpu {

template <typename... Ts>
struct Types {};

template <typename... Ts, typename F>
void for_types(Types<Ts...>, F f) {
  (f(Ts{}), ...);
}

using Floating = Types<float, Half, BFloat16>;  // what the GPU computes in (f64 only moves and converts)
using AllTypes = Types<float, double, Half, BFloat16, int64_t, int32_t, uint8_t, bool>;

}  // namespace frugal::gpu
