// dist::DistributedDataParallel; see Note [gradient buckets] in dist/ddp.h.
#include "dist/ddp.h"

#include <chrono>

#include "autograd/graph.h"
#include "core/memory.h"
#include "nn/module.h"
#include "optim/step_in_backward.h"

namespace frugal::dist {

namespace detail {
void move_gradient(const Tensor& param, Tensor slot) {
  const Tensor g = param.grad();
  if (!g.defined()) {
    slot.zero_();
    return;
  }
  slot.copy_(g.reshape({-1}));
  param.set_grad(Tensor());  // freed: the slot holds it now
}
}  // namespace detail

DistributedDataParallel::DistributedDataParallel(nn::Module& module,
                                                 const DistributedDataParallelOptions& options)
    : module_(module), options_(options) {
  FRUGAL_CHECK(is_initialized(), "DistributedDataParallel: call dist::init() (or make a dist::Guard) first");
  FRUGAL_CHECK(options.bucket_cap_mb() > 0, "DistributedDataParallel: bucket_cap_mb must be positive, got ",
               options.bucket_cap_mb());
  FRUGAL_CHECK(
      optim::StepInBackward::active() == 0,
      "DistributedDataParallel: parameters step in backward (optim::StepInBackward); an update needs "
      "the reduced gradient, which exists only at the end of backward: use one or the other");
  {
    NoGradGuard no_grad;
    for (const auto& item : module.named_parameters()) {
      Tensor p = item.value();
      broadcast(p, 0);
    }
    for (const auto& item : module.named_buffers()) {
      Tensor b = item.value();
      broadcast(b, 0);
    }
  }
  for (const Tensor& p : module.parameters())
    if (p.requires_grad()) params_.push_back(p);

  // Note [gradient buckets]: reverse order, one dtype a bucket, about bucket_cap_mb each.
  const int64_t cap = int64_t(options.bucket_cap_mb() * 1024 * 1024);
  bucket_of_.assign(params_.size(), 0);
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k];
    const DType flat = p.dtype() == DType::F64 ? DType::F64 : DType::F32;
    if (buckets_.empty() || buckets_.back().dtype != flat || buckets_.back().device != p.device() ||
        buckets_.back().numel * int64_t(dtype_size(flat)) >= cap) {
      buckets_.emplace_back();
      buckets_.back().dtype = flat;
      buckets_.back().device = p.device();
    }
    Bucket& b = buckets_.back();
    b.params.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += p.numel();
    bucket_of_[k] = buckets_.size() - 1;
  }
  for (Bucket& b : buckets_) b.pending = b.params.size();
  for (size_t k = 0; k < params_.size(); ++k)
    autograd::add_grad_ready_hook(params_[k], this, autograd::GradReadyKind::Reads,
                                  [this, k] { on_grad_ready(k); });
  end_hook_ = autograd::add_backward_end_hook([this] { finish(); });
}

DistributedDataParallel::~DistributedDataParallel() {
  autograd::remove_backward_end_hook(end_hook_);
  for (const Tensor& p : params_) autograd::remove_grad_ready_hook(p, this);
  abandon();
}

void DistributedDataParallel::on_grad_ready(size_t k) {
  if (no_sync_ || !options_.reduce_gradients()) return;
  active_ = true;
  Bucket& b = buckets_[bucket_of_[k]];
  --b.pending;
  if (options_.overlap()) start_ready_buckets();
}

void DistributedDataParallel::start_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0)
    start(buckets_[next_bucket_++]);
}

void DistributedDataParallel::start(Bucket& b) {
  NoGradGuard no_grad;
  static const uint32_t kGradientsTag = memory::intern_tag("gradients");
  b.flat = empty({b.numel}, TensorOptions(b.dtype).device(b.device));
  b.flat.storage()->retag(kGradientsTag);
  for (size_t j = 0; j < b.params.size(); ++j) {
    const Tensor& p = params_[b.params[j]];
    detail::move_gradient(p, b.flat.narrow(0, b.offsets[j], p.numel()));
  }
  b.work = all_reduce_async(b.flat, ReduceOp::Average);
}

void DistributedDataParallel::finish() {
  if (!active_) return;
  active_ = false;
  // Parameters this backward did not reach: zeros (Note [gradient buckets]).
  for (Bucket& b : buckets_) b.pending = 0;
  try {
    const auto t0 = std::chrono::steady_clock::now();
    start_ready_buckets();
    NoGradGuard no_grad;
    int64_t bytes = 0;
    for (Bucket& b : buckets_) {
      b.work.wait();
      bytes += b.flat.nbytes();
      for (size_t j = 0; j < b.params.size(); ++j) {
        const Tensor& p = params_[b.params[j]];
        Tensor g = b.flat.narrow(0, b.offsets[j], p.numel()).view(p.shape());
        p.set_grad(p.dtype() == b.dtype ? g : g.to(p.dtype()));
      }
    }
    last_reduced_bytes_ = bytes;
    last_wait_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } catch (...) {
    abandon();
    throw;
  }
  abandon();  // resets the per-backward state; the gradients keep the buckets' bytes alive
}

void DistributedDataParallel::abandon() noexcept {
  for (Bucket& b : buckets_) {
    try {
      b.work.wait();
    } catch (...) {  // NOLINT(bugprone-empty-catch): the error was reported by the caller that waited first
    }
    b.flat = Tensor();
    b.pending = b.params.size();
  }
  next_bucket_ = 0;
  active_ = false;
}

}  // namespace frugal::dist
