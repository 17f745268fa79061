// Learning-rate schedules (StepLR, cosine annealing) over any Optimizer; state is one epoch counter.
#pragma once

#include <cmath>
#include <numbers>

#include "ddp/optim/optimizer.hpp"

namespace ddp::optim {

struct StepLROptions {
  std::int64_t step_size = 1;
  double gamma = 0.1;
};

// lr = base_lr · gamma^floor(epoch / step_size)  (PyTorch's StepLR closed form).
template <Optimizer O>
class StepLR {
 public:
  StepLR(O& opt, StepLROptions o) : opt_(&opt), o_(o), base_lr_(opt.lr()) {
    if (o.step_size <= 0)
      throw ArgumentError(ddp::detail::cat("StepLR: step_size must be positive, got ", o.step_size));
  }
  void step() { set_epoch(epoch_ + 1); }
  void set_epoch(std::int64_t e) {
    epoch_ = e;
    opt_->set_lr(base_lr_ * std::pow(o_.gamma, double(e / o_.step_size)));
  }
  std::int64_t epoch() const noexcept { return epoch_; }
  double base_lr() const noexcept { return base_lr_; }

 private:
  O* opt_;
  StepLROptions o_;
  double base_lr_;
  std::int64_t epoch_ = 0;
};

struct CosineOptions {
  std::int64_t t_max = 1;
  double eta_min = 0.0;
};

// lr = eta_min + (base_lr - eta_min)·(1 + cos(π·epoch/t_max))/2 (the closed form of PyTorch's
// CosineAnnealingLR; PyTorch's recursive form agrees with it up to rounding).
template <Optimizer O>
class CosineAnnealingLR {
 public:
  CosineAnnealingLR(O& opt, CosineOptions o) : opt_(&opt), o_(o), base_lr_(opt.lr()) {
    if (o.t_max <= 0) throw ArgumentError(ddp::detail::cat("CosineAnnealingLR: t_max must be positive, got ", o.t_max));
  }
  void step() { set_epoch(epoch_ + 1); }
  void set_epoch(std::int64_t e) {
    epoch_ = e;
    opt_->set_lr(o_.eta_min +
                 (base_lr_ - o_.eta_min) * (1 + std::cos(std::numbers::pi * double(e) / double(o_.t_max))) / 2);
  }
  std::int64_t epoch() const noexcept { return epoch_; }
  double base_lr() const noexcept { return base_lr_; }

 private:
  O* opt_;
  CosineOptions o_;
  double base_lr_;
  std::int64_t epoch_ = 0;
};

struct WarmupCosineOptions {
  std::int64_t warmup = 0;  // steps of linear warm-up
  std::int64_t t_max = 1;   // the step at which the cosine reaches eta_min (> warmup); it stays there after
  double eta_min = 0.0;
};

// Linear warm-up, then cosine decay (GPT recipes, nanoGPT's get_lr): at step t,
//   t < warmup:            lr = base_lr·(t + 1)/warmup
//   warmup <= t <= t_max:  lr = eta_min + (base_lr - eta_min)·(1 + cos(π·(t - warmup)/(t_max - warmup)))/2
//   t > t_max:             lr = eta_min
// A closed form of the step, so set_epoch(t) after a resume gives the uninterrupted run's lr bitwise.
template <Optimizer O>
class WarmupCosineLR {
 public:
  WarmupCosineLR(O& opt, WarmupCosineOptions o) : opt_(&opt), o_(o), base_lr_(opt.lr()) {
    if (o.warmup < 0) throw ArgumentError(ddp::detail::cat("WarmupCosineLR: warmup must be >= 0, got ", o.warmup));
    if (o.t_max <= o.warmup)
      throw ArgumentError(
          ddp::detail::cat("WarmupCosineLR: t_max (", o.t_max, ") must be past warmup (", o.warmup, ")"));
  }
  void step() { set_epoch(epoch_ + 1); }
  void set_epoch(std::int64_t t) {
    epoch_ = t;
    opt_->set_lr(lr_at(t));
  }
  double lr_at(std::int64_t t) const {
    if (t < o_.warmup) return base_lr_ * double(t + 1) / double(o_.warmup);
    if (t > o_.t_max) return o_.eta_min;
    double const ratio = double(t - o_.warmup) / double(o_.t_max - o_.warmup);
    return o_.eta_min + (base_lr_ - o_.eta_min) * (1 + std::cos(std::numbers::pi * ratio)) / 2;
  }
  std::int64_t epoch() const noexcept { return epoch_; }
  double base_lr() const noexcept { return base_lr_; }

 private:
  O* opt_;
  WarmupCosineOptions o_;
  double base_lr_;
  std::int64_t epoch_ = 0;
};

}  // namespace ddp::optim
