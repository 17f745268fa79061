// detail::LocalRounds<O, C>: what LocalSgd and DiLoCo (local_sgd.hpp) share. It attaches to a DistributedDataParallel
// as its local-round hook (attachment.hpp, Capability::kLocalRounds), owns the replicas the rank trains and their inner
// optimizers, steps them on their own mean gradients, averages tensors laid out like the parameter arena over every
// replica, and captures and restores all of it for checkpoints (LocalRoundsState).
//  - One replica per rank (replicas = 0): the rank's parameters are its replica and its inner optimizer the only one.
//    An average is a kAvg all-reduce per bucket (the backend's, so the same bits on every rank, but not the same at
//    another world size).
//  - Virtual replicas (replicas = R, deterministic mode only): the job trains R replicas whatever the world size. A
//    rank of w runs R / w of them one after another inside each step: its k-th replica takes the rank's micro-batches
//    [k m, (k + 1) m) (m = micro-batches per step / R), with its own parameters and its own inner optimizer, and the
//    averages are exact (exact_average.hpp). A replica sees the same micro-batches, dropout keys (each sample's place
//    in the global batch) and state at every world size dividing R, so every replica, and every average, is bitwise
//    the same at every such world size, and a checkpoint resumes at any of them. The cost: R / w copies of the
//    parameters and of the optimizer state on each rank, and int64 sums (twice float's bytes) on the wire.
// Between steps the arena holds the rank's first replica: on rank 0, replica 0, at every world size (what a digest or
// an evaluation of rank 0's model sees; after an average every replica holds the average).
#pragma once

#include <concepts>
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/bucket/plan.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/parallel/attachment.hpp"
#include "ddp/parallel/exact_average.hpp"
#include "ddp/parallel/local_state.hpp"
#include "ddp/parallel/micro_batch.hpp"
#include "ddp/parallel/replicas.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/trace/timeline.hpp"

namespace ddp::detail {

inline void check_period(std::int64_t period, char const* who) {
  if (period < 1) throw ArgumentError(cat(who, ": period must be at least 1 step, got ", period));
}

template <optim::Optimizer O, Communicator C>
class LocalRounds : public DdpHook {
 public:
  using value_type = typename O::value_type;
  using space = typename O::space;
  using T = value_type;
  using S = space;

  // Attaches to `ddp` (the composition rules refuse what does not compose: local-alone, local-exact), then checks that
  // `replicas` virtual replicas fit the world size and the micro-batches.
  template <class D>
  LocalRounds(D& ddp, typename O::options_type const& o, std::int64_t replicas, std::string name)
      : arena_(&ddp.parameters()),
        plan_(&ddp.plan()),
        comm_(&ddp.comm()),
        per_rank_(ddp.micro_batches_per_rank()),
        timeline_(ddp.options().timeline),
        replicas_(replicas),
        name_(std::move(name)) {
    static_assert(std::same_as<typename D::space, S> && std::same_as<std::remove_cvref_t<decltype(ddp.comm())>, C>,
                  "LocalSgd / DiLoCo<O, C>: build it from a DistributedDataParallel over communicator C whose "
                  "parameters are O's tensors");
    static_assert(!std::constructible_from<O, D&, typename O::options_type const&>,
                  "LocalSgd / DiLoCo: the inner optimizer must be a plain one over the parameters (SGD, Adam, AdamW), "
                  "not one built from the DDP (ZeroRedundancyOptimizer, OverlappedOptimizer)");
    if (replicas_ < 0)
      throw ArgumentError(cat(name_, ": replicas must be >= 0 (0: one replica per rank), got ", replicas_));
    attachment_ = ddp.attach(*this);
    int const world = comm_->world_size();
    if (replicas_ > 0) {
      std::int64_t const micro = per_rank_ * world;
      if (replicas_ % world != 0)
        throw ArgumentError(cat(name_, ": ", replicas_, " virtual replicas cannot be shared by ", world,
                                " ranks: the world size must divide replicas"));
      if (micro % replicas_ != 0)
        throw ArgumentError(cat(name_, ": ", replicas_, " virtual replicas need the step's micro-batches (", micro,
                                ", MicroBatches) to be a multiple of ", replicas_));
      local_ = replicas_ / world;
      per_replica_ = per_rank_ / local_;
      for (std::size_t i = 0; i < arena_->count(); ++i) {
        auto const& e = arena_->entries()[i];
        layout_.tensors.push_back({.name = e.name, .offset = e.offset, .numel = e.numel});
      }
      for_each_bucket([&](std::size_t, std::int64_t lo, std::int64_t n) { layout_.chunks.push_back({lo, n}); });
      layout_.extent = arena_->values().numel();
    }
    for (std::int64_t k = 0; k < local_; ++k) inner_.emplace_back(ddp.parameters(), o);
    for (std::int64_t k = 0; k < (local_ > 1 ? local_ : 0); ++k) {
      stores_.emplace_back(Shape{arena_->values().numel()});
      copy_values(values(), stores_.back().data());
    }
    if (ddp.options().broadcast_buffers && world > 1)
      sync_buffers_ = [&ddp] { detail::broadcast_buffers(ddp.comm(), ddp.module(), 0); };
  }
  LocalRounds(LocalRounds const&) = delete;
  LocalRounds& operator=(LocalRounds const&) = delete;

  static std::string name() { return O::name(); }
  void zero_grad() { arena_->zero_grad(); }
  double lr() const noexcept { return inner_.front().lr(); }
  void set_lr(double lr) {
    for (auto& o : inner_) o.set_lr(lr);
  }
  // The rank's first replica's inner optimizer (rank 0's: replica 0's).
  O& optimizer() noexcept { return inner_.front(); }
  O const& optimizer() const noexcept { return inner_.front(); }
  // The first replica's inner optimizer state; load_state gives it to every replica of the rank (a checkpoint then
  // restores each replica's own: load_local_state).
  optim::OptimizerState<T> state() const { return inner_.front().state(); }
  void load_state(optim::OptimizerState<T> const& st) {
    for (auto& o : inner_) o.load_state(st);
  }
  // `fn` runs before every inner optimizer step, on the gradients it is about to take: a replica's mean gradient in a
  // local step, the averaged one in a synchronous step (LocalSgd's warm-up). basic_trainer's clip_grad_norm goes
  // there (clipping the arena before step() would see only the last replica's, not yet divided).
  void before_inner_step(std::function<void()> fn) { before_inner_ = std::move(fn); }
  // The virtual replicas declared (0: one per rank), and how many this rank runs.
  std::int64_t replicas() const noexcept { return replicas_; }
  std::int64_t local_replicas() const noexcept { return local_; }
  // Steps taken (synchronous and local).
  std::int64_t steps() const noexcept { return steps_; }
  // Averages taken (LocalSgd) or outer steps (DiLoCo), and the bytes one rank sent in them.
  std::int64_t syncs() const noexcept { return syncs_; }
  std::int64_t bytes_sent() const noexcept { return bytes_; }
  // What was composed, for logs.
  std::string describe() const {
    std::string what;
    if constexpr (requires { inner_.front().describe(); })
      what = inner_.front().describe();
    else
      what = O::name();
    std::string const virt =
        replicas_ > 0 ? cat("; ", replicas_, " virtual replicas (", local_, " on this rank), averaged exactly") : "";
    return cat_describe(what) + virt;
  }
  HookTraits traits() const override {
    return {.name = name_,
            .caps = replicas_ > 0 ? Capability::kLocalRounds | Capability::kVirtualReplicas
                                  : Capabilities(Capability::kLocalRounds)};
  }

  // Virtual replicas: micro-batch `index` of a local step belongs to the rank's replica index / m; the one before
  // it, once its micro-batches are done, steps and the next is loaded.
  void on_local_forward(std::int64_t index) override {
    if (replicas_ == 0) return;
    if (index != next_) refuse_out_of_order(index, next_);
    std::int64_t const k = index / per_replica_;
    if (k != current_) {
      finish_replica();
      arena_->zero_grad();
      load_replica(k);
    }
    ++next_;
  }

  // Checkpoints (train/checkpoint.hpp). Collective: every replica's parameters and inner optimizer state, from the
  // rank that runs it, on every rank.
  LocalRoundsState<T> local_state() const {
    LocalRoundsState<T> st{.kind = name_, .replicas = replicas_, .steps = steps_, .syncs = syncs_, .bytes = bytes_};
    for (auto const& e : arena_->entries()) {
      st.names.push_back(e.name);
      st.numels.push_back(e.numel);
    }
    int const world = comm_->world_size();
    std::int64_t const total = local_ * world;
    std::size_t const n = static_cast<std::size_t>(arena_->values().numel());
    optim::OptimizerState<T> const shape = inner_.front().state();  // every replica's has this form
    for (std::int64_t g = 0; g < total; ++g) {
      int const owner = static_cast<int>(g / local_);
      bool const mine = owner == comm_->rank();
      std::int64_t const k = g % local_;
      std::vector<T> flat(n);
      if (mine) Kernels<S>::to_host(static_cast<std::int64_t>(n), replica_view(k), flat.data());
      optim::OptimizerState<T> os = mine ? inner_[static_cast<std::size_t>(k)].state() : shape;
      std::vector<std::int64_t> counts;
      std::vector<T> buffers;
      flatten_state(os, counts, buffers);
      if (world > 1) {
        host_broadcast(*comm_, std::span<T>(flat), owner, CollectiveTag{"checkpoint.replica", g});
        host_broadcast(*comm_, std::span<std::int64_t>(counts), owner, CollectiveTag{"checkpoint.replica", g});
        host_broadcast(*comm_, std::span<T>(buffers), owner, CollectiveTag{"checkpoint.replica", g});
      }
      unflatten_state(os, counts, buffers);
      auto& values = st.values.emplace_back();
      for (auto const& e : arena_->entries())
        values.emplace_back(flat.begin() + e.offset, flat.begin() + e.offset + e.numel);
      st.states.push_back(std::move(os));
    }
    save_extra(st);
    return st;
  }

  // ArgumentError unless `st` can resume this run: the same policy and parameters, and the same virtual replicas
  // (any world size dividing them), or, with one replica per rank, the same world size.
  void check_local_state(LocalRoundsState<T> const& st) const {
    if (st.kind != name_) throw ArgumentError(cat("it was written by ", st.kind, "; this run trains with ", name_));
    int const world = comm_->world_size();
    if (st.replicas != replicas_) {
      if (replicas_ == 0)
        throw ArgumentError(cat("it holds ", st.replicas, " virtual replicas; this run declares none"));
      if (st.replicas == 0)
        throw ArgumentError(cat("it holds one replica per rank of ", st.values.size(), " (no virtual replicas); this ",
                                "run declares ", replicas_));
      throw ArgumentError(cat("it holds ", st.replicas, " virtual replicas; this run declares ", replicas_));
    }
    if (replicas_ == 0 && st.values.size() != static_cast<std::size_t>(world))
      throw ArgumentError(cat("it holds the replicas of ", st.values.size(), " ranks and this run has ", world,
                              ": one replica per rank resumes at the same world size only (declare virtual replicas, "
                              "in deterministic mode, to change it)"));
    std::size_t const total = static_cast<std::size_t>(local_ * world);
    if (st.values.size() != total || st.states.size() != total)
      throw ArgumentError(cat("it holds ", st.values.size(), " replicas' parameters and ", st.states.size(),
                              " optimizer states for ", total, " replicas"));
    auto const& entries = arena_->entries();
    bool same = st.names.size() == entries.size() && st.numels.size() == entries.size();
    for (std::size_t i = 0; same && i < entries.size(); ++i)
      same = st.names[i] == entries[i].name && st.numels[i] == entries[i].numel;
    if (!same)
      throw ArgumentError(cat("its replicas have ", st.names.size(), " parameters that are not this model's ",
                              entries.size(), " (names and sizes, in order)"));
    for (auto const& values : st.values)
      for (std::size_t i = 0; i < entries.size(); ++i)
        if (static_cast<std::int64_t>(values[i].size()) != entries[i].numel)
          throw ArgumentError(
              cat("a replica's '", entries[i].name, "' has ", values[i].size(), " values for ", entries[i].numel));
    auto const mine = inner_.front().state();
    for (auto const& os : st.states) optim::match_state(os, mine);
    check_extra(st);
  }

  // Restores this rank's replicas, their optimizers and the counters (after check_local_state).
  void load_local_state(LocalRoundsState<T> const& st) {
    std::int64_t const first = static_cast<std::int64_t>(comm_->rank()) * local_;
    std::vector<T> flat(static_cast<std::size_t>(arena_->values().numel()), T(0));
    for (std::int64_t k = 0; k < local_; ++k) {
      auto const& values = st.values[static_cast<std::size_t>(first + k)];
      for (std::size_t i = 0; i < arena_->count(); ++i)
        std::copy(values[i].begin(), values[i].end(), flat.begin() + arena_->entries()[i].offset);
      for_each_bucket([&](std::size_t, std::int64_t lo, std::int64_t n) {
        Kernels<S>::from_host(n, flat.data() + lo, replica_values(k) + lo);
      });
      inner_[static_cast<std::size_t>(k)].load_state(st.states[static_cast<std::size_t>(first + k)]);
    }
    steps_ = st.steps;
    syncs_ = st.syncs;
    bytes_ = st.bytes;  // one rank's bytes per average do not depend on the world size (the whole buckets travel)
    next_ = 0;
    current_ = 0;
    load_extra(st);
    rest();
  }

 protected:
  ~LocalRounds() override = default;
  virtual std::string cat_describe(std::string const& inner) const = 0;
  virtual void save_extra(LocalRoundsState<T>&) const {}
  virtual void check_extra(LocalRoundsState<T> const&) const {}
  virtual void load_extra(LocalRoundsState<T> const&) {}

  // A local step's end: the last (or only) replica steps on its mean gradient. Every replica's parameters are then
  // in replica_values().
  void local_step() {
    if (replicas_ > 0 && next_ != per_rank_)
      throw ArgumentError(cat(name_, ": step() after ", next_, " of this rank's ", per_rank_,
                              " micro-batches; forward and backward every micro-batch micro_batches() returns first"));
    finish_replica();
    next_ = 0;
  }

  // Between steps: the arena holds the rank's first replica.
  void rest() {
    if (local_ > 1) copy_values(stores_.front().data(), values());
    current_ = 0;
  }

  // After a synchronous step (the arena and the first optimizer hold the one model): every replica takes them.
  void fan_out() {
    if (local_ == 1) return;
    auto const first = inner_.front().state();
    for (std::int64_t k = 1; k < local_; ++k) {
      copy_values(values(), stores_[static_cast<std::size_t>(k)].data());
      inner_[static_cast<std::size_t>(k)].load_state(first);
    }
    copy_values(values(), stores_.front().data());
  }

  // Replica k's parameters, laid out like the arena's values (the arena itself when the rank runs one replica).
  T* replica_values(std::int64_t k) noexcept {
    return local_ > 1 ? stores_[static_cast<std::size_t>(k)].data() : values();
  }
  T const* replica_view(std::int64_t k) const noexcept {
    return local_ > 1 ? stores_[static_cast<std::size_t>(k)].data() : values();
  }
  std::vector<T*> replica_pointers() {
    std::vector<T*> out;
    for (std::int64_t k = 0; k < local_; ++k) out.push_back(replica_values(k));
    return out;
  }

  // fn(b, lo, n) for each bucket b: its parameters are arena elements [lo, lo + n) (the gaps between buckets hold
  // no parameter).
  template <class Fn>
  void for_each_bucket(Fn&& fn) const {
    auto const& buckets = plan_->buckets;
    for (std::size_t b = 0; b < buckets.size(); ++b)
      fn(b, arena_->entries()[buckets[b].params.front()].offset, buckets[b].numel);
  }

  // Replaces each of `xs` (one per replica of the rank, laid out like the arena's values) by the average over every
  // replica: exactly with virtual replicas; else (one x) bucket by bucket in T, or (H a 16-bit float) through
  // `buffer` (room for the arena's values in H): x / world cast, summed, cast back. Each bucket is a span on the
  // timeline's communication lane (DdpOptions::timeline).
  template <class H = T>
  void average(std::span<T* const> xs, H* buffer = nullptr) {
    if (replicas_ > 0) {
      if constexpr (std::same_as<S, HostSpace>)  // virtual replicas exist in deterministic mode only: host tensors
        bytes_ += exact_average(
            *comm_, layout_, xs, replicas_, "average", name_,
            [&](std::size_t c, std::int64_t sent, Timeline::clock::time_point began) { span(c, sent, began); });
      return;
    }
    T* const x = xs.front();
    for_each_bucket([&](std::size_t b, std::int64_t lo, std::int64_t n) {
      auto const began = Timeline::clock::now();
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
      span(b, bytes, began);
      bytes_ += bytes;
    });
  }

  // Every replica's inner optimizer buffers averaged: exactly with virtual replicas, else one kAvg all-reduce per
  // parameter and buffer.
  void average_state() {
    if (replicas_ == 0) {
      bytes_ += reduce_state(
          [&](std::span<T> buf) { host_all_reduce(*comm_, buf, ReduceOp::kAvg, CollectiveTag{"average.state"}); });
      return;
    }
    std::vector<optim::OptimizerState<T>> states;
    for (auto const& o : inner_) states.push_back(o.state());
    ExactLayout layout;
    for (auto const& p : states.front().parameters)
      for (std::size_t b = 0; b < p.buffers.size(); ++b) {
        layout.tensors.push_back({.name = cat(p.name, " (optimizer ", states.front().buffer_names[b], ")"),
                                  .offset = layout.extent,
                                  .numel = static_cast<std::int64_t>(p.buffers[b].size())});
        layout.extent += static_cast<std::int64_t>(p.buffers[b].size());
      }
    if (layout.extent == 0) return;
    layout.chunks.push_back({0, layout.extent});
    std::vector<std::vector<std::int64_t>> counts(states.size());
    std::vector<std::vector<T>> flats(states.size());
    std::vector<T*> xs;
    for (std::size_t k = 0; k < states.size(); ++k) {
      flatten_state(states[k], counts[k], flats[k]);
      xs.push_back(flats[k].data());
    }
    bytes_ += exact_average(*comm_, layout, std::span<T* const>(xs), replicas_, "average.state", name_,
                            [](std::size_t, std::int64_t, Timeline::clock::time_point) {});
    for (std::size_t k = 0; k < states.size(); ++k) {
      unflatten_state(states[k], counts[k], flats[k]);
      inner_[k].load_state(states[k]);
    }
  }

  // The first replica's inner optimizer buffers, each passed to reduce(span) in place (an all-reduce), then loaded
  // back; returns the bytes passed (one replica per rank: LocalSgd's averages of the state, over all ranks or a node).
  template <class Reduce>
  std::int64_t reduce_state(Reduce&& reduce) {
    auto st = inner_.front().state();
    std::int64_t bytes = 0;
    for (auto& p : st.parameters)
      for (auto& buf : p.buffers) {
        reduce(std::span<T>(buf));
        bytes += static_cast<std::int64_t>(buf.size() * sizeof(T));
      }
    inner_.front().load_state(st);
    return bytes;
  }

  // Bucket b's average as a span on the timeline's communication lane, from `began` to now.
  void span(std::size_t b, std::int64_t bytes, Timeline::clock::time_point began, char const* what = "average") const {
    if (timeline_)
      timeline_->add(cat(what, " bucket ", b, " (", bytes, " bytes)"), "comm", began, Timeline::clock::now(),
                     Timeline::kComm);
  }
  T* values() const noexcept { return arena_->values().data(); }
  void copy_values(T const* from, T* to) const {
    for_each_bucket([&](std::size_t, std::int64_t lo, std::int64_t n) { Kernels<S>::copy(n, from + lo, to + lo); });
  }

  nn::ParameterArena<T, S>* arena_;
  BucketPlan const* plan_;
  C* comm_;
  std::int64_t per_rank_;
  Timeline* timeline_;
  std::int64_t replicas_;
  std::string name_;
  std::int64_t local_ = 1;              // replicas this rank runs
  std::int64_t per_replica_ = 1;        // micro-batches of each (virtual replicas)
  std::deque<O> inner_;                 // one inner optimizer per replica of the rank
  std::function<void()> sync_buffers_;  // rank 0's buffers everywhere (empty: nothing to do)
  std::function<void()> before_inner_;  // before_inner_step()
  std::int64_t steps_ = 0, syncs_ = 0, bytes_ = 0;

 private:
  // The replica in the arena steps on its mean gradient (the DDP left the sum over its micro-batches) and, when the
  // rank runs several, is put back in its store.
  void finish_replica() {
    auto& arena = *arena_;
    std::int64_t const m = replicas_ > 0 ? per_replica_ : per_rank_;
    if (m > 1)
      for (std::size_t i = 0; i < arena.count(); ++i)
        if (arena.has_grad(i)) {
          auto const& e = arena.entries()[i];
          Kernels<S>::axpby(e.numel, T(1) / T(m), arena.grads().data() + e.offset, T(0),
                            arena.grads().data() + e.offset);
        }
    if (before_inner_) before_inner_();
    inner_[static_cast<std::size_t>(current_)].step();
    if (local_ > 1) copy_values(values(), stores_[static_cast<std::size_t>(current_)].data());
  }
  void load_replica(std::int64_t k) {
    copy_values(stores_[static_cast<std::size_t>(k)].data(), values());
    current_ = k;
  }
  // An optimizer state's numbers as two flat vectors (its per-parameter step counts, its buffers) and back.
  static void flatten_state(optim::OptimizerState<T> const& st, std::vector<std::int64_t>& counts,
                            std::vector<T>& buffers) {
    for (auto const& p : st.parameters) {
      counts.push_back(p.steps);
      for (auto const& b : p.buffers) buffers.insert(buffers.end(), b.begin(), b.end());
    }
  }
  static void unflatten_state(optim::OptimizerState<T>& st, std::vector<std::int64_t> const& counts,
                              std::vector<T> const& buffers) {
    std::size_t at = 0;
    for (std::size_t i = 0; i < st.parameters.size(); ++i) {
      auto& p = st.parameters[i];
      p.steps = counts[i];
      for (auto& b : p.buffers) {
        std::copy(buffers.begin() + static_cast<std::ptrdiff_t>(at),
                  buffers.begin() + static_cast<std::ptrdiff_t>(at + b.size()), b.begin());
        at += b.size();
      }
    }
  }

  std::vector<Tensor<T, S>> stores_;  // each replica's parameters between its turns (the rank runs several)
  ExactLayout layout_;                // the arena's parameters and buckets, for exact averages
  std::int64_t next_ = 0;             // the micro-batch due in this local step (virtual replicas)
  std::int64_t current_ = 0;          // the replica in the arena
  Attachment attachment_;
};

}  // namespace ddp::detail
