// The autocast state per thread, its guard, the policy's table and its casts with their cache of weight
// casts (Note [autocast policy]).
#include "amp/autocast.h"

#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "autograd/functions.h"
#include "core/error.h"
#include "core/op_list.h"

namespace frugal::amp {

namespace {
thread_local AutocastState t_state;
thread_local int t_enabled_guards = 0;  // live guards that enabled autocast: the cache lives while > 0
// A cast of a leaf that requires grad, cached while the outermost enabled guard lives.
struct CacheEntry {
  Tensor source;  // keeps the leaf alive, so its identity cannot be reused while cached
  Tensor cast;
  uint64_t version = 0;  // the leaf's storage version when cast
  const void* storage = nullptr;
};
// Keyed by the leaf's autograd metadata (a leaf that requires grad always has one, shared by all its
// handles).
thread_local std::map<std::pair<const void*, DType>, CacheEntry> t_cache;
// The keys in the order the entries were made: the cache is emptied in that order, not in the map's (which
// follows heap addresses), so that a run frees the casts in the same order every time and a dry run
// (core/estimate.h) repeats it event for event.
thread_local std::vector<std::pair<const void*, DType>> t_cache_order;

void clear_cache() {
  for (const auto& key : t_cache_order) t_cache.erase(key);
  t_cache_order.clear();
}

// The lists of Note [autocast policy], by the name of each op's differentiable function.
struct PolicyRow {
  const char* op;
  CastPolicy policy;
};
// The two values of op_list.h's autocast column.
constexpr CastPolicy kElementwise_none = CastPolicy::Keep;
constexpr CastPolicy kElementwise_f32 = CastPolicy::F32;
constexpr PolicyRow kPolicy[] = {
    // GEMM-like, in the guard's dtype.
    {"matmul", CastPolicy::Lower},
    {"linear", CastPolicy::Lower},
    {"conv2d", CastPolicy::Lower},
    // Numerically sensitive, in f32.
    {"softmax", CastPolicy::F32},
    {"log_softmax", CastPolicy::F32},
    {"sum", CastPolicy::F32},
    {"mean", CastPolicy::F32},
    {"var", CastPolicy::F32},
// The elementwise ops: their autocast column in core/op_list.h (f32: exp, log, rsqrt, pow, softplus).
#define FRUGAL_POLICY_ROW(name, F, dtypes, autocast, ...) {#name, kElementwise_##autocast},
    FRUGAL_UNARY_OP_LIST(FRUGAL_POLICY_ROW) FRUGAL_UNARY_PARAM_OP_LIST(FRUGAL_POLICY_ROW)
        FRUGAL_BINARY_OP_LIST(FRUGAL_POLICY_ROW)
#undef FRUGAL_POLICY_ROW
            {"layer_norm", CastPolicy::F32},
    {"batch_norm", CastPolicy::F32},
    {"cross_entropy", CastPolicy::F32},  // its composite; the fused kernel takes L (cross_entropy_rows)
    {"nll_loss", CastPolicy::F32},
    {"mse_loss", CastPolicy::F32},
    {"l1_loss", CastPolicy::F32},
    {"kl_div", CastPolicy::F32},
    {"binary_cross_entropy_with_logits", CastPolicy::F32},
    // Fused, computing in f32 from L inputs themselves.
    {"cross_entropy_rows", CastPolicy::Keep},
    {"attention_scores_softmax", CastPolicy::Keep},
};

// The recorded cast to dtype. As PyTorch, only leaves that require grad (weights) cast down are cached:
// activations are cast once anyway, and casts up are cheap to redo.
Tensor cast_to(const Tensor& x, DType dtype) {
  if (!(x.is_leaf() && x.requires_grad()) || dtype == DType::F32) return cast(x, dtype);
  const std::pair<const void*, DType> key{x.autograd_meta().get(), dtype};
  auto [it, inserted] = t_cache.try_emplace(key);
  if (inserted) t_cache_order.push_back(key);
  CacheEntry& e = it->second;
  const bool recording = autograd::grad_mode_enabled();
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
  if (counted_ && --t_enabled_guards == 0) clear_cache();
  t_state = prev_;
}

CastPolicy cast_policy(const char* op) {
  for (const PolicyRow& row : kPolicy)
    if (std::strcmp(row.op, op) == 0) return row.policy;
  FRUGAL_ASSERT(false, "amp::cast_policy: no autocast policy for the op '", op,
                "'; add it to kPolicy (amp/autocast.cpp)");
  return CastPolicy::Keep;
}

Tensor detail::autocast_input(const Tensor& x, CastPolicy policy) {
  if (!x.defined()) return x;
  const DType t = x.dtype();
  switch (policy) {
    case CastPolicy::Lower: {
      const DType low = autocast_dtype();
      if (!is_floating(t) || t == DType::F64 || t == low) return x;
      return cast_to(x, low);
    }
    case CastPolicy::F32:
      if (t != DType::F16 && t != DType::BF16) return x;
      return cast_to(x, DType::F32);
    case CastPolicy::Keep:
      break;
  }
  return x;
}

int64_t cached_casts() { return int64_t(t_cache.size()); }

}  // namespace frugal::amp
