// Schedule: a learning-rate schedule chosen at run time as a value (none, StepLR per epoch, cosine per step, warm-up
// then cosine per step),
// with the one counter a checkpoint keeps.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "ddp/error.hpp"
#include "ddp/optim/lr_scheduler.hpp"
#include "ddp/optim/optimizer.hpp"

namespace ddp::optim {

// kNone: the optimizer's lr stays as it is. kStep: StepLR, advanced once per epoch (its counter is the epoch).
// kCosine: CosineAnnealingLR over optimizer steps, set before every step (its counter is the global step).
// kWarmupCosine: WarmupCosineLR (linear warm-up, then cosine to eta_min), per step like kCosine.
enum class ScheduleKind { kNone, kStep, kCosine, kWarmupCosine };

inline constexpr std::string_view schedule_name(ScheduleKind k) noexcept {
  switch (k) {
    case ScheduleKind::kStep:
      return "step";
    case ScheduleKind::kCosine:
      return "cosine";
    case ScheduleKind::kWarmupCosine:
      return "warmup-cosine";
    case ScheduleKind::kNone:
      break;
  }
  return "none";
}

// "none", "step" or "cosine" (as schedule_name prints them); anything else is an ArgumentError naming it.
inline ScheduleKind parse_schedule_kind(std::string_view name) {
  for (auto k : {ScheduleKind::kNone, ScheduleKind::kStep, ScheduleKind::kCosine, ScheduleKind::kWarmupCosine})
    if (schedule_name(k) == name) return k;
  throw ArgumentError(ddp::detail::cat("schedule must be one of none|step|cosine|warmup-cosine, got '", name, "'"));
}

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::kNone;
  StepLROptions step{};    // kStep; step_size counts epochs
  CosineOptions cosine{};  // kCosine; t_max counts optimizer steps (e.g. epochs · steps per epoch)
  WarmupCosineOptions warmup_cosine{.t_max = 1};  // kWarmupCosine; warmup and t_max count optimizer steps
};

// One of the schedules above over optimizer O, driven by the training loop through two calls:
//   start_step(global_step)  before each optimizer step (optimizer steps taken so far); kCosine sets the lr
//   end_epoch(epochs_done)   after each epoch; kStep sets the lr of the next epoch
// counter() is the state a checkpoint keeps and restore(counter) puts it back (setting the lr as the
// uninterrupted run had it); for kNone both are no-ops and the counter is 0. The lr is a closed form of the
// counter, so a restored schedule is bitwise the uninterrupted one. Not thread-safe; one per optimizer.
template <Optimizer O>
class Schedule {
 public:
  // Only the chosen kind's options are checked (StepLR's and CosineAnnealingLR's errors).
  Schedule(O& opt, ScheduleOptions const& o)
      : kind_(o.kind),
        step_lr_(opt, o.kind == ScheduleKind::kStep ? o.step : StepLROptions{}),
        cosine_(opt, o.kind == ScheduleKind::kCosine ? o.cosine : CosineOptions{}),
        warmup_cosine_(opt, o.kind == ScheduleKind::kWarmupCosine ? o.warmup_cosine : WarmupCosineOptions{.t_max = 1}) {
  }

  void start_step(std::int64_t global_step) {
    if (kind_ == ScheduleKind::kCosine) cosine_.set_epoch(global_step);
    if (kind_ == ScheduleKind::kWarmupCosine) warmup_cosine_.set_epoch(global_step);
  }
  void end_epoch(std::int64_t epochs_done) {
    if (kind_ == ScheduleKind::kStep) step_lr_.set_epoch(epochs_done);
  }

  std::int64_t counter() const noexcept {
    switch (kind_) {
      case ScheduleKind::kStep:
        return step_lr_.epoch();
      case ScheduleKind::kCosine:
        return cosine_.epoch();
      case ScheduleKind::kWarmupCosine:
        return warmup_cosine_.epoch();
      case ScheduleKind::kNone:
        break;
    }
    return 0;
  }
  void restore(std::int64_t counter) {
    if (counter < 0) throw ArgumentError(ddp::detail::cat("Schedule::restore: counter ", counter, " is negative"));
    if (kind_ == ScheduleKind::kStep) step_lr_.set_epoch(counter);
    if (kind_ == ScheduleKind::kCosine) cosine_.set_epoch(counter);
    if (kind_ == ScheduleKind::kWarmupCosine) warmup_cosine_.set_epoch(counter);
  }

  ScheduleKind kind() const noexcept { return kind_; }
  std::string_view name() const noexcept { return schedule_name(kind_); }

 private:
  ScheduleKind kind_;
  StepLR<O> step_lr_;
  CosineAnnealingLR<O> cosine_;
  WarmupCosineLR<O> warmup_cosine_;
};

}  // namespace ddp::optim
