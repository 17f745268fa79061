// LocalSgd<O> and DiLoCo<O>: data parallelism that communicates every H steps instead of every step, for when the
// network is the bottleneck (a slow link between nodes, ranks on different sites). Both are optimizers built from a
// DistributedDataParallel, in place of O, and the training loop does not change:
//   LocalSgd<optim::SGD, Comm> opt(ddp, {.optimizer = {.lr = 0.1}, .local = {.period = 8, .warmup_steps = 100}});
//   DiLoCo<optim::AdamW, Comm> opt(ddp, {.optimizer = {.lr = 1e-3}, .outer = {.period = 50}});
// They attach to the DDP as local-round hooks (attachment.hpp, Capability::kLocalRounds): in a local step the DDP
// opens no round, nothing travels, and each rank's optimizer steps its own replica on its own mean gradient.
//  - LocalSgd (Lin et al. 2020, "Don't use large mini-batches, use local SGD"; PyTorch's PostLocalSGDOptimizer with
//    its post_localSGD_hook): the first warmup_steps steps are ordinary DDP steps (post-local SGD), then every step
//    is local and every period-th step ends with the parameters averaged across ranks (and, with
//    average_optimizer_state, the optimizer's buffers: momentum, Adam's moments, which PyTorch never averages).
//  - DiLoCo (Douillard et al. 2023): every step is local; every period-th step ends with an outer step. The
//    parameters' change since the last outer step, averaged across ranks (the pseudo-gradient: kept - current), is
//    applied to the kept copy of the synced parameters by SGD with Nesterov momentum (outer_lr 0.7 and momentum 0.9,
//    the paper's), and every replica restarts from the result. The inner optimizer's state stays each rank's own.
//    DiLoCoOptions::wire sends the pseudo-gradient as bfloat16 or float16 (half the bytes; CompressedAllReduce's cast).
// The averages are all-reduces (kAvg) of the arena's bucket slices, tagged "average", in plan order: they show up in
// Recording traces as their own collectives; a local step launches none. After an average every rank holds the same
// parameters (bitwise: the backend's all-reduce is the same on every rank); buffers (BatchNorm's statistics) are then
// rank 0's, as a DDP round would make them.
// Composition (composition.hpp, rules local-alone and local-exact): refused with ddp::join, ZeRO, OwnerReduce, an
// update in backward (OverlappedOptimizer) or a second local-round hook, and in deterministic mode (an exact local
// SGD needs virtual replicas). Non-finite checks (DdpOptions::non_finite) run in the synchronous steps only.
// Checkpoints refuse them for now (checkpoint_refusal). Not copyable or movable (the DDP points at it while attached).
// One thread per rank.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ddp/bucket/plan.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/parallel/attachment.hpp"
#include "ddp/parallel/composition.hpp"
#include "ddp/parallel/overlapped_update.hpp"
#include "ddp/parallel/replicas.hpp"
#include "ddp/tensor/half.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/trace/timeline.hpp"

namespace ddp {

struct LocalSgdOptions {
  std::int64_t period = 8;               // H: steps between two parameter averages (>= 1)
  std::int64_t warmup_steps = 0;         // W: ordinary DDP steps first (post-local SGD); 0: local from the start
  bool average_optimizer_state = false;  // also average the optimizer's buffers at each average
};

// How DiLoCo's pseudo-gradient travels: as the parameters' type, or cast to a 16-bit float (scaled by 1/world, summed,
// cast back: the bucket wire of CompressedAllReduce, half the bytes; the backend must move 16-bit floats).
enum class PseudoGradient { kFloat, kBf16, kFp16 };

struct DiLoCoOptions {
  std::int64_t period = 500;    // H: inner (local) steps between two outer steps (>= 1)
  double outer_lr = 0.7;        // the outer SGD's learning rate
  double outer_momentum = 0.9;  // its Nesterov momentum (0: plain SGD)
  PseudoGradient wire = PseudoGradient::kFloat;
};

namespace detail {
inline void check_period(std::int64_t period, char const* who) {
  if (period < 1) throw ArgumentError(cat(who, ": period must be at least 1 step, got ", period));
}

// What LocalSgd and DiLoCo share: the inner optimizer over the DDP's arena, the step count, the attachment that makes
// the DDP's steps local, and the bucket-wise average of a tensor laid out like the arena.
template <optim::Optimizer O, Communicator C>
class LocalRounds : public DdpHook {
 public:
  using value_type = typename O::value_type;
  using space = typename O::space;
  using T = value_type;
  using S = space;

  template <class D>
  LocalRounds(D& ddp, typename O::options_type const& o, std::string name)
      : arena_(&ddp.parameters()),
        plan_(&ddp.plan()),
        comm_(&ddp.comm()),
        per_rank_(ddp.micro_batches_per_rank()),
        timeline_(ddp.options().timeline),
        inner_(ddp.parameters(), o),
        name_(std::move(name)) {
    static_assert(std::same_as<typename D::space, S> && std::same_as<std::remove_cvref_t<decltype(ddp.comm())>, C>,
                  "LocalSgd / DiLoCo<O, C>: build it from a DistributedDataParallel over communicator C whose "
                  "parameters are O's tensors");
    static_assert(!std::constructible_from<O, D&, typename O::options_type const&>,
                  "LocalSgd / DiLoCo: the inner optimizer must be a plain one over the parameters (SGD, Adam, AdamW), "
                  "not one built from the DDP (ZeroRedundancyOptimizer, OverlappedOptimizer)");
    if (ddp.options().broadcast_buffers && comm_->world_size() > 1)
      sync_buffers_ = [&ddp] { detail::broadcast_buffers(ddp.comm(), ddp.module(), 0); };
    attach_ = [&ddp](DdpHook& h) { return ddp.attach(h); };
  }
  LocalRounds(LocalRounds const&) = delete;
  LocalRounds& operator=(LocalRounds const&) = delete;

  static std::string name() { return O::name(); }
  void zero_grad() { inner_.zero_grad(); }
  double lr() const noexcept { return inner_.lr(); }
  void set_lr(double lr) { inner_.set_lr(lr); }
  O& optimizer() noexcept { return inner_; }
  O const& optimizer() const noexcept { return inner_; }
  // The inner optimizer's state (checkpoints refuse these optimizers: checkpoint_refusal).
  optim::OptimizerState<T> state() const { return inner_.state(); }
  void load_state(optim::OptimizerState<T> const& st) { inner_.load_state(st); }
  // Steps taken (synchronous and local).
  std::int64_t steps() const noexcept { return steps_; }
  // Averages taken (LocalSgd) or outer steps (DiLoCo), and the bytes one rank sent in them.
  std::int64_t syncs() const noexcept { return syncs_; }
  std::int64_t bytes_sent() const noexcept { return bytes_; }
  // What was composed, for logs.
  std::string describe() const {
    std::string what;
    if constexpr (requires { inner_.describe(); })
      what = inner_.describe();
    else
      what = O::name();
    return cat_describe(what);
  }
  HookTraits traits() const override { return {.name = name_, .caps = Capability::kLocalRounds}; }
  // save_checkpoint and load_checkpoint refuse it with this (train/checkpoint.hpp).
  static constexpr std::string_view checkpoint_refusal =
      "checkpoint: LocalSgd and DiLoCo are not checkpointed yet: between averages each rank's replica and inner "
      "optimizer state differ, and DiLoCo keeps the synced weights and the outer momentum besides; a file holds one "
      "rank's";

 protected:
  ~LocalRounds() override = default;
  virtual std::string cat_describe(std::string const& inner) const = 0;
  void attach() { attachment_ = attach_(*this); }

  // The inner step on this rank's own mean gradient: the DDP left the sum over its micro-batches.
  void local_step() {
    auto& arena = *arena_;
    std::int64_t const per_rank = per_rank_;
    if (per_rank > 1)
      for (std::size_t i = 0; i < arena.count(); ++i)
        if (arena.has_grad(i)) {
          auto const& e = arena.entries()[i];
          Kernels<S>::axpby(e.numel, T(1) / T(per_rank), arena.grads().data() + e.offset, T(0),
                            arena.grads().data() + e.offset);
        }
    inner_.step();
  }

  // fn(b, lo, n) for each bucket b: its parameters are arena elements [lo, lo + n) (the gaps between buckets hold
  // no parameter).
  template <class Fn>
  void for_each_bucket(Fn&& fn) const {
    auto const& buckets = plan_->buckets;
    for (std::size_t b = 0; b < buckets.size(); ++b)
      fn(b, arena_->entries()[buckets[b].params.front()].offset, buckets[b].numel);
  }

  // Replaces `x` (laid out like the arena's values) by its average over the ranks, bucket by bucket, in T or (H a
  // 16-bit float) through a buffer of H: x / world cast, summed, cast back. Each bucket is a span on the timeline's
  // communication lane (DdpOptions::timeline).
  // `buffer`: room for the arena's values in H (unused when H is T).
  template <class H = T>
  void average(T* x, H* buffer = nullptr) {
    for_each_bucket([&](std::size_t b, std::int64_t lo, std::int64_t n) {
      auto const t0 = Timeline::clock::now();
      CollectiveTag const tag{"average", static_cast<std::int64_t>(b)};
      if constexpr (std::same_as<H, T>) {
        comm_->all_reduce(SpaceSpan<T, S>(x + lo, static_cast<std::size_t>(n)), ReduceOp::kAvg, tag);
      } else {
        H* const h = buffer + lo;
        Kernels<S>::cast(n, 1.0f / static_cast<float>(comm_->world_size()), x + lo, h);
        comm_->all_reduce(SpaceSpan<H, S>(h, static_cast<std::size_t>(n)), ReduceOp::kSum, tag);
        Kernels<S>::cast(n, 1.0f, h, x + lo);
      }
      std::int64_t const bytes = n * static_cast<std::int64_t>(sizeof(H));
      if (timeline_)
        timeline_->add(detail::cat("average bucket ", b, " (", bytes, " bytes)"), "comm", t0, Timeline::clock::now(),
                       Timeline::kComm);
      bytes_ += bytes;
    });
  }
  T* values() const noexcept { return arena_->values().data(); }

  nn::ParameterArena<T, S>* arena_;
  BucketPlan const* plan_;
  C* comm_;
  std::int64_t per_rank_;
  Timeline* timeline_;
  std::function<void()> sync_buffers_;  // rank 0's buffers everywhere (empty: nothing to do)
  std::function<Attachment(DdpHook&)> attach_;
  O inner_;
  std::string name_;
  std::int64_t steps_ = 0, syncs_ = 0, bytes_ = 0;
  Attachment attachment_;
};
}  // namespace detail

// Local SGD and post-local SGD (see the top of this file), over a DistributedDataParallel on communicator C.
template <optim::Optimizer O, Communicator C>
class LocalSgd final : public detail::LocalRounds<O, C> {
  using Base = detail::LocalRounds<O, C>;
  using T = typename Base::T;

 public:
  struct options_type {
    typename O::options_type optimizer{};
    LocalSgdOptions local{};
  };

  template <class D>
  LocalSgd(D& ddp, options_type const& o) : Base(ddp, o.optimizer, "LocalSgd"), opts_(o.local) {
    detail::check_period(opts_.period, "LocalSgd");
    if (opts_.warmup_steps < 0)
      throw ArgumentError(detail::cat("LocalSgd: warmup_steps must be >= 0, got ", opts_.warmup_steps));
    this->attach();
  }

  static constexpr char const* kSyncName = "parameter averages";
  LocalSgdOptions const& local_options() const noexcept { return opts_; }
  // Steps taken as ordinary DDP steps (the warm-up's).
  std::int64_t sync_steps() const noexcept { return std::min(this->steps_, opts_.warmup_steps); }

  // Whether the coming step is local (after the warm-up).
  bool local_round() const override { return this->steps_ >= opts_.warmup_steps; }

  void step() {
    if (!local_round()) {  // a synchronous DDP step: the gradients are the global mean
      this->inner_.step();
      ++this->steps_;
      return;
    }
    this->local_step();
    ++this->steps_;
    if ((this->steps_ - opts_.warmup_steps) % opts_.period != 0) return;
    this->average(this->values());
    if (opts_.average_optimizer_state) average_state();
    if (this->sync_buffers_) this->sync_buffers_();
    ++this->syncs_;
  }

 private:
  std::string cat_describe(std::string const& inner) const override {
    return detail::cat(
        inner, "; local SGD: ", opts_.warmup_steps > 0 ? detail::cat(opts_.warmup_steps, " DDP steps, then ") : "",
        "parameters averaged every ", opts_.period, " steps",
        opts_.average_optimizer_state ? " with the optimizer's state" : "");
  }

  // Each parameter's buffers averaged (one all-reduce per parameter and buffer, rank order the backend's).
  void average_state() {
    auto st = this->inner_.state();
    for (auto& p : st.parameters)
      for (auto& buf : p.buffers) {
        host_all_reduce(*this->comm_, std::span<T>(buf), ReduceOp::kAvg, CollectiveTag{"average.state"});
        this->bytes_ += static_cast<std::int64_t>(buf.size() * sizeof(T));
      }
    this->inner_.load_state(st);
  }

  LocalSgdOptions opts_;
};

// DiLoCo (see the top of this file): an inner optimizer for `period` local steps, then an outer Nesterov step on
// the averaged pseudo-gradient.
template <optim::Optimizer O, Communicator C>
class DiLoCo final : public detail::LocalRounds<O, C> {
  using Base = detail::LocalRounds<O, C>;
  using T = typename Base::T;
  using S = typename Base::S;

 public:
  struct options_type {
    typename O::options_type optimizer{};
    DiLoCoOptions outer{};
  };

  template <class D>
  DiLoCo(D& ddp, options_type const& o) : Base(ddp, o.optimizer, "DiLoCo"), opts_(o.outer) {
    detail::check_period(opts_.period, "DiLoCo");
    if (!(opts_.outer_lr > 0))
      throw ArgumentError(detail::cat("DiLoCo: outer_lr must be positive, got ", opts_.outer_lr));
    if (!(opts_.outer_momentum >= 0 && opts_.outer_momentum < 1))
      throw ArgumentError(detail::cat("DiLoCo: outer_momentum must be in [0, 1), got ", opts_.outer_momentum));
    std::int64_t const n = this->arena_->values().numel();
    kept_ = Tensor<T, S>(Shape{n});
    delta_ = Tensor<T, S>(Shape{n});
    if (opts_.outer_momentum > 0) momentum_ = Tensor<T, S>(Shape{n});
    if (opts_.wire != PseudoGradient::kFloat) {
      if constexpr (HalfCommunicator<C>) {
        if (opts_.wire == PseudoGradient::kBf16)
          bf16_ = SpaceAllocator<S>::template allocate<bfloat16>(static_cast<std::size_t>(n));
        if (opts_.wire == PseudoGradient::kFp16)
          fp16_ = SpaceAllocator<S>::template allocate<float16>(static_cast<std::size_t>(n));
      } else {
        throw ArgumentError(
            "DiLoCo: a 16-bit pseudo-gradient needs a backend that moves bfloat16/float16 "
            "(HalfCommunicator: ThreadsBackend, MpiBackend, NcclBackend)");
      }
    }
    this->for_each_bucket([&](std::size_t, std::int64_t lo, std::int64_t k) {  // rank 0's on every rank (DDP)
      Kernels<S>::copy(k, this->values() + lo, kept_.data() + lo);
    });
    this->attach();
  }

  static constexpr char const* kSyncName = "outer steps";
  DiLoCoOptions const& outer_options() const noexcept { return opts_; }
  std::int64_t sync_steps() const noexcept { return 0; }

  bool local_round() const override { return true; }

  void step() {
    this->local_step();
    ++this->steps_;
    if (this->steps_ % opts_.period == 0) outer_step();
  }

 private:
  std::string cat_describe(std::string const& inner) const override {
    return detail::cat(inner, " inside DiLoCo: an outer step every ", opts_.period, " steps (SGD, lr ", opts_.outer_lr,
                       ", Nesterov momentum ", opts_.outer_momentum, ")",
                       opts_.wire == PseudoGradient::kBf16   ? ", pseudo-gradient as bfloat16"
                       : opts_.wire == PseudoGradient::kFp16 ? ", pseudo-gradient as float16"
                                                             : "");
  }

  // delta = kept - x, averaged; m = mu m + delta; kept -= lr (delta + mu m) (PyTorch's SGD with nesterov=True);
  // x = kept. Element-wise over each bucket's slice (the gaps between buckets are not parameters).
  void outer_step() {
    T* const x = this->values();
    this->for_each_bucket([&](std::size_t, std::int64_t lo, std::int64_t n) {
      Kernels<S>::add(n, T(1), kept_.data() + lo, T(-1), x + lo, delta_.data() + lo);
    });
    if (opts_.wire == PseudoGradient::kBf16)
      this->average(delta_.data(), bf16_.get());
    else if (opts_.wire == PseudoGradient::kFp16)
      this->average(delta_.data(), fp16_.get());
    else
      this->average(delta_.data());
    T const mu = static_cast<T>(opts_.outer_momentum), lr = static_cast<T>(opts_.outer_lr);
    this->for_each_bucket([&](std::size_t, std::int64_t lo, std::int64_t n) {
      T* const d = delta_.data() + lo;
      if (mu > T(0)) {
        if (this->syncs_ == 0)  // the first step: the buffer is the gradient (PyTorch's)
          Kernels<S>::copy(n, d, momentum_.data() + lo);
        else
          Kernels<S>::axpby(n, T(1), d, mu, momentum_.data() + lo);
        Kernels<S>::axpby(n, mu, momentum_.data() + lo, T(1), d);  // Nesterov: delta + mu m
      }
      Kernels<S>::axpby(n, -lr, d, T(1), kept_.data() + lo);
      Kernels<S>::copy(n, kept_.data() + lo, x + lo);
    });
    ++this->syncs_;
  }

  DiLoCoOptions opts_;
  Tensor<T, S> kept_, delta_, momentum_;  // laid out like the arena's values
  std::shared_ptr<bfloat16[]> bf16_;      // the pseudo-gradient on a 16-bit wire (DiLoCoOptions::wire)
  std::shared_ptr<float16[]> fp16_;
};

}  // namespace ddp
