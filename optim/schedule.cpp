// Learning-rate schedules: the closed forms of PyTorch's StepLR, CosineAnnealingLR, LinearLR and
// SequentialLR.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace frugal::optim {

LRScheduler::LRScheduler(Optimizer& opt) : opt_(opt) {
  // As PyTorch's group.setdefault("initial_lr", group["lr"]): a second schedule on the same optimizer scales
  // the same base, not what the first one has already set.
  for (ParamGroup& g : opt_.param_groups()) {
    if (!g.initial_lr) g.initial_lr = g.options().get_lr();
    base_lrs_.push_back(*g.initial_lr);
  }
}

void LRScheduler::step() { step_to(last_epoch_ + 1); }

void LRScheduler::step_to(int64_t epoch) {
  auto& groups = opt_.param_groups();
  FRUGAL_CHECK(groups.size() == base_lrs_.size(), "LRScheduler: the optimizer has ", groups.size(),
               " parameter groups but had ", base_lrs_.size(),
               " when the schedule was made; make the schedule after adding groups");
  last_epoch_ = epoch;
  last_lr_.clear();
  for (size_t g = 0; g < groups.size(); ++g) {
    const double lr = lr_at(base_lrs_[g], epoch);
    groups[g].options().set_lr(lr);
    last_lr_.push_back(lr);
  }
}

StepLR::StepLR(Optimizer& opt, int64_t step_size, double gamma)
    : LRScheduler(opt), step_size_(step_size), gamma_(gamma) {
  FRUGAL_CHECK(step_size > 0, "StepLR: step_size must be > 0, got ", step_size);
  FRUGAL_CHECK(gamma > 0, "StepLR: gamma must be > 0, got ", gamma);
  step();
}
double StepLR::lr_at(double base_lr, int64_t epoch) const {
  return base_lr * std::pow(gamma_, double(epoch / step_size_));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& opt, int64_t T_max, double eta_min)
    : LRScheduler(opt), t_max_(T_max), eta_min_(eta_min) {
  FRUGAL_CHECK(T_max > 0, "CosineAnnealingLR: T_max must be > 0, got ", T_max);
  FRUGAL_CHECK(eta_min >= 0, "CosineAnnealingLR: eta_min must be >= 0, got ", eta_min);
  step();
}
double CosineAnnealingLR::lr_at(double base_lr, int64_t epoch) const {
  return eta_min_ +
         (base_lr - eta_min_) * (1 + std::cos(std::numbers::pi * double(epoch) / double(t_max_))) / 2;
}

LinearWarmup::LinearWarmup(Optimizer& opt, int64_t warmup_steps, double start_factor)
    : LRScheduler(opt), warmup_steps_(warmup_steps), start_factor_(start_factor) {
  FRUGAL_CHECK(warmup_steps > 0, "LinearWarmup: warmup_steps must be > 0, got ", warmup_steps);
  FRUGAL_CHECK(start_factor > 0 && start_factor <= 1, "LinearWarmup: start_factor must lie in (0, 1], got ",
               start_factor);
  step();
}
double LinearWarmup::lr_at(double base_lr, int64_t epoch) const {
  return base_lr * (start_factor_ +
                    (1 - start_factor_) * double(std::min(warmup_steps_, epoch)) / double(warmup_steps_));
}

SequentialLR::SequentialLR(Optimizer& opt, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(opt), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  FRUGAL_CHECK(!schedulers_.empty(), "SequentialLR: needs at least one schedule");
  FRUGAL_CHECK(milestones_.size() + 1 == schedulers_.size(), "SequentialLR: expected ",
               schedulers_.size() - 1, " milestones for ", schedulers_.size(), " schedules, got ",
               milestones_.size());
  for (size_t k = 0; k < schedulers_.size(); ++k)
    FRUGAL_CHECK(schedulers_[k] && &schedulers_[k]->opt_ == &opt, "SequentialLR: schedule ", k,
                 " drives another optimizer (or is null); all must drive the one given");
  for (size_t k = 1; k < milestones_.size(); ++k)
    FRUGAL_CHECK(milestones_[k - 1] < milestones_[k], "SequentialLR: milestones must increase, got ",
                 milestones_[k - 1], " then ", milestones_[k]);
  // Each schedule set the lrs when it was made; start over with the first one at epoch 0.
  for (auto& s : schedulers_) s->last_epoch_ -= 1;
  step();
}

void SequentialLR::step() { step_to(last_epoch_ + 1); }

void SequentialLR::step_to(int64_t epoch) {
  last_epoch_ = epoch;
  const size_t k =
      size_t(std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin());
  LRScheduler& s = *schedulers_[k];
  if (k > 0 && milestones_[k - 1] == epoch)
    s.step_to(0);
  else if (k > 0)
    s.step_to(epoch - milestones_[k - 1]);
  else
    s.step_to(epoch);
  last_lr_ = s.get_last_lr();
}

double SequentialLR::lr_at(double, int64_t) const {
  FRUGAL_ASSERT(false, "SequentialLR::lr_at is never called: step_to delegates");
  return 0;
}

std::unique_ptr<SequentialLR> warmup_cosine(Optimizer& opt, int64_t warmup_steps, double start_factor,
                                            int64_t T_max, double eta_min) {
  auto warmup = std::make_shared<LinearWarmup>(opt, warmup_steps, start_factor);
  auto cosine = std::make_shared<CosineAnnealingLR>(opt, T_max, eta_min);
  return std::make_unique<SequentialLR>(opt, std::vector<std::shared_ptr<LRScheduler>>{warmup, cosine},
                                        std::vector<int64_t>{warmup_steps});
}

}  // namespace frugal::optim
