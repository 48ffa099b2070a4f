// Learning-rate schedules: each sets the lr of every parameter group of an optimizer from a closed form in
// the number of step() calls so far, as torch.optim.lr_scheduler does. A schedule scales each group's
// initial lr (recorded on the group by the first schedule attached to it).
//
//   optim::SGD opt(params, optim::SGDOptions(0.1));
//   optim::CosineAnnealingLR sched(opt, /*T_max=*/100, /*eta_min=*/1e-4);
//   for (int epoch = 0; epoch < 100; ++epoch) { train(opt); sched.step(); }
//   // warm-up then cosine, as torch's SequentialLR([LinearLR, CosineAnnealingLR], milestones=[5]):
//   auto sched2 = optim::warmup_cosine(opt, /*warmup_steps=*/5, /*start_factor=*/0.1, /*T_max=*/95);
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "optimizer.h"

namespace frugal::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances one epoch (or iteration) and sets the groups' lrs.
  virtual void step();
  // Jumps to a given epoch (what SequentialLR does at a milestone).
  virtual void step_to(int64_t epoch);
  // The lr of each group as this schedule last set it.
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  int64_t last_epoch() const { return last_epoch_; }
  Optimizer& optimizer() { return opt_; }

 protected:
  // Records the groups' initial lrs; the subclass constructor then calls step() once (epoch 0), as PyTorch.
  explicit LRScheduler(Optimizer& opt);
  // The lr of a group whose initial lr is base_lr, at `epoch`.
  virtual double lr_at(double base_lr, int64_t epoch) const = 0;

  friend class SequentialLR;
  Optimizer& opt_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  int64_t last_epoch_ = -1;
};

// lr = base_lr * gamma ^ floor(epoch / step_size).
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& opt, int64_t step_size, double gamma = 0.1);

 protected:
  double lr_at(double base_lr, int64_t epoch) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2 (past T_max it rises again, as in
// PyTorch).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& opt, int64_t T_max, double eta_min = 0);

 protected:
  double lr_at(double base_lr, int64_t epoch) const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

// Linear warm-up from start_factor * base_lr to base_lr over warmup_steps steps, then base_lr (PyTorch's
// LinearLR with end_factor 1).
class LinearWarmup : public LRScheduler {
 public:
  LinearWarmup(Optimizer& opt, int64_t warmup_steps, double start_factor = 1.0 / 3);

 protected:
  double lr_at(double base_lr, int64_t epoch) const override;

 private:
  int64_t warmup_steps_;
  double start_factor_;
};

// Runs schedules one after another: schedules[k] from milestones[k - 1] on, restarted at epoch 0 there
// (PyTorch's SequentialLR). All must drive the same optimizer.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& opt, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  void step() override;
  void step_to(int64_t epoch) override;

 protected:
  double lr_at(double base_lr, int64_t epoch) const override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

// Linear warm-up over warmup_steps, then cosine annealing over T_max steps down to eta_min.
std::unique_ptr<SequentialLR> warmup_cosine(Optimizer& opt, int64_t warmup_steps, double start_factor,
                                            int64_t T_max, double eta_min = 0);

}  // namespace frugal::optim
