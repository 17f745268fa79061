// SGD with momentum, dampening, Nesterov and weight decay: PyTorch 1.13's update rule, one fused pass.
#pragma once

#include "ddp/optim/optimizer.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp::optim {

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  DecayRule weight_decay_rule{};  // set: each parameter's own decay (parameter groups), overriding weight_decay
};

// Deterministic: the same gradients give bitwise the same parameters on every rank and run. Given a shard
// (ArenaShard), it updates and keeps momentum for those elements only, with bitwise the values the unsharded
// optimizer gives them.
template <class T = float, MemorySpace S = HostSpace>
class basic_sgd {
 public:
  using value_type = T;
  using space = S;
  using options_type = SgdOptions;
  static std::string name() { return "sgd"; }

  basic_sgd(nn::ParameterArena<T, S> arena, SgdOptions opt, ArenaShard shard = {})
      : arena_(std::move(arena)), opt_(opt), ranges_(shard.resolve(arena_.numel())) {
    if (!(opt.lr >= 0)) throw ArgumentError(ddp::detail::cat("SGD: lr must be >= 0, got ", opt.lr));
    if (!(opt.momentum >= 0)) throw ArgumentError(ddp::detail::cat("SGD: momentum must be >= 0, got ", opt.momentum));
    if (!(opt.weight_decay >= 0))
      throw ArgumentError(ddp::detail::cat("SGD: weight_decay must be >= 0, got ", opt.weight_decay));
    if (opt.nesterov && (opt.momentum <= 0 || opt.dampening != 0))
      throw ArgumentError("SGD: nesterov needs momentum > 0 and dampening = 0");
    pieces_ = detail::state_pieces(arena_, ranges_);
    decay_ = detail::decay_spans(name(), arena_, opt.weight_decay_rule, opt.weight_decay);
    counters_.assign(arena_.count(), 0);
    if (opt.momentum != 0) momentum_ = Tensor<T, S>(Shape{detail::shard_numel(ranges_)});
  }

  void step() { update(detail::whole_arena(arena_)); }
  // The step of the parameters whose first element lies in `window` (arena elements [begin, end); a bucket),
  // and no others. Over windows that partition the arena, bitwise step() (the parallel/overlapped_update.hpp
  // optimizer updates each bucket as its reduction lands).
  void update(ArenaShard::Range window) { update(window, detail::WholeRun{}); }
  // The same, with the kernel run over each stretch as `around(off, n, g, run)` says (optimizer.hpp, WholeRun).
  template <class Around>
  void update(ArenaShard::Range window, Around&& around) {
    detail::for_each_run_within(
        arena_, counters_, ranges_, window, [&](std::int64_t c, std::int64_t off, std::int64_t at, std::int64_t n) {
          SgdStep<T> p{T(opt_.lr), T(opt_.momentum), T(opt_.dampening), T(opt_.weight_decay), opt_.nesterov, c == 0};
          around(off, n, static_cast<T const*>(arena_.grads().data() + off),
                 [&](std::int64_t o, std::int64_t k, T const* g) {
                   detail::for_each_decay(decay_, o, k, [&](std::int64_t o2, std::int64_t k2, double wd) {
                     p.weight_decay = T(wd);
                     Kernels<S>::sgd_update(k2, arena_.values().data() + o2, g + (o2 - o),
                                            momentum_.defined() ? momentum_.data() + at + (o2 - off) : nullptr, p);
                   });
                 });
        });
    detail::count_step(arena_, counters_, window);
  }
  void zero_grad() { arena_.zero_grad(); }
  double lr() const noexcept { return opt_.lr; }
  void set_lr(double lr) { opt_.lr = lr; }
  SgdOptions const& options() const noexcept { return opt_; }
  // Bytes of optimizer state this object holds (the momentum buffer, its shard's elements).
  std::int64_t state_bytes() const noexcept {
    return momentum_.defined() ? momentum_.numel() * static_cast<std::int64_t>(sizeof(T)) : 0;
  }

  // Per parameter, by name: loads into any arena of the same parameters (another bucket plan or world size).
  // Sharded, each parameter's piece only (ParameterState::begin).
  OptimizerState<T> state() const {
    return detail::gather_state(name(), opt_.lr, arena_, counters_, pieces_, buffers());
  }
  // Checks the whole state first (ArgumentError naming the parameter; nothing changes), then restores it.
  // Takes a full state (sharded: its own pieces of it).
  void load_state(OptimizerState<T> const& st) {
    std::vector<std::pair<std::string, Tensor<T, S>*>> bufs;
    if (momentum_.defined()) bufs.emplace_back("momentum_buffer", &momentum_);
    detail::scatter_state(st, name(), arena_, counters_, pieces_, bufs);
    opt_.lr = st.lr;
  }

 private:
  nn::ParameterArena<T, S> arena_;
  SgdOptions opt_;
  std::vector<ArenaShard::Range> ranges_;   // the arena elements this optimizer updates
  std::vector<detail::StatePiece> pieces_;  // per parameter: its piece of the state
  std::vector<detail::DecaySpan> decay_;    // the arena cut where the weight decay changes
  std::vector<std::int64_t> counters_;      // steps taken per parameter (0: momentum not yet initialised)
  Tensor<T, S> momentum_;

  std::vector<std::pair<std::string, Tensor<T, S> const*>> buffers() const {
    if (!momentum_.defined()) return {};
    return {{"momentum_buffer", &momentum_}};
  }
};

using SGD = basic_sgd<>;
static_assert(Optimizer<SGD>);

}  // namespace ddp::optim
