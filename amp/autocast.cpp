// The autocast state per thread, its guard, and the cache of weight casts (Note [autocast policy]).
#include "amp/autocast.h"

#include <map>
#include <utility>

#include "core/error.h"

namespace frugal::amp {

namespace {
thread_local AutocastState t_state;
thread_local int t_enabled_guards = 0;  // live guards that enabled autocast: the cache lives while > 0
// Keyed by the leaf's autograd metadata (a leaf that requires grad always has one, shared by all its
// handles).
thread_local std::map<std::pair<const void*, DType>, detail::CacheEntry> t_cache;
}  // namespace

AutocastState autocast_state() { return t_state; }
bool is_autocast_enabled() { return t_state.enabled; }
DType autocast_dtype() { return t_state.dtype; }

Autocast::Autocast(DType dtype, bool enabled) : prev_(t_state), counted_(enabled) {
  FRUGAL_CHECK_DTYPE(dtype == DType::F16 || dtype == DType::BF16,
                     "amp::Autocast: the dtype must be f16 or bf16, got ", dtype_name(dtype),
                     "; use Autocast(dtype, /*enabled=*/false) to turn autocast off in a region");
  t_state = {enabled, dtype};
  if (enabled) ++t_enabled_guards;
}

Autocast::~Autocast() {
  if (counted_ && --t_enabled_guards == 0) t_cache.clear();
  t_state = prev_;
}

detail::CacheEntry& detail::cache_slot(const Tensor& leaf, DType dtype) {
  return t_cache[{leaf.autograd_meta().get(), dtype}];
}

int64_t cached_casts() { return int64_t(t_cache.size()); }

}  // namespace frugal::amp
