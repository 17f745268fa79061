// LocalSgd<O> and DiLoCo<O>: data parallelism that communicates every H steps instead of every step, for when the
// network is the bottleneck (a slow link between nodes, ranks on different sites). Both are optimizers built from a
// DistributedDataParallel, in place of O, and the training loop does not change:
//   LocalSgd<optim::SGD, Comm> opt(ddp, {.optimizer = {.lr = 0.1}, .local = {.period = 8, .warmup_steps = 100}});
//   DiLoCo<optim::AdamW, Comm> opt(ddp, {.optimizer = {.lr = 1e-3}, .outer = {.period = 50}});
// They attach to the DDP as local-round hooks (attachment.hpp, Capability::kLocalRounds): in a local step the DDP
// opens no round, nothing travels, and each replica's optimizer steps it on its own mean gradient.
//  - LocalSgd (Lin et al. 2020, "Don't use large mini-batches, use local SGD"; PyTorch's PostLocalSGDOptimizer with
//    its post_localSGD_hook): the first warmup_steps steps are ordinary DDP steps (post-local SGD), then every step
//    is local and every period-th step ends with the parameters averaged across replicas (and, with
//    average_optimizer_state, the optimizer's buffers: momentum, Adam's moments, which PyTorch never averages).
//  - DiLoCo (Douillard et al. 2023): every step is local; every period-th step ends with an outer step. The
//    parameters' change since the last outer step, averaged across replicas (the pseudo-gradient: kept - current), is
//    applied to the kept copy of the synced parameters by SGD with Nesterov momentum (outer_lr 0.7 and momentum 0.9,
//    the paper's), and every replica restarts from the result. The inner optimizer's state stays each replica's own.
//    DiLoCoOptions::wire sends the pseudo-gradient as bfloat16 or float16 (half the bytes; CompressedAllReduce's cast).
// Replicas (local_rounds.hpp): one per rank by default; in deterministic mode the job declares R virtual replicas
// (`replicas`), a rank runs R / world of them, the averages are exact, and the weights are bitwise the same at every
// world size dividing R. The averages are all-reduces of the arena's bucket slices, tagged "average", in plan order:
// they show up in Recording traces as their own collectives and on the timeline's communication lane; a local step
// launches none. After an average every replica holds the same parameters; buffers (BatchNorm's statistics) are then
// rank 0's, as a DDP round would make them.
// Composition (composition.hpp, rules local-alone and local-exact): refused with ddp::join, ZeRO, OwnerReduce, an
// update in backward (OverlappedOptimizer) or a second local-round hook; in deterministic mode only with virtual
// replicas, and virtual replicas only there. Non-finite checks (DdpOptions::non_finite) run in the synchronous steps
// only. Checkpoints (save_checkpoint) keep every replica, its optimizer state and DiLoCo's outer state
// (LocalRoundsState). Not copyable or movable (the DDP points at it while attached). One thread per rank.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/error.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/parallel/local_rounds.hpp"
#include "ddp/tensor/half.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/trace/timeline.hpp"

namespace ddp {

struct LocalSgdOptions {
  std::int64_t period = 8;               // H: steps between two parameter averages (>= 1)
  std::int64_t warmup_steps = 0;         // W: ordinary DDP steps first (post-local SGD); 0: local from the start
  bool average_optimizer_state = false;  // also average the optimizer's buffers at each average
  std::int64_t replicas = 0;             // virtual replicas (deterministic mode; local_rounds.hpp); 0: one per rank
  // Hierarchical local SGD: between the averages over all ranks, average within each node every node_period steps
  // (1: every step; below period; 0: off). The node is the communicator's (NodeCommunicator: MpiBackend's ranks
  // that share memory, ThreadsBackend's process, or their ranks_per_node option). Host tensors, one replica per rank.
  std::int64_t node_period = 0;
};

// How DiLoCo's pseudo-gradient travels: as the parameters' type, or cast to a 16-bit float (scaled by 1/world, summed,
// cast back: the bucket wire of CompressedAllReduce, half the bytes; the backend must move 16-bit floats).
enum class PseudoGradient { kFloat, kBf16, kFp16 };

struct DiLoCoOptions {
  std::int64_t period = 500;    // H: inner (local) steps between two outer steps (>= 1)
  double outer_lr = 0.7;        // the outer SGD's learning rate
  double outer_momentum = 0.9;  // its Nesterov momentum (0: plain SGD)
  PseudoGradient wire = PseudoGradient::kFloat;
  std::int64_t replicas = 0;  // virtual replicas (deterministic mode; local_rounds.hpp); 0: one per rank
};

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
  LocalSgd(D& ddp, options_type const& o) : Base(ddp, o.optimizer, o.local.replicas, "LocalSgd"), opts_(o.local) {
    detail::check_period(opts_.period, "LocalSgd");
    if (opts_.warmup_steps < 0)
      throw ArgumentError(detail::cat("LocalSgd: warmup_steps must be >= 0, got ", opts_.warmup_steps));
    if (opts_.node_period != 0) {
      if (opts_.node_period < 1 || opts_.node_period >= opts_.period)
        throw ArgumentError(detail::cat("LocalSgd: node_period must be in [1, period = ", opts_.period,
                                        ") (0: no averages within nodes), got ", opts_.node_period));
      if (this->replicas_ > 0)
        throw ArgumentError(
            "LocalSgd: hierarchical averaging (node_period) follows the ranks' nodes, which change with the world "
            "size, so it is not exact across world sizes: drop node_period or replicas");
      if constexpr (!kHierarchical)
        throw ArgumentError(
            "LocalSgd: node_period averages within each node, which needs a backend with node groups "
            "(NodeCommunicator: MpiBackend, ThreadsBackend) and host tensors");
    }
  }

  static constexpr char const* kSyncName = "parameter averages";
  // Averages within nodes taken (LocalSgdOptions::node_period), and the bytes one rank sent in them (bytes_sent() and
  // syncs() count the averages over all ranks).
  std::int64_t node_syncs() const noexcept { return node_syncs_; }
  std::int64_t node_bytes_sent() const noexcept { return node_bytes_; }
  LocalSgdOptions const& local_options() const noexcept { return opts_; }
  // Steps taken as ordinary DDP steps (the warm-up's).
  std::int64_t sync_steps() const noexcept { return std::min(this->steps_, opts_.warmup_steps); }

  // Whether the coming step is local (after the warm-up).
  bool local_round() const override { return this->steps_ >= opts_.warmup_steps; }

  void step() {
    if (!local_round()) {  // a synchronous DDP step: the gradients are the global mean
      if (this->before_inner_) this->before_inner_();
      this->inner_.front().step();
      if (++this->steps_ == opts_.warmup_steps) this->fan_out();
      return;
    }
    this->local_step();
    ++this->steps_;
    bool const sync = (this->steps_ - opts_.warmup_steps) % opts_.period == 0;
    if (sync) {
      auto const xs = this->replica_pointers();
      this->average(std::span<T* const>(xs));
      if (opts_.average_optimizer_state) this->average_state();
      ++this->syncs_;
    } else if (opts_.node_period > 0 && (this->steps_ - opts_.warmup_steps) % opts_.node_period == 0) {
      node_average();
    }
    this->rest();
    if (sync && this->sync_buffers_) this->sync_buffers_();
  }

 private:
  using S = typename Base::S;
  static constexpr bool kHierarchical = NodeCommunicator<C> && std::same_as<S, HostSpace>;

  std::string cat_describe(std::string const& inner) const override {
    return detail::cat(
        inner, "; local SGD: ", opts_.warmup_steps > 0 ? detail::cat(opts_.warmup_steps, " DDP steps, then ") : "",
        "parameters averaged every ", opts_.period, " steps",
        opts_.node_period > 0 ? detail::cat(" and within each node every ", opts_.node_period) : "",
        opts_.average_optimizer_state ? " with the optimizer's state" : "");
  }

  // Hierarchical: each bucket's parameters (and, with average_optimizer_state, the optimizer's buffers) averaged among
  // this rank's node (node_all_reduce, tagged "average.node"), each bucket a span on the timeline.
  void node_average() {
    if constexpr (kHierarchical) {
      T* const x = this->values();
      this->for_each_bucket([&](std::size_t b, std::int64_t lo, std::int64_t n) {
        auto const began = Timeline::clock::now();
        this->comm_->node_all_reduce(std::span<T>(x + lo, static_cast<std::size_t>(n)), ReduceOp::kAvg,
                                     CollectiveTag{"average.node", static_cast<std::int64_t>(b)});
        std::int64_t const bytes = n * static_cast<std::int64_t>(sizeof(T));
        this->span(b, bytes, began, "node average");
        node_bytes_ += bytes;
      });
      if (opts_.average_optimizer_state)
        node_bytes_ += this->reduce_state([&](std::span<T> buf) {
          this->comm_->node_all_reduce(buf, ReduceOp::kAvg, CollectiveTag{"average.node.state"});
        });
      ++node_syncs_;
    }
  }

  LocalSgdOptions opts_;
  std::int64_t node_syncs_ = 0, node_bytes_ = 0;
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
  DiLoCo(D& ddp, options_type const& o) : Base(ddp, o.optimizer, o.outer.replicas, "DiLoCo"), opts_(o.outer) {
    detail::check_period(opts_.period, "DiLoCo");
    if (!(opts_.outer_lr > 0))
      throw ArgumentError(detail::cat("DiLoCo: outer_lr must be positive, got ", opts_.outer_lr));
    if (!(opts_.outer_momentum >= 0 && opts_.outer_momentum < 1))
      throw ArgumentError(detail::cat("DiLoCo: outer_momentum must be in [0, 1), got ", opts_.outer_momentum));
    if (this->replicas_ > 0 && opts_.wire != PseudoGradient::kFloat)
      throw ArgumentError(
          "DiLoCo: virtual replicas average the pseudo-gradient exactly, in int64 sums of the parameters' type; a "
          "16-bit pseudo-gradient would round it on the way: drop wire (or replicas)");
    std::int64_t const n = this->arena_->values().numel();
    kept_ = Tensor<T, S>(Shape{n});
    for (std::int64_t k = 0; k < this->local_; ++k) deltas_.emplace_back(Shape{n});
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
  }

  static constexpr char const* kSyncName = "outer steps";
  DiLoCoOptions const& outer_options() const noexcept { return opts_; }
  std::int64_t sync_steps() const noexcept { return 0; }

  bool local_round() const override { return true; }

  void step() {
    this->local_step();
    ++this->steps_;
    if (this->steps_ % opts_.period == 0) outer_step();
    this->rest();
  }

 private:
  std::string cat_describe(std::string const& inner) const override {
    return detail::cat(inner, " inside DiLoCo: an outer step every ", opts_.period, " steps (SGD, lr ", opts_.outer_lr,
                       ", Nesterov momentum ", opts_.outer_momentum, ")",
                       opts_.wire == PseudoGradient::kBf16   ? ", pseudo-gradient as bfloat16"
                       : opts_.wire == PseudoGradient::kFp16 ? ", pseudo-gradient as float16"
                                                             : "");
  }

  // Per replica delta = kept - x; the deltas averaged; m = mu m + delta; kept -= lr (delta + mu m) (PyTorch's SGD with
  // nesterov=True); every replica = kept. Element-wise over each bucket's slice (the gaps between buckets are not
  // parameters).
  void outer_step() {
    auto const xs = this->replica_pointers();
    std::vector<T*> ds;
    for (std::size_t k = 0; k < xs.size(); ++k) {
      T* const d = deltas_[k].data();
      this->for_each_bucket([&](std::size_t, std::int64_t lo, std::int64_t n) {
        Kernels<S>::add(n, T(1), kept_.data() + lo, T(-1), xs[k] + lo, d + lo);
      });
      ds.push_back(d);
    }
    std::span<T* const> const deltas(ds);
    if (opts_.wire == PseudoGradient::kBf16)
      this->average(deltas, bf16_.get());
    else if (opts_.wire == PseudoGradient::kFp16)
      this->average(deltas, fp16_.get());
    else
      this->average(deltas);
    T const mu = static_cast<T>(opts_.outer_momentum), lr = static_cast<T>(opts_.outer_lr);
    this->for_each_bucket([&](std::size_t, std::int64_t lo, std::int64_t n) {
      T* const d = ds.front() + lo;
      if (mu > T(0)) {
        if (this->syncs_ == 0)  // the first step: the buffer is the gradient (PyTorch's)
          Kernels<S>::copy(n, d, momentum_.data() + lo);
        else
          Kernels<S>::axpby(n, T(1), d, mu, momentum_.data() + lo);
        Kernels<S>::axpby(n, mu, momentum_.data() + lo, T(1), d);  // Nesterov: delta + mu m
      }
      Kernels<S>::axpby(n, -lr, d, T(1), kept_.data() + lo);
      for (T* const x : xs) Kernels<S>::copy(n, kept_.data() + lo, x + lo);
    });
    ++this->syncs_;
  }

  // Checkpoints: the kept copy and the outer momentum, per parameter (LocalRoundsState::kept, momentum).
  void save_extra(LocalRoundsState<T>& st) const override {
    st.kept = per_parameter(kept_);
    if (momentum_.defined()) st.momentum = per_parameter(momentum_);
  }
  void check_extra(LocalRoundsState<T> const& st) const override {
    std::size_t const np = this->arena_->count();
    if (st.kept.size() != np)
      throw ArgumentError(detail::cat("it holds a kept copy of ", st.kept.size(), " parameters for ", np));
    if (momentum_.defined() && st.syncs > 0 && st.momentum.size() != np)
      throw ArgumentError(detail::cat("it holds the outer momentum of ", st.momentum.size(), " parameters for ", np,
                                      " (written with another outer_momentum?)"));
    for (std::size_t i = 0; i < np; ++i) {
      auto const numel = static_cast<std::size_t>(this->arena_->entries()[i].numel);
      if (st.kept[i].size() != numel || (i < st.momentum.size() && st.momentum[i].size() != numel))
        throw ArgumentError(detail::cat("its outer state of '", this->arena_->entries()[i].name, "' has ",
                                        st.kept[i].size(), " values for ", numel));
    }
  }
  void load_extra(LocalRoundsState<T> const& st) override {
    from_parameters(st.kept, kept_);
    if (momentum_.defined() && !st.momentum.empty()) from_parameters(st.momentum, momentum_);
  }
  std::vector<std::vector<T>> per_parameter(Tensor<T, S> const& t) const {
    std::vector<std::vector<T>> out;
    for (auto const& e : this->arena_->entries()) {
      auto& v = out.emplace_back(static_cast<std::size_t>(e.numel));
      Kernels<S>::to_host(e.numel, t.data() + e.offset, v.data());
    }
    return out;
  }
  void from_parameters(std::vector<std::vector<T>> const& v, Tensor<T, S>& t) {
    for (std::size_t i = 0; i < this->arena_->count(); ++i) {
      auto const& e = this->arena_->entries()[i];
      Kernels<S>::from_host(e.numel, v[i].data(), t.data() + e.offset);
    }
  }

  DiLoCoOptions opts_;
  Tensor<T, S> kept_, momentum_;      // laid out like the arena's values
  std::vector<Tensor<T, S>> deltas_;  // one pseudo-gradient per replica of the rank
  std::shared_ptr<bfloat16[]> bf16_;  // the pseudo-gradient on a 16-bit wire (DiLoCoOptions::wire)
  std::shared_ptr<float16[]> fp16_;
};

}  // namespace ddp
