// memory::estimate: a dry run of a training step on the meta device (Note [the meta device], core/device.h)
// that says what the step's memory peak will be before any of that memory exists. The step allocates in a
// simulated caching arena that runs the real algorithm over virtual addresses (Note [a simulated arena]), so
// the peak is the arena's own figure, not a formula: rounding, small and large segments, splits, merges and
// the cache all count as they will in the real run.
//
//   auto e = memory::estimate([&](Device d) {
//     auto model = make_model();                         // parameters on the meta device: no bytes
//     optim::AdamW opt(model->parameters(), optim::AdamWOptions(1e-3));
//     for (int step = 0; step < 2; ++step) {            // the second step holds Adam's lazy state
//       auto x = empty({64, 784}, TensorOptions().device(d));
//       auto y = empty({64}, TensorOptions(DType::I64).device(d));
//       opt.zero_grad();
//       nn::functional::cross_entropy(model->forward(x), y).backward();
//       opt.step();
//     }
//   });
//   e.peak_allocated;                                    // bytes, as memory::stats().allocated.peak will say
//   std::cout << e.summary();                            // by category at the peak, and the largest tags
//
// What a dry run cannot know, it assumes (Note [data-dependent sizes in a dry run], core/estimate.cpp):
// values are finite (a GradScaler never skips a step), indices are in range, and a sparse gradient touches as
// many distinct rows as it has indices (the worst case).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "memory.h"
#include "memory_history.h"
#include "options.h"
#include "tensor.h"

namespace frugal::memory {

// memory::EstimateOptions().from(kCPU).limit(1 << 30)
struct EstimateOptions {
  // Start from this device's arena as it is now (its live blocks, cached segments and statistics; a loaded
  // dataset, say) rather than from an empty arena: the estimate is then that of running the step next there.
  FRUGAL_ARG(std::optional<Device>, from);
  // The simulated arena's memory limit (<= 0: none); by default `from`'s, or none. Under a limit the dry run
  // frees the cache and fails exactly where the real run would (out_of_memory below).
  FRUGAL_ARG(std::optional<int64_t>, limit);
  FRUGAL_ARG(size_t, max_events) = kDefaultMaxEvents;  // of the timeline (Note [history bounds])
};

struct Estimate {
  int64_t peak_allocated = 0;  // the simulated arena's peaks over the step (with what `from` held)
  int64_t peak_reserved = 0;
  int64_t peak_requested = 0;
  int64_t resident = 0;        // bytes live when the step began (those of `from`)
  int64_t source_peak = 0;     // `from`'s allocated peak so far: a whole run peaks at the larger of the two
  PeakBreakdown at_peak;       // live bytes by category at the peak, and each category's own peak
  std::vector<TagStats> tags;  // per tag (peaks since the step began)
  Stats stats;                 // the simulated arena's at the end: segments, allocations, fragmentation
  HistoryRecord timeline;      // every allocation and free (memory::write_trace / write_svg draw it)
  bool out_of_memory = false;  // the step threw OutOfMemoryError under the limit...
  std::string error;           // ...with this message
  // The work the step stands for (Note [counted work in a dry run], core/estimate.cpp): the FLOPs of its
  // matrix products (GEMMs, linear layers, convolutions, attention), the kernels its ops called, and the
  // bytes they allocated (0 when the timeline was truncated). memory::plan's cost model prices them.
  double flops = 0;
  double operand_bytes = 0;  // what those products read: their operands' bytes, once a product
  int64_t kernel_calls = 0;
  int64_t bytes_allocated = 0;
  bool fits() const { return !out_of_memory; }
  // The peak, by category, and the tags with the highest peaks (at most max_tags), as a table.
  std::string summary(int max_tags = 8) const;
};

// Runs step(kMeta) once, with every allocation in a fresh simulated arena, and returns what it used. The
// step makes everything it needs on the device it is given (a model, its optimizer, batches: tensors made
// without a device go there, DefaultDeviceGuard in core/tensor.h; values from the host are copied in with
// .to(d)), and leaves the default generator as it found it. It runs as
// many steps as the peak needs (two for an optimizer whose state appears at the first step). Meta tensors
// of an earlier dry run must be gone (Error otherwise); one dry run at a time per process. Errors of the
// step other than OutOfMemoryError propagate.
Estimate estimate(const std::function<void(Device)>& step, const EstimateOptions& options = {});

namespace detail {
// What reading t's values as dtype allocates on the cpu (Tensor::to_vector's copy, core/tensor.cpp, which
// shares the code), made on t's device.
void read_allocations(const Tensor& t, DType dtype);
}  // namespace detail
// t.item<T>(), except on the meta device, where it makes the allocations item() makes and returns what the
// dry run assumes instead (Note [data-dependent sizes in a dry run], core/estimate.cpp).
template <typename T>
T item_or(const Tensor& t, T dry_run_value) {
  if (!t.device().is_meta()) return t.item<T>();
  FRUGAL_CHECK(t.numel() == 1, "item: expected a tensor with one element, got shape ", t.shape());
  detail::read_allocations(t, dtype_v<T>);
  return dry_run_value;
}

}  // namespace frugal::memory
