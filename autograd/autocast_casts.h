// A stand-in for the old per-list casts, for autograd/grad_elementwise.cpp only until it calls amp::autocast
// (another change is moving it); remove this header then. The policy itself is in amp/autocast.h.
#pragma once

#include "../amp/autocast.h"

namespace frugal::autograd {

// amp::autocast with the f32 list, whatever the op's name.
inline Tensor autocast_f32(const Tensor& x) {
  return amp::is_autocast_enabled() ? amp::detail::autocast_input(x, amp::CastPolicy::F32) : x;
}

}  // namespace frugal::autograd
