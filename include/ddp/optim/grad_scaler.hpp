// GradScaler: dynamic loss scaling, PyTorch's torch.cuda.amp.GradScaler. The loss is multiplied by a scale before
// backward so that small gradients survive a 16-bit representation (float16 buckets on the wire, float16 compute);
// the gradients are divided by it before the optimizer step, a step whose gradients hold an Inf or NaN is skipped,
// and the scale backs off after an overflow and grows after a run of finite steps.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "ddp/autograd/ops/elementwise.hpp"
#include "ddp/error.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp::optim {

// PyTorch's defaults. Powers of two keep scaling exact: with them, the unscaled gradients are bitwise those of the
// unscaled loss (barring overflow, which skips the step, and float subnormals).
struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;  // finite steps in a row before the scale grows
};

// What a checkpoint keeps of a scaler (PyTorch's scaler.state_dict()).
struct GradScalerState {
  double scale = 65536.0;
  std::int64_t growth_tracker = 0;  // finite steps since the scale last changed
  friend bool operator==(GradScalerState const&, GradScalerState const&) = default;
};

// Over the arena of the parameters the optimizer updates (ddp.parameters() under DistributedDataParallel):
//   opt.zero_grad();
//   backward(scaler.scale(loss));
//   scaler.step(opt);                              // or scaler.step(opt, [&] { nn::clip_grad_norm(...); })
// Under DDP every rank holds the same reduced gradients, so every rank finds the same overflow and skips the same
// steps, with the same scale: no extra collective. The overflow check is exact (every element); the gradients are
// unscaled in T. Not for an optimizer that steps inside backward (OverlappedOptimizer with its update overlapped):
// it would step on scaled gradients, so step() refuses it.
template <class T = float, MemorySpace S = HostSpace>
class basic_grad_scaler {
 public:
  explicit basic_grad_scaler(nn::ParameterArena<T, S> arena, GradScalerOptions opts = {})
      : arena_(std::move(arena)), opts_(opts), state_{opts.init_scale, 0} {
    using ddp::detail::cat;
    if (!(std::isfinite(opts.init_scale) && opts.init_scale > 0))
      throw ArgumentError(cat("GradScaler: init_scale must be a positive finite number, got ", opts.init_scale));
    if (!(std::isfinite(opts.growth_factor) && opts.growth_factor > 1))
      throw ArgumentError(cat("GradScaler: growth_factor must be > 1, got ", opts.growth_factor));
    if (!(opts.backoff_factor > 0 && opts.backoff_factor < 1))
      throw ArgumentError(cat("GradScaler: backoff_factor must be in (0, 1), got ", opts.backoff_factor));
    if (opts.growth_interval < 1)
      throw ArgumentError(cat("GradScaler: growth_interval must be at least 1, got ", opts.growth_interval));
  }

  // The loss times the current scale: call backward on this.
  Variable<T, S> scale(Variable<T, S> const& loss) const { return ddp::scale(loss, T(state_.scale)); }
  double get_scale() const noexcept { return state_.scale; }

  // Divides the gradients by the scale; if every one is finite, runs before_step() (gradient clipping goes there:
  // it sees the true gradients) and opt.step(); otherwise skips both. Then updates the scale: times
  // backoff_factor after an overflow, times growth_factor after growth_interval finite steps in a row. Returns
  // whether the optimizer stepped.
  template <class O, class F = void (*)()>
  bool step(
      O& opt, F&& before_step = [] {}) {
    // An optimizer that moves the parameters inside backward (OverlappedOptimizer) would step on the scaled
    // gradients before they are unscaled and checked: it says so (parallel/composition.hpp's rules).
    if constexpr (requires { opt.refuses_reader("GradScaler"); })
      if (auto refusal = opt.refuses_reader("GradScaler")) throw ArgumentError(std::move(*refusal));
    bool const finite = unscale();
    if (finite) {
      before_step();
      opt.step();
    } else {
      ++skipped_;
    }
    if (finite)
      grow();
    else
      back_off();
    return finite;
  }

  // A step dropped elsewhere because its gradients were not finite (DistributedDataParallel's
  // NonFinite::kSkipStep, which leaves no gradient for step() to see): counted, and the scale backs off, as
  // step() does after an overflow.
  void skip() {
    ++skipped_;
    back_off();
  }

  // Steps skipped for an overflow since construction.
  std::int64_t skipped_steps() const noexcept { return skipped_; }
  GradScalerOptions const& options() const noexcept { return opts_; }
  GradScalerState state() const noexcept { return state_; }
  void load_state(GradScalerState const& st) {
    if (!(std::isfinite(st.scale) && st.scale > 0) || st.growth_tracker < 0)
      throw ArgumentError(
          ddp::detail::cat("GradScaler: a saved state needs a positive finite scale and a "
                           "non-negative growth tracker, got scale ",
                           st.scale, ", growth tracker ", st.growth_tracker));
    state_ = st;
  }

 private:
  // Gradients ×(1/scale) in place; whether they are all finite (checked after: an overflow is Inf or NaN either
  // way). Parameters without a gradient this step are left alone, as optimizers skip them.
  bool unscale() {
    T const inv = T(1.0 / state_.scale);
    bool finite = true;
    for (std::size_t i = 0; i < arena_.count(); ++i) {
      if (!arena_.has_grad(i)) continue;
      auto const& e = arena_.entries()[i];
      T* g = arena_.grads().data() + e.offset;
      Kernels<S>::axpby(e.numel, inv, g, T(0), g);
      if (finite && !ddp::detail::all_finite<T, S>(e.numel, g)) finite = false;
    }
    return finite;
  }
  // After an overflow: the scale times backoff_factor, the run of finite steps restarts.
  void back_off() {
    state_.scale *= opts_.backoff_factor;
    state_.growth_tracker = 0;
  }
  // After a finite step: the scale times growth_factor once growth_interval of them ran in a row.
  void grow() {
    if (++state_.growth_tracker != opts_.growth_interval) return;
    double const grown = state_.scale * opts_.growth_factor;
    if (std::isfinite(grown)) state_.scale = grown;  // as PyTorch: never grows to Inf
    state_.growth_tracker = 0;
  }

  nn::ParameterArena<T, S> arena_;
  GradScalerOptions opts_;
  GradScalerState state_;
  std::int64_t skipped_ = 0;
};

using GradScaler = basic_grad_scaler<>;

}  // namespace ddp::optim
