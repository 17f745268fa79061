// OverlappedOptimizer<O>: the optimizer's update overlapped with DistributedDataParallel's communication. Each
// bucket's parameters are stepped as soon as that bucket's reduction lands, while later buckets are still in
// flight, instead of all of them after backward (PyTorch's ZeroRedundancyOptimizer(overlap_with_ddp=True) and
// its optimizer-in-backward prototype, here one wrapper that composes with every reduction policy and with ZeRO).
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "ddp/bucket/outcome.hpp"
#include "ddp/error.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/optim/shard.hpp"
#include "ddp/parallel/attachment.hpp"
#include "ddp/parallel/composition.hpp"

namespace ddp {

// When an OverlappedOptimizer updates the parameters.
enum class UpdateAt {
  kStep,           // in step(), after backward: the optimizer as it is
  kBucketReduced,  // each bucket as its reduction lands, at the end of the round's backward; step() completes
};

struct OverlapOptions {
  UpdateAt update_at = UpdateAt::kBucketReduced;
};

// An optimizer whose step can be taken a window of the arena at a time: update(range) is the step of the whole
// parameters in arena elements [begin, end), and updates over windows that partition the arena are step(),
// bitwise (optim::basic_sgd, basic_adam_l2, basic_adamw; ZeroRedundancyOptimizer, whose complete_step() then
// all-gathers).
template <class O>
concept WindowedOptimizer = optim::Optimizer<O> && requires(O& o, optim::ArenaShard::Range r) {
  o.update(r);
};

namespace detail {
// An optimizer for a DistributedDataParallel: built from the wrapper where it takes one (ZeroRedundancyOptimizer,
// OverlappedOptimizer), else from its parameters.
template <class O, class D>
O make_optimizer(D& d, typename O::options_type const& o) {
  if constexpr (std::constructible_from<O, D&, typename O::options_type const&>)
    return O(d, o);
  else
    return O(d.parameters(), o);
}
}  // namespace detail

// Use in place of the optimizer, built after DistributedDataParallel from it:
//   OverlappedOptimizer<optim::AdamW> opt(ddp, {.optimizer = {.lr = 1e-3}});
//   OverlappedOptimizer<ZeroRedundancyOptimizer<optim::AdamW, Comm>> opt(ddp, {.optimizer = {.optimizer = {...}}});
// The loop is unchanged: zero_grad(), forward/backward, step(). With UpdateAt::kBucketReduced the parameters
// move inside backward (at its end, as the buckets land) and step() only completes the step (ZeRO's all-gathers).
// Guarantees:
//  - the parameters and state after step() are bitwise those of O's own step() after the round: the same kernel
//    on the same gradients, element by element;
//  - where the round needs every bucket before any update, it says so (waits_for()) and updates in step(): a
//    non-finite check (DdpOptions::non_finite, which may drop the whole step), and rounds under ddp::join;
//  - anything that reads or changes the gradients between backward and step() would come too late: clip with
//    basic_trainer's clip_grad_norm (which refuses this optimizer) or use UpdateAt::kStep; set the learning rate
//    before backward.
// A round that raises (a missing gradient, a desync) may have updated the buckets that landed before the error.
// Not copyable or movable (DDP points at it): it attaches to the DDP (attachment.hpp) for its lifetime.
template <class O>
class OverlappedOptimizer final : public DdpHook {
 public:
  using value_type = typename O::value_type;
  using space = typename O::space;
  struct options_type {
    typename O::options_type optimizer{};
    OverlapOptions overlap{};
  };
  static_assert(WindowedOptimizer<O>,
                "OverlappedOptimizer: the optimizer must update a window of its arena at a time, update(ArenaShard::"
                "Range) (optim::basic_sgd, basic_adam_l2, basic_adamw and ZeroRedundancyOptimizer do)");

  template <class D>
  requires requires(D& d, DdpHook& h) {
    d.parameters();
    { d.composition() } -> std::same_as<CompositionView>;
    { d.attach(h) } -> std::same_as<Attachment>;
  }
  OverlappedOptimizer(D& ddp, options_type opt)
      : inner_(detail::make_optimizer<O>(ddp, opt.optimizer)), overlap_(opt.overlap), ddp_(ddp.composition()) {
    if (overlap_.update_at != UpdateAt::kBucketReduced) return;
    if (auto why = update_waits_for(ddp_)) {
      waits_for_ = std::move(*why);
      return;
    }
    in_backward_ = true;  // what traits() declares to attach()
    attachment_ = ddp.attach(*this);
  }
  ~OverlappedOptimizer() = default;
  OverlappedOptimizer(OverlappedOptimizer const&) = delete;
  OverlappedOptimizer& operator=(OverlappedOptimizer const&) = delete;

  static std::string name() { return O::name(); }

  // Completes the step whose buckets were updated as they landed, or (nothing landed: UpdateAt::kStep, a round
  // that needed every bucket, no round since the last step) takes the whole step now.
  void step() {
    if (!landed_) {
      inner_.step();
      return;
    }
    landed_ = false;
    if constexpr (requires { inner_.complete_step(); }) inner_.complete_step();
  }
  void zero_grad() {
    landed_ = false;
    inner_.zero_grad();
  }
  double lr() const noexcept { return inner_.lr(); }
  void set_lr(double lr) { inner_.set_lr(lr); }
  O& optimizer() noexcept { return inner_; }
  O const& optimizer() const noexcept { return inner_; }
  OverlapOptions const& overlap_options() const noexcept { return overlap_; }

  // Whether buckets are updated as they land (attached to the DDP); if asked for but not, why (waits_for()).
  bool updates_in_backward() const noexcept { return attachment_.attached(); }
  std::string const& waits_for() const noexcept { return waits_for_; }
  // How it appears to the composition rules (composition.hpp).
  HookTraits traits() const override {
    return {.name = "OverlappedOptimizer",
            .caps = in_backward_ ? Capabilities(Capability::kUpdatesInBackward) : Capabilities()};
  }
  // The refusal a reader of the whole averaged gradients (GradScaler, clipping) meets with this optimizer, if any.
  std::optional<std::string> refuses_reader(std::string_view reader) const {
    HookTraits const mine = traits(), theirs{.name = std::string(reader), .caps = Capability::kNeedsWholeGradients};
    return composition_refusal({.ddp = ddp_, .attached = std::span(&mine, 1), .attaching = &theirs});
  }

  // What was composed, for logs.
  std::string describe() const {
    std::string what;
    if constexpr (requires { inner_.describe(); })
      what = inner_.describe();
    else
      what = O::name();
    if (updates_in_backward()) return what + "; each bucket updated as its reduction lands";
    if (!waits_for_.empty()) return what + "; updated after backward (" + waits_for_ + ")";
    return what + "; updated after backward";
  }

  optim::OptimizerState<value_type> state() const { return inner_.state(); }
  void load_state(optim::OptimizerState<value_type> const& st) { inner_.load_state(st); }
  // ZeroRedundancyOptimizer's: collective when sharded (save_checkpoint calls it on every rank).
  optim::OptimizerState<value_type> consolidated_state() const requires requires(O const& o) { o.consolidated_state(); }
  { return inner_.consolidated_state(); }
  bool sharded() const noexcept requires requires(O const& o) { o.sharded(); }
  { return inner_.sharded(); }
  std::int64_t state_bytes() const noexcept requires requires(O const& o) { o.state_bytes(); }
  { return inner_.state_bytes(); }

 private:
  void on_bucket_reduced(std::int64_t begin, std::int64_t end) override {
    inner_.update({begin, end});
    landed_ = true;
  }

  O inner_;
  OverlapOptions overlap_;
  bool landed_ = false;       // this round's buckets were updated as they landed; step() completes it
  std::string waits_for_;     // UpdateAt::kBucketReduced asked for, but the DDP needs every bucket first: why
  CompositionView ddp_;       // the DDP it was built from
  bool in_backward_ = false;  // it updates each bucket as it lands (attached, or attaching)
  Attachment attachment_;     // to it, while buckets are updated as they land
};

}  // namespace ddp
