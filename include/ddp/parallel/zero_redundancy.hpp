// ZeroRedundancyOptimizer<O, C>: ZeRO stages 1 and 2 (Rajbhandari et al., 2020; PyTorch's ZeroRedundancyOptimizer
// is stage 1) over DistributedDataParallel. Each rank owns one slice of every gradient bucket, keeps the optimizer
// state of its slices only (1/world_size of the unsharded state, to within a 64-byte line per bucket), updates them
// with the optimizer's own kernel, and all-gathers every bucket's parameters after the step. Stage 2 also keeps
// only its slices' gradients once the step has used them: the rest of each bucket's gradient memory goes back to
// the kernel (host_pages.hpp) until the next backward writes it.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ddp/bucket/plan.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/optim/shard.hpp"
#include "ddp/parallel/attachment.hpp"
#include "ddp/parallel/owner_reduce.hpp"
#include "ddp/parallel/zero_exchange.hpp"
#include "ddp/tensor/host_pages.hpp"

namespace ddp {

struct ZeroOptions {
  // 0: every rank keeps the whole optimizer state (the optimizer itself); 1: each rank keeps its slices' state;
  // 2: and, after each step, its slices' gradients only (host-addressable memory: host tensors, or device tensors
  // on Thrust's CPU systems).
  int stage = 1;
};

// An optimizer that can update a shard of its arena: constructible from (arena, options, ArenaShard), and saying
// how much state it holds (ddp's SGD, Adam and AdamW).
template <class O, class T, class S>
concept ShardableOptimizer = optim::Optimizer<O> && std::constructible_from < O,
        nn::ParameterArena<T, S>,
typename O::options_type, optim::ArenaShard > &&requires(O const& o) {
  { o.state_bytes() } -> std::same_as<std::int64_t>;
};

namespace detail {
// The default exchange: the DDP's averaged gradients are in the arena; the optimizer steps this rank's slices and
// every bucket's parameters are all-gathered after the step (when sharded: stage 1 or 2 on more than one rank).
template <class O, Communicator C>
class ZeroGather final : public ZeroExchange<O> {
  using T = typename O::value_type;
  using S = typename O::space;

 public:
  ZeroGather(C& comm, nn::ParameterArena<T, S> const& arena, std::vector<ZeroBucket> buckets, bool sharded)
      : comm_(&comm), arena_(arena), buckets_(std::move(buckets)), sharded_(sharded) {
    if (!sharded_) return;
    std::int64_t widest = 0;
    for (auto const& b : buckets_) widest = std::max(widest, b.chunk);
    send_ = Tensor<T, S>(Shape{widest});
    gathered_ = Tensor<T, S>(Shape{widest * comm.world_size()});
    Kernels<S>::fill(widest, T(0), send_.data());
  }
  void step(O& inner) override {
    inner.step();
    complete();
  }
  void update(O& inner, optim::ArenaShard::Range window) override { inner.update(window); }
  void complete() override {
    if (sharded_) gather_parameters();
  }
  std::int64_t sent_bytes() const noexcept override {
    std::int64_t n = 0;
    if (sharded_)
      for (auto const& b : buckets_) n += b.chunk;
    return n * static_cast<std::int64_t>(sizeof(T));
  }
  std::string describe() const override { return cat("parameter all-gathers ", sent_bytes(), " bytes a step"); }
  Capabilities caps() const noexcept override { return {}; }

 private:
  void gather_parameters() {
    int const world = comm_->world_size(), rank = comm_->rank();
    T* const values = arena_.values().data();
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      auto const& z = buckets_[b];
      auto const mine = zero_slice(z, rank);
      std::int64_t const n = std::max<std::int64_t>(0, mine.end - mine.begin);
      if (n > 0) Kernels<S>::copy(n, values + mine.begin, send_.data());
      if (n < z.chunk) Kernels<S>::fill(z.chunk - n, T(0), send_.data() + n);
      comm_->all_gather(SpaceSpan<T const, S>(send_.data(), static_cast<std::size_t>(z.chunk)),
                        SpaceSpan<T, S>(gathered_.data(), static_cast<std::size_t>(z.chunk * world)),
                        CollectiveTag{"zero.parameters", static_cast<std::int64_t>(b)});
      Kernels<S>::copy(z.numel, gathered_.data(), values + z.start);
    }
  }

  C* comm_;
  nn::ParameterArena<T, S> arena_;
  std::vector<ZeroBucket> buckets_;
  bool sharded_;
  Tensor<T, S> send_, gathered_;  // one slice, and one bucket's world_size slices (sharded only)
};
}  // namespace detail

// Use in place of the optimizer, built after DistributedDataParallel from it:
//   ZeroRedundancyOptimizer<optim::AdamW, ThreadsBackend> opt(ddp, {.optimizer = {.lr = 1e-3}});
// and the loop is unchanged (zero_grad, forward/backward, step). Guarantees:
//  - the parameters after step() are bitwise those of the unsharded optimizer given the same gradients, on every
//    rank (each element is updated by one rank with the same kernel, then copied); so with deterministic mode
//    (ExactSum) a sharded run is bitwise the unsharded one, at any world size;
//  - it composes with every reduction policy (the gradients are DDP's, complete on every rank: clip_grad_norm
//    and the non-finite checks see them as without sharding);
//  - state() is this rank's pieces (ParameterState::begin); consolidated_state() (collective) is the full state,
//    which is what save_checkpoint writes; load_state() takes a full state and keeps this rank's pieces, so a
//    checkpoint written at one world size (sharded or not) resumes at any other, re-cut at load;
//  - stage 2: between backward and step() the gradients are DDP's, complete (clipping, GradScaler and the
//    non-finite checks see them whole); step() then zeroes each bucket's gradients outside this rank's slice and
//    hands their pages back, so from one step's end to the next backward a rank holds 1/world_size of the
//    gradients (gradient_bytes(), to within the two pages at each end of a slice). Backward writes them all
//    again: the peak is not lowered, the memory between steps (forward, data loading, evaluation) is. Call
//    zero_grad() before each step's backward, as the loop does: accumulating into a released gradient would add
//    to zeros where stage 1 adds to the last round's average.
// Cost: one all-gather per bucket after each step (the parameters' bytes), on the caller's thread; stage 2 adds
// the madvise calls (no copies). The communication around the step is its exchange (zero_exchange.hpp): those
// all-gathers, or, built from a DDP under OwnerReduce (ranks sharing one address space), the reduction of each
// slice straight from every rank's gradients and the parameters written to every replica (owner_reduce.hpp).
// Built from a DistributedDataParallel it attaches to it (attachment.hpp) for its lifetime, declaring that it shards
// the state (stage 1 or 2) and, under OwnerReduce, that it reduces the gradients: the composition rules
// (composition.hpp) then refuse what does not compose with that (ddp::join, a second reducing optimizer, stage 0).
template <class O, Communicator C>
class ZeroRedundancyOptimizer : public DdpHook {
 public:
  using value_type = typename O::value_type;
  using space = typename O::space;
  using T = value_type;
  using S = space;
  struct options_type {
    typename O::options_type optimizer{};
    ZeroOptions zero{};
  };
  static_assert(ShardableOptimizer<O, T, S>,
                "ZeroRedundancyOptimizer: the optimizer must take (arena, options, optim::ArenaShard) and report "
                "state_bytes() (optim::basic_sgd, basic_adam_l2, basic_adamw do)");

  ZeroRedundancyOptimizer(nn::ParameterArena<T, S> const& arena, BucketPlan const& plan, C& comm, options_type opt)
      : comm_(&comm),
        zero_(checked(opt.zero)),
        arena_(arena),
        buckets_(detail::zero_buckets(plan, arena, comm.world_size())),
        inner_(arena, opt.optimizer, shard(buckets_, zero_, comm.rank())),
        exchange_(std::make_unique<detail::ZeroGather<O, C>>(comm, arena, buckets_, sharded())) {
    if (zero_.stage == 2 && !host_accessible_v<S>)
      throw ArgumentError(
          "ZeroRedundancyOptimizer: stage 2 hands the gradient pages outside this rank's slices back to the system, "
          "which needs memory the host addresses (host tensors, or device tensors on Thrust's CPU systems). On CUDA "
          "use stage 1");
    unsharded_bytes_ = static_cast<std::int64_t>(inner_.state().buffer_names.size()) * arena_.numel() *
                       static_cast<std::int64_t>(sizeof(T));
  }
  // Over a DistributedDataParallel's parameters, plan and communicator (build it after the wrapper, as any
  // optimizer).
  template <class D>
  requires requires(D& d, DdpHook& h) {
    { d.parameters() } -> std::convertible_to<nn::ParameterArena<T, S> const&>;
    { d.plan() } -> std::convertible_to<BucketPlan const&>;
    { d.comm() } -> std::same_as<C&>;
    { d.attach(h) } -> std::same_as<Attachment>;
  }
  ZeroRedundancyOptimizer(D& ddp, options_type opt)
      : ZeroRedundancyOptimizer(ddp.parameters(), ddp.plan(), ddp.comm(), opt) {
    if constexpr (requires { D::reduces_gradients; })
      if constexpr (!D::reduces_gradients)  // OwnerReduce: this optimizer reduces (collective: the addresses)
        exchange_ = std::make_unique<detail::OwnerReduceExchange<O, C>>(ddp.comm(), arena_, buckets_,
                                                                        ddp.micro_batches_per_rank(), zero_.stage);
    attachment_ = ddp.attach(*this);  // refused, the same on every rank, where it does not compose
  }

  ZeroRedundancyOptimizer(ZeroRedundancyOptimizer const&) = delete;
  ZeroRedundancyOptimizer& operator=(ZeroRedundancyOptimizer const&) = delete;
  ~ZeroRedundancyOptimizer() = default;

  // How it appears to the composition rules (composition.hpp).
  HookTraits traits() const override {
    Capabilities caps = exchange_->caps();
    if (zero_.stage >= 1) caps = caps | Capability::kShardsState;
    return {.name = "ZeroRedundancyOptimizer", .caps = caps};
  }

  // The state kind is the optimizer's: a checkpoint of a sharded run loads into an unsharded one and back.
  static std::string name() { return O::name(); }

  // Collective when sharded (every rank, the same steps): updates this rank's slices, then all-gathers every
  // bucket's parameters.
  void step() {
    exchange_->step(inner_);
    release_gradients();
  }
  // step() in two parts, for OverlappedOptimizer (overlapped_update.hpp): this rank's slices of the whole
  // parameters in arena elements `window` (no communication), then, once every bucket was updated, the
  // exchange's completion (collective when sharded).
  void update(optim::ArenaShard::Range window) { exchange_->update(inner_, window); }
  void complete_step() {
    exchange_->complete();
    release_gradients();
  }
  void zero_grad() { inner_.zero_grad(); }
  double lr() const noexcept { return inner_.lr(); }
  void set_lr(double lr) { inner_.set_lr(lr); }
  O const& optimizer() const noexcept { return inner_; }
  ZeroOptions const& zero_options() const noexcept { return zero_; }
  // Whether step() shards (stage 1 or 2 on more than one rank): ddp::join refuses such an optimizer.
  bool sharded() const noexcept { return zero_.stage >= 1 && comm_->world_size() > 1; }
  // Whether this optimizer reduces the gradients itself (built from a DDP under OwnerReduce).
  bool owner_reduces() const noexcept { return exchange_->caps().has(Capability::kReducesGradients); }

  // Optimizer-state bytes on this rank, and what the unsharded optimizer would hold.
  std::int64_t state_bytes() const noexcept { return inner_.state_bytes(); }
  std::int64_t unsharded_state_bytes() const noexcept { return unsharded_bytes_; }
  // Gradient bytes resident on this rank (the pages of the arena's gradients in memory now: after a stage-2
  // step, its slices' and the pages at their ends; otherwise every gradient page backward wrote), and the
  // arena's gradient bytes (what stage 0 and 1 keep). Host-addressable memory only; elsewhere the whole size.
  std::int64_t gradient_bytes() const {
    auto const& g = arena_.grads();
    std::size_t const bytes = static_cast<std::size_t>(g.numel()) * sizeof(T);
    if constexpr (host_accessible_v<S>)
      return static_cast<std::int64_t>(std::min(bytes, detail::resident_bytes(g.data(), bytes)));
    else
      return static_cast<std::int64_t>(bytes);
  }
  std::int64_t unsharded_gradient_bytes() const noexcept {
    return arena_.grads().numel() * static_cast<std::int64_t>(sizeof(T));
  }
  // Parameter bytes this rank sends per step in the all-gathers (its slice of every bucket, padded).
  std::int64_t gather_bytes() const noexcept { return exchange_->sent_bytes(); }
  // What was composed, for logs: the stage, the state this rank holds and what the all-gathers send.
  std::string describe() const {
    if (zero_.stage == 0)
      return detail::cat("ZeRO-0 (unsharded) ", O::name(), ": optimizer state ", state_bytes(), " bytes on each rank");
    return detail::cat("ZeRO-", zero_.stage, " ", O::name(), " over ", comm_->world_size(), " ranks: optimizer state ",
                       state_bytes(), " bytes on rank ", comm_->rank(), " (unsharded: ", unsharded_state_bytes(), "), ",
                       exchange_->describe(),
                       zero_.stage == 2 && sharded() ? "; gradients outside its slices released after each step" : "");
  }

  // This rank's pieces (sharded) or the whole state.
  optim::OptimizerState<T> state() const { return inner_.state(); }
  // Collective when sharded: every rank's pieces, put together (one all-gather of host copies).
  optim::OptimizerState<T> consolidated_state() const {
    auto mine = inner_.state();
    if (!sharded()) return mine;
    int const world = comm_->world_size();
    std::size_t const nb = mine.buffer_names.size();
    std::vector<std::vector<optim::detail::StatePiece>> pieces;  // per rank
    std::size_t widest = 0;
    for (int q = 0; q < world; ++q) {
      auto const ranges = detail::zero_ranges(buckets_, q);
      pieces.push_back(optim::detail::state_pieces(arena_, ranges));
      widest = std::max(widest, static_cast<std::size_t>(optim::detail::shard_numel(ranges)) * nb);
    }
    std::vector<T> flat(widest, T(0)), all(widest * static_cast<std::size_t>(world));
    std::size_t at = 0;
    for (auto const& p : mine.parameters)
      for (auto const& b : p.buffers)
        at = static_cast<std::size_t>(std::copy(b.begin(), b.end(), flat.begin() + at) - flat.begin());
    host_all_gather(*comm_, std::span<T const>(flat), std::span<T>(all), CollectiveTag{"zero.state"});
    for (auto& p : mine.parameters) {
      p.begin = 0;
      for (auto& b : p.buffers) b.assign(static_cast<std::size_t>(optim::detail::numel_of(p.shape)), T(0));
    }
    for (int q = 0; q < world; ++q) {
      T const* src = all.data() + static_cast<std::size_t>(q) * widest;
      for (std::size_t i = 0; i < mine.parameters.size(); ++i) {
        auto const& piece = pieces[static_cast<std::size_t>(q)][i];
        for (std::size_t b = 0; b < nb; ++b, src += piece.numel)
          std::copy(src, src + piece.numel, mine.parameters[i].buffers[b].begin() + piece.begin);
      }
    }
    return mine;
  }
  // A full state (ArgumentError naming the parameter otherwise; nothing changes): this rank keeps its pieces.
  void load_state(optim::OptimizerState<T> const& st) { inner_.load_state(st); }

 private:
  static ZeroOptions checked(ZeroOptions z) {
    if (z.stage < 0 || z.stage > 2)
      throw ArgumentError(
          detail::cat("ZeroRedundancyOptimizer: stage must be 0 (unsharded), 1 (optimizer state sharded) or 2 (and the "
                      "gradients kept only for this rank's slices after each step), got ",
                      z.stage));
    return z;
  }
  static optim::ArenaShard shard(std::vector<detail::ZeroBucket> const& buckets, ZeroOptions z, int rank) {
    if (z.stage == 0) return {};
    return optim::ArenaShard(detail::zero_ranges(buckets, rank));
  }
  // Stage 2, after the step: each bucket's gradients outside this rank's slice are zeroed and their whole pages
  // handed back (nothing reads them until the next backward writes them again).
  void release_gradients() {
    if constexpr (host_accessible_v<S>) {
      if (zero_.stage != 2 || !sharded()) return;
      T* const grads = arena_.grads().data();
      for (auto const& z : buckets_) {
        auto const mine = detail::zero_slice(z, comm_->rank());
        std::int64_t const lo = z.start, hi = z.start + z.numel;
        std::int64_t const own_lo = std::clamp(mine.begin, lo, hi), own_hi = std::clamp(mine.end, own_lo, hi);
        detail::zero_and_release(grads + lo, static_cast<std::size_t>(own_lo - lo) * sizeof(T));
        detail::zero_and_release(grads + own_hi, static_cast<std::size_t>(hi - own_hi) * sizeof(T));
      }
    }
  }
  C* comm_;
  ZeroOptions zero_;
  nn::ParameterArena<T, S> arena_;
  std::vector<detail::ZeroBucket> buckets_;
  O inner_;
  std::int64_t unsharded_bytes_ = 0;
  std::unique_ptr<detail::ZeroExchange<O>> exchange_;  // the communication around a step
  Attachment attachment_;                              // to the DDP it was built from, if any (destroyed first)
};

}  // namespace ddp
