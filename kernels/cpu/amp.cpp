// CPU kernel of loss scaling: the non-finite check and unscale of a gradient in one pass
// (optim/grad_scaler.h). Its naive reference is in tests/optim/test_grad_scaler.cpp.
#include <atomic>
#include <cmath>
#include <limits>

#include "core/op_table_optim.h"
#include "core/parallel.h"
#include "kernels/cpu/register.h"

namespace frugal {
namespace {

using cpu::for_types;

// grad (n, T), updated in place; *found_inf (one f32 in host memory) set to 1 when some element is inf or
// nan.
template <typename T>
void non_finite_check_and_unscale_cpu(const UnscaleArgs& a) {
  using C = acc_t<T>;
  T* grad = static_cast<T*>(a.grad);
  const C inv = C(a.inv_scale), max = std::numeric_limits<C>::max();
  const bool scale = a.inv_scale != 1.0f;
  std::atomic<bool> found{false};
  parallel_for(0, a.n, parallel_grain(), [&](int64_t begin, int64_t end) {
    bool bad = false;
    if (scale) {
      for (int64_t i = begin; i < end; ++i) {
        const C v = C(grad[i]);
        bad |= !(std::abs(v) <= max);  // false for inf, and for nan (every comparison with it is false)
        grad[i] = T(v * inv);
      }
    } else {
      for (int64_t i = begin; i < end; ++i) bad |= !(std::abs(C(grad[i])) <= max);
    }
    if (bad) found.store(true, std::memory_order_relaxed);
  });
  if (found.load()) *a.found_inf = 1.0f;
}

const bool kRegistered = [] {
  for_types<float, double, Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_non_finite_check_and_unscale.set(DeviceType::CPU, dtype_v<T>, non_finite_check_and_unscale_cpu<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
