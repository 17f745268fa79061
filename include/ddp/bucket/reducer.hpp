// BucketReducer: the averaging reduction stage of data parallelism (the AverageAllReduce, CompressedAllReduce and
// PowerSgd policies). Told "parameter i is ready" during backward and "backward is over" at its end, it launches each
// bucket's all-reduce in plan order as soon as the bucket is complete and reports, per parameter, which ranks had
// a gradient. W is the wire format buckets travel in (bucket/wire.hpp): the gradients' own type, a 16-bit float,
// or LowRank (PowerSGD, bucket/powersgd.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "ddp/bucket/outcome.hpp"
#include "ddp/bucket/plan.hpp"
#include "ddp/bucket/status_words.hpp"
#include "ddp/bucket/wire.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

// Drives one model's buckets over a gradient buffer laid out by the plan (a bucket is a contiguous slice,
// followed by its status words: bucket/status_words.hpp, which writes and reads them, and keeps them on the device
// under static_graph). Every rank must drive the same plan.
// One rank: nothing is exchanged or launched; mark_ready() writes the outcome (this rank's own flags) as it goes,
// and begin()/finish() skip the bucket bookkeeping, which would otherwise cost a 10-10-5 model's one-rank step
// about 0.1 us (bench/RESULTS.md, "The one-rank step").
// Thread safety: one thread per rank drives it (the backward's); the communicator's progress thread only
// touches the bucket slices in flight. Determinism: it adds nothing to the gradients' arithmetic; results
// are those of the backend's all-reduce (bitwise identical on all ranks for threads and MPI).
template <class T, MemorySpace S, AsyncCommunicator C, class W = T>
class BucketReducer {
  using wire_t = BucketWire<T, W, S>;
  using wire_value = typename wire_t::value_type;
  static_assert(BucketWireFormat<wire_t, T, S>, "BucketReducer: BucketWire<T, W, S> is not a wire (bucket/wire.hpp)");
  static_assert(std::same_as<wire_value, T> || HalfCommunicator<C>,
                "BucketReducer: buckets that travel as bfloat16/float16 need a backend that moves them "
                "(HalfCommunicator: ThreadsBackend, MpiBackend, NcclBackend)");

 public:
  using wire_config = typename wire_t::config;
  // Status words stored after a bucket of `params` parameters, on `world` ranks.
  static constexpr std::int64_t status_slots(std::size_t params, int world) noexcept {
    return detail::BucketStatusWords<T, S>::slots(params, world);
  }

  // `bucket_offsets[b]`: where bucket b's slice starts in `grads` (its gradients, then its status words). The
  // gradients' shapes are unknown here: the wire sees each bucket as one vector.
  BucketReducer(C& comm, BucketPlan plan, std::vector<std::int64_t> bucket_offsets, Tensor<T, S> grads,
                ReducerOptions opts = {}, wire_config wire = {})
      : BucketReducer(comm, vector_layout(plan, comm.world_size()), plan, std::move(bucket_offsets), std::move(grads),
                      opts, wire) {}

  // Over a parameter arena laid out for this plan (status words reserved after each bucket's lowest-registered
  // parameter: reserve()). The micro-batches of a round add into the same gradients; finish() divides their sum
  // by `micro_batches_per_rank`, so the result is the mean gradient of the global batch.
  BucketReducer(C& comm, BucketPlan plan, nn::ParameterArena<T, S>& arena, std::int64_t micro_batches_per_rank,
                ReducerOptions opts = {}, wire_config wire = {})
      : BucketReducer(comm, arena_layout(plan, arena, comm.world_size()), plan, offsets_in(plan, arena), arena.grads(),
                      opts, wire) {
    per_rank_ = micro_batches_per_rank;
  }

  // Elements each parameter (registration order) must leave free after it in the arena: the status words of
  // the bucket it ends.
  static std::vector<std::int64_t> reserve(BucketPlan const& plan, std::size_t params, int world) {
    std::vector<std::int64_t> r(params, 0);
    for (auto const& b : plan.buckets) r[b.params.back()] = status_slots(b.params.size(), world);
    return r;
  }

  BucketReducer(BucketReducer const&) = delete;
  BucketReducer& operator=(BucketReducer const&) = delete;
  ~BucketReducer() { abandon(); }

  BucketPlan const& plan() const noexcept { return plan_; }
  // Bytes one rank puts on the wire per round, as the wire format says (none on one rank).
  std::int64_t wire_bytes() const noexcept { return world_ > 1 ? wire_.bytes() : 0; }
  // What the wire carries between rounds (StatefulWire: PowerSGD), for checkpoints; empty for a wire without.
  WireState<T> wire_state() const {
    if constexpr (StatefulWire<wire_t, T>)
      return wire_.state();
    else
      return {};
  }
  // Loads it between rounds. A saved state for a stateless wire is refused (ArgumentError); a wire with state
  // checks the layout itself.
  void load_wire_state(WireState<T> const& st, WireStateFrom from) {
    if constexpr (StatefulWire<wire_t, T>) {
      wire_.load_state(st, from);
    } else if (!st.kind.empty()) {
      throw ArgumentError(detail::cat("BucketReducer: a saved ", st.kind, " wire state cannot load into this wire"));
    }
  }
  // Elements of bucket b's slice that the all-reduce moves (gradients and status words).
  std::int64_t slice_numel(std::size_t b) const noexcept {
    return plan_.buckets[b].numel + status_slots(plan_.buckets[b].params.size(), world_);
  }

  // Starts a round: every parameter pending. Anything a previous, unfinished round launched completes first
  // (its errors were or will be reported by the collective that raised them), so no buffer is reused in flight.
  void begin() {
    std::fill(ready_.begin(), ready_.end(), 0);
    std::fill(has_grad_.begin(), has_grad_.end(), 0);
    unready_ = ready_.size();
    if (world_ == 1) return;  // nothing is launched on one rank (see mark_ready)
    abandon();
    for (std::size_t b = 0; b < plan_.buckets.size(); ++b)
      pending_[b] = static_cast<std::int64_t>(plan_.buckets[b].params.size());
    next_launch_ = 0;
  }

  // Gradients of a micro-batch that is not the round's last stay in the buffer, and the next backward adds
  // to them (the all-reduce of the sum then averages the ranks' sums): nothing to do.
  void end_micro_batch() noexcept {}

  bool is_ready(std::size_t i) const noexcept { return ready_[i] != 0; }
  // The round's outcome as far as finish() has got (a landed bucket's parameters are final).
  ReduceOutcome const& outcome() const noexcept { return outcome_; }
  // Whether every parameter was marked ready in this round.
  bool all_ready() const noexcept { return unready_ == 0; }
  // Whether parameter i had a gradient on this rank when it was marked ready in this round.
  bool had_grad(std::size_t i) const noexcept { return has_grad_[i] != 0; }

  // Parameter i's gradient slice is final: its gradient (`has_grad`) or zeros the caller wrote. Launches
  // every bucket that is now complete, in plan order. Once per parameter per round.
  void mark_ready(std::size_t i, bool has_grad) {
    if (ready_[i]) throw ArgumentError(detail::cat("BucketReducer: parameter ", i, " marked ready twice in one round"));
    ready_[i] = 1;
    --unready_;
    has_grad_[i] = has_grad ? 1 : 0;
    if (world_ == 1) {  // nothing to exchange: the outcome is this rank's own flags, known now
      outcome_.missing_somewhere[i] = !has_grad;
      outcome_.present_somewhere[i] = has_grad;
      return;
    }
    if (observer_) poll();
    if (--pending_[plan_.bucket_of[i]] != 0) return;
    while (next_launch_ < plan_.buckets.size() && pending_[next_launch_] == 0)
      launch(next_launch_++, Participation::kActive);
  }

  // A whole round for a rank that has no batch (it joined): every bucket, in plan order, all-reduced with
  // zero gradients and no flags, matching the active ranks' round in count, order and size. The gradient
  // buffer then holds the round's result, as on the active ranks; the outcome is theirs too. Meant for
  // world > 1 (on one rank there is nobody to answer: the buffer is zeroed, every parameter reads as missing).
  ReduceOutcome const& shadow_round() {
    begin();
    std::fill(ready_.begin(), ready_.end(), 1);
    unready_ = 0;
    if (world_ == 1) {  // nobody answers: every parameter reads as missing
      std::fill(outcome_.missing_somewhere.begin(), outcome_.missing_somewhere.end(), 1);
      std::fill(outcome_.present_somewhere.begin(), outcome_.present_somewhere.end(), 0);
    }
    for (std::size_t b = 0; b < plan_.buckets.size(); ++b) {
      Kernels<S>::fill(plan_.buckets[b].numel, T(0), slice(b));
      pending_[b] = 0;
      launch(b, Participation::kShadow);
    }
    next_launch_ = plan_.buckets.size();
    return finish_round(NoLanding{}, Participation::kShadow);
  }

  // Backward is over and every parameter was marked ready: waits for every bucket, checks the fingerprints
  // and reads the flags. Throws DdpError, on every rank alike, when ranks reduced different buckets together.
  // `landed(b)` (outcome.hpp) runs as soon as bucket b's gradients and its part of the outcome are final, in plan
  // order, while later buckets may still be in flight (single-collective wires; PowerSGD's buckets land after
  // all are reduced). Nothing lands after a failure: the error is rethrown once every bucket has finished.
  template <class Landed = NoLanding>
  ReduceOutcome const& finish(Landed&& landed = {}) {
    return finish_round(std::forward<Landed>(landed), Participation::kActive);
  }

  // Whether the round's last bucket is reduced on the progress thread like the others (true) or on the caller's
  // thread once backward completes it (false, the default: nothing is left to overlap with, and the hand-off costs
  // more). A finish() that lands buckets overlaps their landing with the last bucket's reduction only when true.
  void reduce_last_bucket_async(bool on) noexcept { async_last_ = on; }

  // Lets anything in flight complete, swallowing errors (a round that is being dropped). No-throw.
  void abandon() noexcept {
    for (auto& w : works_) {
      if (!w) continue;
      try {
        w->wait();
      } catch (...) {}
      w.reset();
    }
  }

 private:
  BucketReducer(C& comm, std::vector<WireBucket> layout, BucketPlan plan, std::vector<std::int64_t> bucket_offsets,
                Tensor<T, S> grads, ReducerOptions opts, wire_config wire)
      : comm_(&comm),
        plan_(std::move(plan)),
        offsets_(std::move(bucket_offsets)),
        grads_(std::move(grads)),
        observer_(opts.observer),
        world_(comm.world_size()),
        rank_(comm.rank()),
        wire_(std::move(layout), world_, wire),
        status_(plan_, world_, rank_, wire_t::id_modulus, opts) {
    if (offsets_.size() != plan_.buckets.size())
      throw ArgumentError(
          detail::cat("BucketReducer: ", offsets_.size(), " bucket offsets for ", plan_.buckets.size(), " buckets"));
    std::size_t const np = plan_.bucket_of.size(), nb = plan_.buckets.size();
    // Each bucket's id must be distinct in the wire's type, or a desync between buckets b and b + id_modulus would
    // pass the status-word check (16-bit wires hold 256 (bf16) or 2048 (fp16) distinct integers).
    if (world_ > 1 && static_cast<std::int64_t>(nb) > wire_t::id_modulus)
      throw ArgumentError(detail::cat("DistributedDataParallel: the bucket plan has ", nb, " buckets, but the ",
                                      8 * sizeof(typename wire_t::value_type),
                                      "-bit wire of this reduction holds distinct bucket ids only up to ",
                                      wire_t::id_modulus, "; use a larger bucket cap (fewer buckets) or a float wire"));
    ready_.assign(np, 0);
    unready_ = np;
    has_grad_.assign(np, 0);
    pending_.assign(nb, 0);
    works_.resize(nb);
    completed_.assign(nb, 0);
    sent_.assign(nb, 0);
    outcome_.missing_somewhere.assign(np, 0);
    outcome_.present_somewhere.assign(np, 0);
  }

  using work_t = decltype(std::declval<C&>().all_reduce_async(std::declval<SpaceSpan<wire_value, S>>(), ReduceOp::kAvg,
                                                              CollectiveTag{}));

  // finish() of a round this rank took part in as `part` (shadow_round() passes kShadow).
  template <class Landed>
  ReduceOutcome const& finish_round(Landed&& landed, Participation part) {
    if (unready_ != 0)
      for (std::size_t i = 0; i < ready_.size(); ++i)
        if (!ready_[i])
          throw ArgumentError(detail::cat("BucketReducer::finish: parameter ", i, " was never marked ready"));
    std::size_t const nb = plan_.buckets.size();
    bool landing = !std::same_as<std::remove_cvref_t<Landed>, NoLanding>;
    auto land = [&](std::size_t b) {
      // The sum of this rank's micro-batch gradients, averaged over ranks: divide by their count (a wire that
      // leaves the gradients local leaves this to whoever reduces them).
      if (wire_reduces_gradients<wire_t> && per_rank_ > 1)
        Kernels<S>::axpby(plan_.buckets[b].numel, T(1) / T(per_rank_), slice(b), T(0), slice(b));
      if (landing) landing = landed(b);
    };
    if (world_ == 1) {  // mark_ready() wrote the outcome, nothing is in flight
      for (std::size_t b = 0; b < nb; ++b) land(b);
      return outcome_;
    }
    auto const read = [&](std::size_t b) { status_.read(b, tail(b), part, outcome_); };
    if (observer_) observer_->on_wait_begin();
    status_.begin_reads();
    if (landing && wire_t::single_collective) {
      std::exception_ptr err;
      for (std::size_t b = 0; b < nb; ++b) {
        wait_one(b, err);
        if (err) continue;
        try {
          read(b);
        } catch (...) {
          err = std::current_exception();
          continue;
        }
        land(b);
      }
      if (observer_) observer_->on_wait_end();
      if (err) std::rethrow_exception(err);
    } else {
      wait_all();
      if (observer_) observer_->on_wait_end();
      for (std::size_t b = 0; b < nb; ++b) read(b);
      for (std::size_t b = 0; b < nb; ++b) land(b);
    }
    status_.end_round(part, has_grad_, tail(nb - 1), outcome_);
    return outcome_;
  }

  // Each bucket as one vector of its gradients.
  static std::vector<WireBucket> vector_layout(BucketPlan const& plan, int world) {
    std::vector<WireBucket> layout;
    for (auto const& b : plan.buckets)
      layout.push_back(
          {.grads = b.numel, .status = status_slots(b.params.size(), world), .tensors = {{0, 1, b.numel}}});
    return layout;
  }
  // Each gradient at its place in its bucket's slice, as a matrix of its first dimension's rows.
  static std::vector<WireBucket> arena_layout(BucketPlan const& plan, nn::ParameterArena<T, S> const& arena,
                                              int world) {
    std::vector<WireBucket> layout;
    for (auto const& b : plan.buckets) {
      WireBucket w{.grads = b.numel, .status = status_slots(b.params.size(), world), .tensors = {}};
      std::int64_t const start = arena.entries()[b.params.front()].offset;
      for (auto const p : b.params) {
        auto const& e = arena.entries()[p];
        std::int64_t const rows = e.shape.rank() >= 2 && e.numel > 0 ? e.shape[0] : 1;
        w.tensors.push_back({.offset = e.offset - start, .rows = rows, .cols = e.numel / rows});
      }
      layout.push_back(std::move(w));
    }
    return layout;
  }

  static std::vector<std::int64_t> offsets_in(BucketPlan const& plan, nn::ParameterArena<T, S> const& arena) {
    std::vector<std::int64_t> offsets;
    for (auto const& b : plan.buckets) offsets.push_back(arena.entries()[b.params.front()].offset);
    return offsets;
  }

  T* slice(std::size_t b) const noexcept { return grads_.data() + offsets_[b]; }
  // Bucket b's status words, right after its gradients.
  T* tail(std::size_t b) const noexcept { return slice(b) + plan_.buckets[b].numel; }

  void launch(std::size_t b, Participation part) {
    if (world_ == 1) return;  // nothing to exchange
    status_.write(b, part, has_grad_, slice(b), tail(b));
    completed_[b] = 0;
    if (observer_) observer_->on_launch(b);
    auto const piece = wire_.pack(b, slice(b), part);
    sent_[b] = piece_bytes(piece);
    if (b + 1 == plan_.buckets.size() && !async_last_) {
      // The last bucket completes when backward is (all but) over: nothing is left to overlap with, so it
      // is reduced on this thread, saving the hand-off to the progress thread and back. Issue order is
      // kept: the earlier buckets finish first.
      wait_all();
      for (std::optional next = piece; next;) {
        comm_->all_reduce(next->span, next->op, CollectiveTag{next->label, static_cast<std::int64_t>(b)});
        if ((next = wire_.unpack(b, slice(b)))) sent_[b] += piece_bytes(*next);
      }
      note_complete(b);
      return;
    }
    works_[b].emplace(comm_->all_reduce_async(piece.span, piece.op, CollectiveTag{piece.label, std::int64_t(b)}));
  }

  // Waits for every launched bucket in order, launching the next collective of a bucket whose wire needs another
  // (in bucket order on every rank, so ranks stay matched), until none is in flight; rethrows the first failure
  // after all have finished.
  void wait_all() {
    std::exception_ptr err;
    for (bool again = true; again;) {
      again = false;
      for (std::size_t b = 0; b < works_.size(); ++b) {
        if (!works_[b]) continue;
        if (advance(b, err))
          again = true;
        else
          note_complete(b);
      }
    }
    if (err) std::rethrow_exception(err);
  }

  // Waits for bucket b alone, with the rest of its wire's collectives (launched and waited one at a time); the
  // first failure is kept in `err` and the bucket counts as finished.
  void wait_one(std::size_t b, std::exception_ptr& err) {
    while (works_[b] && advance(b, err)) {}
    note_complete(b);
  }

  // Waits for bucket b's collective in flight and, unless a failure was seen (kept in `err`, first one only),
  // launches the next one its wire asks for. Returns whether one was launched.
  bool advance(std::size_t b, std::exception_ptr& err) {
    auto& w = works_[b];
    try {
      w->wait();
      w.reset();
      if (!err)
        if (auto const next = wire_.unpack(b, slice(b))) {
          sent_[b] += piece_bytes(*next);
          w.emplace(comm_->all_reduce_async(next->span, next->op, CollectiveTag{next->label, std::int64_t(b)}));
          return true;
        }
    } catch (...) {
      if (!err) err = std::current_exception();
      w.reset();
    }
    return false;
  }

  static std::int64_t piece_bytes(WirePiece<wire_value, S> const& p) noexcept {
    return static_cast<std::int64_t>(p.span.size() * sizeof(wire_value));
  }

  // Observer only: a bucket counts as complete when its completion is first seen (a wire with more than one
  // collective per bucket is complete only once wait_all() has seen its last).
  void poll() {
    if constexpr (!wire_t::single_collective) return;
    for (std::size_t b = 0; b < next_launch_; ++b)
      if (works_[b] && !completed_[b] && works_[b]->test()) note_complete(b);
  }
  void note_complete(std::size_t b) {
    if (!observer_ || completed_[b]) return;
    completed_[b] = 1;
    observer_->on_complete(b, sent_[b]);
  }

  C* comm_;
  BucketPlan plan_;
  std::vector<std::int64_t> offsets_;
  Tensor<T, S> grads_;
  ReducerObserver* observer_;
  int world_, rank_;
  wire_t wire_;
  detail::BucketStatusWords<T, S> status_;  // after plan_, which it reads

  std::vector<char> ready_, has_grad_, completed_;
  std::vector<std::int64_t> pending_, sent_;  // sent_: bytes launched per bucket this round
  std::vector<std::optional<work_t>> works_;
  std::size_t next_launch_ = 0;
  std::size_t unready_ = 0;    // parameters not yet marked ready in this round
  std::int64_t per_rank_ = 1;  // micro-batches per round on this rank
  bool async_last_ = false;    // reduce_last_bucket_async()
  ReduceOutcome outcome_;
};

}  // namespace ddp
