// The W2 training step on the GPU for gpu_bench's table (bench/cuda/w2_step.cpp).
#pragma once

#include <optional>

#include "core/dtype.h"

namespace frugal::bench {

// One W2 step (shared/WORKLOADS.md: examples/fmnist.h's CNN, Adam 1e-3, batch 64) on cuda:0, on one fixed
// synthetic batch of Fashion-MNIST's shape (the GPU machine has no dataset): forward under autocast to
// `autocast` (none: f32), cross-entropy, backward, optimizer step. median_ms is the median wall time per step
// with the device synchronised after each; the losses of the first and last timed steps show that the step
// learns (the last is lower on a fixed batch).
struct W2StepTiming {
  double median_ms = 0;
  double first_loss = 0, last_loss = 0;
};
W2StepTiming time_w2_step(std::optional<DType> autocast, int warmup = 5, int reps = 30);

}  // namespace frugal::bench
