// dist::DistributedDataParallel: data-parallel training. Every rank holds the whole model and trains on its
// own share of each batch (data::DistributedSampler); after each backward every rank holds the mean of the
// ranks' gradients, so the optimizers, stepping alike, keep the models equal.
//
//   dist::Guard guard;
//   auto model = std::make_shared<Net>();
//   dist::DistributedDataParallel ddp(*model);  // rank 0's parameters and buffers, everywhere
//   optim::SGD opt(model->parameters(), optim::SGDOptions(0.1));
//   for (...) { opt.zero_grad(); F::cross_entropy(model->forward(x), y).backward(); opt.step(); }
//   { auto no_sync = ddp.no_sync(); loss1.backward(); }  // accumulate locally; the next backward reduces all
//
// Note [gradient buckets]: the parameters are packed, in reverse order (about the order backward finishes
// them), into buckets of about bucket_cap_mb, one device and flat dtype a bucket. A grad-ready hook
// (autograd::add_grad_ready_hook, kind Reads) marks each parameter's gradient final; once a bucket's are, its
// gradients are copied into one flat f32 (f64 for f64 parameters) tensor, freed, and the flat tensor is
// handed to the communication thread (dist::all_reduce_async, Average) while backward goes on with the layers
// below: the reduction overlaps the rest of backward. Buckets start in one order on every rank (bucket k only
// after bucket k-1), so the ranks' collectives always match. At the end of backward
// (autograd::add_backward_end_hook) the remaining buckets start, every bucket is waited for, and each
// parameter's .grad becomes a view of its bucket (f16/bf16 parameters: a copy, rounded once): the reduced
// gradients take the bytes the local ones had, and the gradients are never held twice. A parameter that got
// no gradient on this rank counts as zeros (the other ranks' may not be), and gets the mean too.
//
// Works with recompute segments, autocast and the GradScaler: the scaler unscales the reduced gradients,
// which are equal on every rank, so an inf or nan in any rank's gradient is in every rank's sum and every
// rank skips the same steps (the found-inf flag is reduced by the reduction itself). Not with
// optim::StepInBackward (an update needs the reduced gradient, which exists only at the end of backward).
// Buffers (BatchNorm's running statistics) are broadcast once, at construction; each rank then updates its
// own from its share of the data.
#pragma once

#include <cstdint>
#include <vector>

#include "../core/options.h"
#include "../core/tensor.h"
#include "dist.h"

namespace frugal::nn {
class Module;
}

namespace frugal::dist {

namespace detail {
// Copies param's gradient (zeros without one) into slot, a flat stretch of its numel, and frees the gradient:
// how DistributedDataParallel fills a bucket and ZeroOptimizer its flat gradient.
void move_gradient(const Tensor& param, Tensor slot);
}  // namespace detail

class DistributedDataParallelOptions {
 public:
  FRUGAL_ARG(double, bucket_cap_mb) = 25;  // MiB of f32 gradients a bucket gathers before it is reduced
  // Reduce each bucket as soon as it is complete (false: all at the end of backward, to measure the overlap).
  FRUGAL_ARG(bool, overlap) = true;
  // Reduce the gradients at all (false: dist::ZeroOptimizer reduce-scatters them itself).
  FRUGAL_ARG(bool, reduce_gradients) = true;
};

class DistributedDataParallel {
 public:
  explicit DistributedDataParallel(
      nn::Module& module, const DistributedDataParallelOptions& options = DistributedDataParallelOptions());
  ~DistributedDataParallel();  // waits for reductions in flight and takes its hooks off
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // While alive, backward accumulates gradients locally; the first backward after it reduces the sum.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(&ddp) { ddp_->no_sync_ = true; }
    ~NoSync() { ddp_->no_sync_ = false; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel* ddp_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  nn::Module& module() { return module_; }
  const DistributedDataParallelOptions& options() const { return options_; }
  int64_t num_buckets() const { return int64_t(buckets_.size()); }
  // Bytes of flat gradients the last backward reduced (the payload of its all-reduces).
  int64_t last_reduced_bytes() const { return last_reduced_bytes_; }
  // Seconds the end of the last backward waited for its reductions: the communication backward did not hide.
  double last_wait_seconds() const { return last_wait_seconds_; }

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    std::vector<int64_t> offsets;
    int64_t numel = 0;
    DType dtype = DType::F32;  // of the flat tensor
    Device device = kCPU;      // its parameters'
    // One backward's:
    size_t pending = 0;
    Tensor flat;
    Work work;
  };
  void on_grad_ready(size_t param);
  void start_ready_buckets();
  void start(Bucket& b);
  void finish();  // the backward-end hook
  void abandon() noexcept;

  nn::Module& module_;
  DistributedDataParallelOptions options_;
  std::vector<Tensor> params_;
  std::vector<size_t> bucket_of_;
  std::vector<Bucket> buckets_;
  size_t next_bucket_ = 0;
  bool active_ = false;  // some parameter became ready in this backward
  bool no_sync_ = false;
  int64_t end_hook_ = 0;
  int64_t last_reduced_bytes_ = 0;
  double last_wait_seconds_ = 0;
};

}  // namespace frugal::dist
