// Adam (L2 weight decay) and AdamW (decoupled weight decay): PyTorch 1.13's update rules, one fused pass.
#pragma once

#include <cmath>

#include "ddp/optim/optimizer.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;      // Adam's default; AdamW's PyTorch default is 0.01 (see AdamWOptions)
  DecayRule weight_decay_rule{};  // set: each parameter's own decay (parameter groups), overriding weight_decay
};
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  DecayRule weight_decay_rule{};  // set: each parameter's own decay (parameter groups), e.g. decay_matrices_only(0.1)
};

// How weight decay enters the update: as an L2 term added to the gradient (Adam), or decoupled, applied to the
// weights apart from the adaptive step (AdamW, Loshchilov and Hutter).
enum class WeightDecay { kL2, kDecoupled };

// Adam or AdamW, by `Decay`. Bias correction uses per-parameter step counts starting at 1. Given a shard
// (ArenaShard), it updates and keeps state for those elements only, with bitwise the values the unsharded
// optimizer gives them (every element takes the same path: HostOptimKernels::adam_update).
template <class T, MemorySpace S, WeightDecay Decay>
class basic_adam {
  static constexpr bool Decoupled = Decay == WeightDecay::kDecoupled;

 public:
  using value_type = T;
  using space = S;
  using options_type = std::conditional_t<Decoupled, AdamWOptions, AdamOptions>;
  static std::string name() { return Decoupled ? "adamw" : "adam"; }

  basic_adam(nn::ParameterArena<T, S> arena, options_type opt, ArenaShard shard = {})
      : arena_(std::move(arena)), opt_(opt), ranges_(shard.resolve(arena_.numel())) {
    if (!(opt.lr >= 0)) throw ArgumentError(ddp::detail::cat(name(), ": lr must be >= 0, got ", opt.lr));
    if (!(opt.beta1 >= 0 && opt.beta1 < 1) || !(opt.beta2 >= 0 && opt.beta2 < 1))
      throw ArgumentError(
          ddp::detail::cat(name(), ": betas must be in [0, 1), got (", opt.beta1, ", ", opt.beta2, ")"));
    if (!(opt.eps >= 0)) throw ArgumentError(ddp::detail::cat(name(), ": eps must be >= 0, got ", opt.eps));
    if (!(opt.weight_decay >= 0))
      throw ArgumentError(ddp::detail::cat(name(), ": weight_decay must be >= 0, got ", opt.weight_decay));
    pieces_ = detail::state_pieces(arena_, ranges_);
    decay_ = detail::decay_spans(name(), arena_, opt.weight_decay_rule, opt.weight_decay);
    counters_.assign(arena_.count(), 0);
    std::int64_t const numel = detail::shard_numel(ranges_);
    exp_avg_ = Tensor<T, S>(Shape{numel});
    exp_avg_sq_ = Tensor<T, S>(Shape{numel});
    Kernels<S>::fill(numel, T(0), exp_avg_.data());
    Kernels<S>::fill(numel, T(0), exp_avg_sq_.data());
  }

  void step() { update(detail::whole_arena(arena_)); }
  // The step of the parameters whose first element lies in `window` (arena elements [begin, end); a bucket),
  // and no others. Over windows that partition the arena, bitwise step().
  void update(ArenaShard::Range window) { update(window, detail::WholeRun{}); }
  // The same, with the kernel run over each stretch as `around(off, n, g, run)` says (optimizer.hpp, WholeRun).
  template <class Around>
  void update(ArenaShard::Range window, Around&& around) {
    detail::for_each_run_within(
        arena_, counters_, ranges_, window, [&](std::int64_t c, std::int64_t off, std::int64_t at, std::int64_t n) {
          double const t = double(c + 1);
          double const bc1 = 1.0 - std::pow(opt_.beta1, t), bc2 = 1.0 - std::pow(opt_.beta2, t);
          AdamStep<T> p{T(opt_.lr),           T(opt_.beta1), T(opt_.beta2),    T(opt_.eps),
                        T(opt_.weight_decay), Decoupled,     T(opt_.lr / bc1), T(std::sqrt(bc2))};
          around(off, n, static_cast<T const*>(arena_.grads().data() + off),
                 [&](std::int64_t o, std::int64_t k, T const* g) {
                   detail::for_each_decay(decay_, o, k, [&](std::int64_t o2, std::int64_t k2, double wd) {
                     std::int64_t const s = at + (o2 - off);
                     p.weight_decay = T(wd);
                     Kernels<S>::adam_update(k2, arena_.values().data() + o2, g + (o2 - o), exp_avg_.data() + s,
                                             exp_avg_sq_.data() + s, p);
                   });
                 });
        });
    detail::count_step(arena_, counters_, window);
  }
  void zero_grad() { arena_.zero_grad(); }
  double lr() const noexcept { return opt_.lr; }
  void set_lr(double lr) { opt_.lr = lr; }
  options_type const& options() const noexcept { return opt_; }
  // Bytes of optimizer state this object holds (two buffers of its shard's elements).
  std::int64_t state_bytes() const noexcept { return 2 * exp_avg_.numel() * static_cast<std::int64_t>(sizeof(T)); }

  // Per parameter, by name: loads into any arena of the same parameters (another bucket plan or world size).
  // Sharded, each parameter's piece only (ParameterState::begin).
  OptimizerState<T> state() const {
    return detail::gather_state(name(), opt_.lr, arena_, counters_, pieces_,
                                {{"exp_avg", &exp_avg_}, {"exp_avg_sq", &exp_avg_sq_}});
  }
  // Checks the whole state first (ArgumentError naming the parameter; nothing changes), then restores it.
  // Takes a full state (sharded: its own pieces of it).
  void load_state(OptimizerState<T> const& st) {
    detail::scatter_state(st, name(), arena_, counters_, pieces_,
                          {{"exp_avg", &exp_avg_}, {"exp_avg_sq", &exp_avg_sq_}});
    opt_.lr = st.lr;
  }

 private:
  nn::ParameterArena<T, S> arena_;
  options_type opt_;
  std::vector<ArenaShard::Range> ranges_;   // the arena elements this optimizer updates
  std::vector<detail::StatePiece> pieces_;  // per parameter: its piece of the state
  std::vector<detail::DecaySpan> decay_;    // the arena cut where the weight decay changes
  std::vector<std::int64_t> counters_;
  Tensor<T, S> exp_avg_, exp_avg_sq_;
};

template <class T = float, MemorySpace S = HostSpace>
using basic_adam_l2 = basic_adam<T, S, WeightDecay::kL2>;
template <class T = float, MemorySpace S = HostSpace>
using basic_adamw = basic_adam<T, S, WeightDecay::kDecoupled>;
using Adam = basic_adam<float, HostSpace, WeightDecay::kL2>;
using AdamW = basic_adam<float, HostSpace, WeightDecay::kDecoupled>;
static_assert(Optimizer<Adam> && Optimizer<AdamW>);

}  // namespace ddp::optim
