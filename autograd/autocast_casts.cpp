// The recorded casts of autocast, and its cache of weight casts (Note [autocast policy], amp/autocast.h).
#include "autograd/autocast_casts.h"

#include "autograd/functions.h"

namespace frugal::autograd::detail {

Tensor autocast_to(const Tensor& x, DType dtype) {
  // As PyTorch, only leaves that require grad (weights) cast down are cached: activations are cast once
  // anyway, and casts up are cheap to redo.
  if (!(x.is_leaf() && x.requires_grad()) || dtype == DType::F32) return cast(x, dtype);
  amp::detail::CacheEntry& e = amp::detail::cache_slot(x, dtype);
  const bool recording = grad_mode_enabled();
  bool usable = e.cast.defined() && e.storage == x.storage().get() && e.version == x.storage()->version();
  if (usable && recording) {
    // A cast made under no-grad has no node, and one whose node a backward already ran (an autocast region
    // spanning several iterations) has a released node: neither can carry a gradient now.
    const auto& meta = e.cast.autograd_meta();
    usable = meta && meta->grad_fn && !meta->grad_fn->released;
  }
  if (!usable) {
    e.source = x;
    e.cast = cast(x, dtype);
    e.storage = x.storage().get();
    e.version = x.storage()->version();
  }
  return e.cast;
}

}  // namespace frugal::autograd::detail
