// memory::plan: the fastest way to train within a memory budget, found with the dry run (core/estimate.h).
// It searches the techniques that keep training's meaning (gradient accumulation over k micro-batches, how
// many blocks run as recompute segments, the optimizer stepping in backward, and, only when allowed, bf16
// autocast), tests each candidate with a dry run under the budget as the arena's limit, and picks the one
// its cost model says is fastest.
//
//   memory::Plan p = memory::plan(
//       [&](Device, const memory::PlanChoice& c) {      // the run, as the candidate asks for it
//         model->recompute_blocks(c.recompute_blocks, c.selective_blocks);  // e.g. nn::GPT
//         ... c.micro_batches micro-batches a step, bf16 autocast when c.low_precision ...
//       },
//       budget, memory::PlanSpace().blocks(4).micro_batches({1, 2, 4, 8}));
//   if (p.fits) std::cout << p.str();                   // "2 micro-batches, recompute 1 of 4 blocks, f32
//   ..."
//
// Note [the planner's cost model]
// A candidate's step time relative to the plain run's (1 micro-batch, no recompute, f32) is predicted as
//   (1 + recompute * m / n + selective * s / n) * (1 + micro_batch * (k - 1)) * (bf16 ? low_precision : 1)
// for m of n blocks recomputed whole, s recomputed selectively and k micro-batches. The three coefficients
// (PlanCosts) are the step's own, measured before the search by dry runs without the budget: the plain step,
// every block recomputed whole, every block selective (where allowed) and the least k > 1 allowed. Each dry
// run is priced from the work it counted (Note [counted work in a dry run], core/estimate.cpp):
//   seconds = FLOPs / kFlopsPerSecond + kernel calls * kSecondsPerKernel
//             + (bytes allocated + bytes the products read) / kBytesPerSecond
// so a block's recompute costs what its forward counts (about a third of a GEMM-bound step: W3 0.34, W4
// 0.33), a selective block what its norms, activations and adds count, and each micro-batch more the kernel
// calls it repeats and the weights its products read again: much for a model of small ops (a chain of tiny
// Linears: 0.4 a micro-batch), little for one of large GEMMs (W3 0.017, W4 0.027). The rates are those of
// this project's 2-core machines (f32 GEMMs near 150 GFLOP/s, 2 us a kernel call with the op around it,
// 10 GB/s of tensors written and read); only their ratios rank the candidates. The README compares the
// coefficients with measured steps. W4 at 4 micro-batches measured 0.09-0.13 a micro-batch more (a Zen 3)
// against 0.01 counted, until its d x GEMMs of 256 rows stopped running at half speed (Note [B's rows 2 KiB
// apart], kernels/cpu/gemm.cpp): 0.06-0.07 since there, 0.01-0.04 on a Zen 4. frugal's profiler over W4's
// steps in 1 and in 4 micro-batches on the Zen 3 puts most of that in the forward's linear_relu on 256 rows
// (20-22% slower in the step, though not in a loop over one layer whose weights stay in cache), then the
// backward (3-8%) and the gradients' accumulation (1.5% of the step): the weights read from memory again.
// Until 2026-12-06 the products' operands were not counted, so that cost nothing (W4 0.01). Until 2026-12-05
// the coefficients were constants measured on W3 (1/3, 0.05 and 0.1). bf16 autocast's factor is the device's
// (low_precision_time): a build for a CPU with bf16 dot products runs its GEMMs and attention on them, and W6
// (W3 under bf16) took 0.59-0.65 of W3's step there, W4b 0.54 of W4's (a Zen 4), but W4b 1.80 of W4's on a
// Xeon whose bf16 dot products run at half the f32 FMA's flops (Note [the low-precision factor], measured
// since 2026-12-07; a constant 0.6 before); without them bf16 only saves memory, and W6 took 1.08-1.13 of
// W3's step (a Zen 3). Until 2026-12-06 bf16 was priced as no faster everywhere. Stepping in backward
// (optim::StepInBackward) does the same updates at another moment, so it costs nothing in the model (W4g
// measured within noise of W4); it frees each gradient once its update is done, so the gradients never all
// exist at once, and with recompute it is what lowers a parameter-heavy step's peak most (Note [recompute and
// stepping in backward]). It needs the whole gradient from one backward, so it goes with one micro-batch
// only. At an equal predicted time the candidate without it is tried first. The model ranks the candidates;
// it is not a timer.
//
// The search over recompute is exhaustive: each block of the chain runs plain, selectively or wholly
// recomputed. For a chain of identical blocks (the GPT's) what a candidate saves and costs depends only on
// how many blocks take each form, not which (the model chooses: nn::GPT's first ones, which backward reaches
// last), so the candidates are the pairs (m, s) with m + s <= n, (n + 1)(n + 2) / 2 of them. For each
// micro-batch count they are tried in ascending predicted time with a dry run each, and the first that fits
// is the fastest that fits: no cheaper candidate is left untried, whatever shape the peak has as m and s grow
// (it need not fall: W1's re-run segment costs about what it saves). That is the optimum a dynamic program
// over the chain (Chen 2016's sqrt(n) is its uniform special case; Checkmate's and revolve's schedules its
// refinements) finds, measured by the dry run instead of a memory formula.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "estimate.h"
#include "options.h"

namespace frugal::memory {

// The cost model's rates (Note [the planner's cost model]).
inline constexpr double kFlopsPerSecond = 150e9;
inline constexpr double kSecondsPerKernel = 2e-6;
inline constexpr double kBytesPerSecond = 10e9;

// A dry run's counted work priced in seconds by the rates above.
double predicted_seconds(const Estimate& e);

// A step under bf16 autocast over the same step in f32 on `device` (Note [the planner's cost model]): on a
// CPU build with bf16 dot products (AVX512_BF16) the time of their flops over the f32 FMA's, measured once
// per process (Note [the low-precision factor], core/plan.cpp: 1.92-2.00 on a Xeon without AMX, and 0.57 by
// fma-peak's rates on a Zen 5); 1.1 on a CPU build without them; 1.0 on other devices, where it was never
// measured.
double low_precision_time(Device device);

// The step's own coefficients of the cost model, each relative to the plain step's predicted time.
struct PlanCosts {
  double recompute = 0;      // every block recomputed whole
  double selective = 0;      // every block recomputed selectively
  double micro_batch = 0;    // each micro-batch past the first
  double low_precision = 1;  // the factor of bf16 autocast: low_precision_time of the device planned for
  double plain_seconds = 0;  // the plain step's predicted time (0 where no coefficient was needed)
};

// One candidate: what the step function applies.
struct PlanChoice {
  int micro_batches = 1;       // gradient accumulation over this many micro-batches a step
  int recompute_blocks = 0;    // of PlanSpace::blocks, run as recompute segments that keep nothing
  bool low_precision = false;  // bf16 autocast
  // Of the other blocks, run as segments that keep their GEMMs' results (PlanSpace::selective; Note
  // [selective recompute] in autograd/recompute.h): nn::GPT::recompute_blocks(recompute_blocks, this).
  int selective_blocks = 0;
  // The optimizer steps in backward (optim::StepInBackward; PlanSpace::step_in_backward): each backward()
  // is the step (zero_grad() and step() around it find no gradient left). Only with micro_batches == 1.
  bool step_in_backward = false;
};

// What the planner may choose from.
struct PlanSpace {
  FRUGAL_ARG(int, blocks) = 0;  // the chain's recomputable blocks (0: none)
  FRUGAL_ARG(std::vector<int>, micro_batches) = std::vector<int>{1, 2, 4, 8,
                                                                 16};  // each must divide the batch
  FRUGAL_ARG(bool, low_precision) = false;                             // may it choose bf16 autocast
  FRUGAL_ARG(bool, selective) = false;  // may blocks keep their GEMMs' results (the model must do it)
  // May the optimizer step in backward? Only where the step allows it: no clipping by the global norm, no
  // loss scaler, no sparse gradients (Note [stepping in backward] in optim/step_in_backward.h).
  FRUGAL_ARG(bool, step_in_backward) = false;
  FRUGAL_ARG(std::optional<Device>, from);  // the dry runs start from this arena (EstimateOptions::from)
};

struct Plan {
  bool fits = false;           // some candidate fits the budget
  PlanChoice choice;           // the fastest one that fits (or, when none does, the one with the lowest peak)
  int64_t peak_allocated = 0;  // its dry run's peaks
  int64_t peak_reserved = 0;
  double relative_time = 1;  // its predicted step time over the plain run's (Note [the planner's cost model])
  PlanCosts costs;           // the coefficients that prediction used
  int64_t budget = 0;
  int blocks = 0;
  int dry_runs = 0;  // how many candidates were estimated
  // "2 micro-batches, recompute 1 of 4 blocks, f32: estimated peak 45.01 MiB of 48.00 MiB, 1.10x the time"
  // (", the optimizer steps in backward" after the blocks when it does)
  std::string str() const;
};

// Finds the fastest candidate whose dry run fits under `budget` bytes (as the arena's limit: the peak of the
// reserved bytes stays under it and nothing fails). The step runs as memory::estimate's (it makes everything
// on the device it is given), shaped by the choice.
Plan plan(const std::function<void(Device, const PlanChoice&)>& step, int64_t budget,
          const PlanSpace& space = PlanSpace());

}  // namespace frugal::memory
