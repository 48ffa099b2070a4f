// The dry run (core/estimate.h): the meta device's backing, the swap of its simulated arena, and what an
// estimate reports.
#include "core/estimate.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>

#include "core/allocator_base.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace frugal::memory {

// Note [data-dependent sizes in a dry run]
// A meta tensor has no values, so wherever the real run's allocations depend on values, the dry run takes
// one case and says so here and where it happens:
// - index bounds (core/ops_index.cpp integer_range): the same min/max reductions are made, and the indices
//   are taken to be in range;
// - a sparse gradient's coalescing (autograd/sparse.cpp): as many distinct rows as indices, the worst case,
//   so SparseAdam's update is estimated for the most rows a batch can touch;
// - GradScaler (optim/grad_scaler.cpp): the gradients are finite, the step is taken;
// - gradient clipping (optim/clip_grad.cpp): the norm's reductions are made, the norm is taken as large
//   (the gradients are clipped: the case that allocates);
// - BatchNorm's cumulative average (momentum none) reads its batch count: taken as 1.
// Everything else a training step allocates depends only on shapes and dtypes.

namespace {

class MetaBacking final : public Backing {
 public:
  void* alloc(int64_t nbytes) override {
    // 2 MiB apart, so that a trace shows segments at tidy addresses; from 2^62 up, far from wrapping.
    const uint64_t at = next_;
    next_ += uint64_t(detail::round_up(std::max<int64_t>(nbytes, 1), 2 * detail::kMiB));
    return reinterpret_cast<void*>(at);
  }
  void free(void*, int64_t) override {}
  bool uses_streams() const override { return false; }

 private:
  uint64_t next_ = uint64_t(1) << 62;
};

std::mutex g_estimate_mu;
int64_t g_installed_resident = 0;  // of the meta arena installed now (guarded by g_estimate_mu)

// Note [counted work in a dry run]
// A dry run runs no arithmetic, but it passes through every op a real step runs, in the same order, so it can
// count what the step will do: OpTable::get counts each meta kernel fetched (one call of a kernel, with the
// op layer's overhead around it), the ops that multiply matrices add their FLOPs (2 m n k a GEMM; the three
// directions of a convolution; attention's products, half of them under a causal mask) and the bytes of the
// operands they read (A and B of a GEMM, and C where it accumulates: a layer's weight once for every product
// that reads it, which a step in k micro-batches does k times), and the timeline gives the bytes every
// allocation asked for, which the memory-bound ops write and read. memory::plan prices these four (Note [the
// planner's cost model], core/plan.h). The counts are of this process's dry run; one
// runs at a time (g_estimate_mu), so plain atomics hold them.
std::atomic<int64_t> g_meta_kernels{0};
std::atomic<double> g_meta_flops{0};
std::atomic<double> g_meta_operand_bytes{0};

}  // namespace

std::unique_ptr<Backing> detail::make_meta_backing() { return std::make_unique<MetaBacking>(); }

Estimate estimate(const std::function<void(Device)>& step, const EstimateOptions& options) {
  FRUGAL_CHECK(step != nullptr, "memory::estimate: the step function is empty");
  FRUGAL_CHECK(!options.from() || !options.from()->is_meta(),
               "memory::estimate: `from` must be a real device, got ", *options.from());
  std::lock_guard lock(g_estimate_mu);
  Estimate e;
  const Allocator* source = options.from() ? &allocator(*options.from()) : nullptr;
  std::unique_ptr<Allocator> sim =
      detail::make_simulated_arena(kMeta, detail::make_meta_backing(), source, &e.resident);
  if (source) e.source_peak = source->stats().allocated.peak;
  if (options.limit()) sim->set_limit(*options.limit());
  std::unique_ptr<Allocator> old = detail::swap_meta_allocator(std::move(sim));
  if (const int64_t held = old->stats().allocated.current - g_installed_resident; held != 0) {
    detail::swap_meta_allocator(std::move(old));  // its tensors still use it: put it back
    throw Error(frugal::detail::str_cat(
        "memory::estimate: ", format_bytes(held),
        " of meta tensors from an earlier dry run (or made outside one) are still alive; drop them first"));
  }
  g_installed_resident = e.resident;
  old.reset();

  Allocator& meta = allocator(kMeta);
  {
    History history(kMeta, options.max_events());
    // A dry run changes nothing a real run would see: the default generator is as it was (a trainer that
    // estimates and then trains draws the weights it would have drawn without the estimate).
    struct KeepRng {
      Generator::State state = default_generator().state();
      ~KeepRng() { default_generator().set_state(state); }
    } keep_rng;
    DefaultDeviceGuard on_meta(kMeta);
    g_meta_kernels = 0;
    g_meta_flops = 0;
    g_meta_operand_bytes = 0;
    try {
      step(kMeta);
    } catch (const OutOfMemoryError& oom) {
      e.out_of_memory = true;
      e.error = oom.what();
    }
    e.timeline = memory::history(kMeta);
    e.kernel_calls = g_meta_kernels.load();
    e.flops = g_meta_flops.load();
    e.operand_bytes = g_meta_operand_bytes.load();
  }
  if (!e.timeline.truncated)
    for (const HistoryEvent& ev : e.timeline.events)
      if (ev.kind == EventKind::Alloc) e.bytes_allocated += ev.requested;
  e.stats = meta.stats();
  e.peak_allocated = e.stats.allocated.peak;
  e.peak_reserved = e.stats.reserved.peak;
  e.peak_requested = e.stats.requested.peak;
  e.tags = meta.tag_stats();
  if (!e.timeline.truncated) e.at_peak = peak_by_category(e.timeline);
  return e;
}

std::string Estimate::summary(int max_tags) const {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-24s %14s\n", "estimated peak", "bytes");
  out += line;
  for (int c = 0; c < kNumCategories; ++c) {
    std::snprintf(line, sizeof line, "  %-22s %14s\n", category_name(Category(c)),
                  format_bytes(at_peak.by_category[size_t(c)]).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-22s %14s (reserved %s)\n", "allocated",
                format_bytes(peak_allocated).c_str(), format_bytes(peak_reserved).c_str());
  out += line;
  std::vector<TagStats> top = tags;
  std::sort(top.begin(), top.end(),
            [](const TagStats& a, const TagStats& b) { return a.allocated.peak > b.allocated.peak; });
  if (int(top.size()) > max_tags) top.resize(size_t(std::max(max_tags, 0)));
  for (const TagStats& t : top) {
    if (t.allocated.peak == 0) continue;
    std::snprintf(line, sizeof line, "  tag %-18s %14s (peak)\n",
                  t.tag.empty() ? "(untagged)" : t.tag.c_str(), format_bytes(t.allocated.peak).c_str());
    out += line;
  }
  if (out_of_memory) out += "  out of memory under the limit: " + error.substr(0, error.find('\n')) + "\n";
  return out;
}

}  // namespace frugal::memory

namespace frugal::detail {
void note_meta_kernel() { memory::g_meta_kernels.fetch_add(1, std::memory_order_relaxed); }
void note_meta_product(double flops, double operand_bytes) {
  memory::g_meta_flops.fetch_add(flops, std::memory_order_relaxed);
  memory::g_meta_operand_bytes.fetch_add(operand_bytes, std::memory_order_relaxed);
}
}  // namespace frugal::detail
