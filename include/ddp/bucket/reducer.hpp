// BucketReducer: the averaging reduction stage of data parallelism (the AverageAllReduce, CompressedAllReduce and
// PowerSgd policies). Told "parameter i is ready" during backward and "backward is over" at its end, it launches each
// bucket's all-reduce in plan order as soon as the bucket is complete and reports, per parameter, which ranks had
// a gradient. W is the wire format buckets travel in (bucket/wire.hpp): InPlace (the gradients as they are), a 16-bit float,
// or LowRank (PowerSGD, bucket/powersgd.hpp). Three parts: this file drives readiness and launch order; the status
// words (status_words.hpp) are the round's bookkeeping; the transport (transport.hpp) moves a bucket through its
// wire with the words appended.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "ddp/bucket/outcome.hpp"
#include "ddp/bucket/plan.hpp"
#include "ddp/bucket/status_words.hpp"
#include "ddp/bucket/transport.hpp"
#include "ddp/bucket/wire.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

// Drives one model's buckets over a gradient buffer laid out by the plan (a bucket is a contiguous slice,
// followed by its status words: bucket/status_words.hpp, which writes and reads them, and keeps them on the device
// under static_graph). Every rank must drive the same plan.
// One rank takes the same path: nothing travels (the transport launches nothing) and the status words are this
// rank's own flags, written straight into the outcome.
// Thread safety: one thread per rank drives it (the backward's); the communicator's progress thread only
// touches the bucket slices in flight. Determinism: it adds nothing to the gradients' arithmetic; results
// are those of the backend's all-reduce (bitwise identical on all ranks for threads and MPI).
template <class T, MemorySpace S, AsyncCommunicator C, class W = InPlace>
class BucketReducer {
  using wire_t = BucketWire<T, W, S>;
  static_assert(detail::check_bucket_wire<wire_t, T, S>(), "BucketReducer: BucketWire<T, W, S> is not a wire");
  using wire_value = typename wire_t::value_type;
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
      : BucketReducer(comm, vector_layout(plan), plan, std::move(bucket_offsets), std::move(grads), opts, wire) {}

  // Over a parameter arena laid out for this plan (status words reserved after each bucket's lowest-registered
  // parameter: reserve()). The micro-batches of a round add into the same gradients; finish() divides their sum
  // by `micro_batches_per_rank`, so the result is the mean gradient of the global batch.
  BucketReducer(C& comm, BucketPlan plan, nn::ParameterArena<T, S>& arena, std::int64_t micro_batches_per_rank,
                ReducerOptions opts = {}, wire_config wire = {})
      : BucketReducer(comm, arena_layout(plan, arena), plan, offsets_in(plan, arena), arena.grads(), opts, wire) {
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
  std::int64_t wire_bytes() const noexcept { return transport_.bytes(); }
  // What the wire carries between rounds (StatefulWire: PowerSGD), for checkpoints; empty for a wire without.
  WireState<T> wire_state() const {
    if constexpr (StatefulWire<wire_t, T>)
      return transport_.wire().state();
    else
      return {};
  }
  // Loads it between rounds. A saved state for a stateless wire is refused (ArgumentError); a wire with state
  // checks the layout itself.
  void load_wire_state(WireState<T> const& st, WireStateFrom from) {
    if constexpr (StatefulWire<wire_t, T>) {
      transport_.wire().load_state(st, from);
    } else if (!st.kind.empty()) {
      throw ArgumentError(detail::cat("BucketReducer: a saved ", st.kind, " wire state cannot load into this wire"));
    }
  }

  // Starts a round: every parameter pending. Anything a previous, unfinished round launched completes first
  // (its errors were or will be reported by the collective that raised them), so no buffer is reused in flight.
  void begin() {
    std::fill(ready_.begin(), ready_.end(), 0);
    std::fill(has_grad_.begin(), has_grad_.end(), 0);
    unready_ = ready_.size();
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
    transport_.poll(next_launch_);
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
  void abandon() noexcept { transport_.abandon(); }

 private:
  BucketReducer(C& comm, std::vector<WireBucket> layout, BucketPlan plan, std::vector<std::int64_t> bucket_offsets,
                Tensor<T, S> grads, ReducerOptions opts, wire_config wire)
      : plan_(checked(std::move(plan), bucket_offsets, comm.world_size())),
        offsets_(std::move(bucket_offsets)),
        grads_(std::move(grads)),
        world_(comm.world_size()),
        status_(plan_, world_, comm.rank(), kIdModulus, opts),
        transport_(comm, std::move(layout), slots(), wire, opts.observer) {
    std::size_t const np = plan_.bucket_of.size(), nb = plan_.buckets.size();
    ready_.assign(np, 0);
    unready_ = np;
    has_grad_.assign(np, 0);
    pending_.assign(nb, 0);
    outcome_.missing_somewhere.assign(np, 0);
    outcome_.present_somewhere.assign(np, 0);
  }

  static constexpr std::int64_t kIdModulus = detail::status_id_modulus<wire_value>();

  // The plan, once its bucket offsets and its bucket count are known to fit: each bucket's id must be distinct in
  // the wire's type, or a desync between buckets b and b + kIdModulus would pass the status-word check (16-bit
  // wires hold 256 (bf16) or 2048 (fp16) distinct integers; on one rank nothing travels).
  static BucketPlan checked(BucketPlan plan, std::vector<std::int64_t> const& offsets, int world) {
    std::size_t const nb = plan.buckets.size();
    if (offsets.size() != nb)
      throw ArgumentError(detail::cat("BucketReducer: ", offsets.size(), " bucket offsets for ", nb, " buckets"));
    if (world > 1 && static_cast<std::int64_t>(nb) > kIdModulus)
      throw ArgumentError(detail::cat("DistributedDataParallel: the bucket plan has ", nb, " buckets, but the ",
                                      8 * sizeof(wire_value), "-bit wire of this reduction holds distinct bucket ids ",
                                      "only up to ", kIdModulus, "; use a larger bucket cap (fewer buckets) or a ",
                                      "float wire"));
    return plan;
  }
  std::vector<detail::BucketSlot<T>> slots() const {
    std::vector<detail::BucketSlot<T>> out;
    for (std::size_t b = 0; b < plan_.buckets.size(); ++b)
      out.push_back({.grads = slice(b),
                     .numel = plan_.buckets[b].numel,
                     .status = status_slots(plan_.buckets[b].params.size(), world_)});
    return out;
  }

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
    auto const read = [&](std::size_t b) { status_.read(b, tail(b), part, outcome_); };
    transport_.wait_begins();
    status_.begin_reads();
    if (landing && wire_t::single_collective) {
      std::exception_ptr err;
      for (std::size_t b = 0; b < nb; ++b) {
        transport_.wait_one(b, err);
        if (err) continue;
        try {
          read(b);
        } catch (...) {
          err = std::current_exception();
          continue;
        }
        land(b);
      }
      transport_.wait_ends();
      if (err) std::rethrow_exception(err);
    } else {
      transport_.wait_all();
      transport_.wait_ends();
      for (std::size_t b = 0; b < nb; ++b) read(b);
      for (std::size_t b = 0; b < nb; ++b) land(b);
    }
    status_.end_round(part, has_grad_, tail(nb - 1), outcome_);
    return outcome_;
  }

  // Each bucket as one vector of its gradients.
  static std::vector<WireBucket> vector_layout(BucketPlan const& plan) {
    std::vector<WireBucket> layout;
    for (auto const& b : plan.buckets) layout.push_back({.grads = b.numel, .tensors = {{0, 1, b.numel}}});
    return layout;
  }
  // Each gradient at its place in its bucket's slice, as a matrix of its first dimension's rows.
  static std::vector<WireBucket> arena_layout(BucketPlan const& plan, nn::ParameterArena<T, S> const& arena) {
    std::vector<WireBucket> layout;
    for (auto const& b : plan.buckets) {
      WireBucket w{.grads = b.numel, .tensors = {}};
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
    status_.write(b, part, has_grad_, slice(b), tail(b), outcome_);
    // The last bucket completes when backward is (all but) over: nothing is left to overlap with, so it is reduced
    // on this thread, saving the hand-off to the progress thread and back.
    transport_.launch(b, part, b + 1 == plan_.buckets.size() && !async_last_);
  }

  BucketPlan plan_;
  std::vector<std::int64_t> offsets_;
  Tensor<T, S> grads_;
  int world_;
  detail::BucketStatusWords<T, S> status_;              // after plan_, which it reads
  detail::BucketTransport<T, S, C, wire_t> transport_;  // after grads_ and offsets_

  std::vector<char> ready_, has_grad_;
  std::vector<std::int64_t> pending_;
  std::size_t next_launch_ = 0;
  std::size_t unready_ = 0;    // parameters not yet marked ready in this round
  std::int64_t per_rank_ = 1;  // micro-batches per round on this rank
  bool async_last_ = false;    // reduce_last_bucket_async()
  ReduceOutcome outcome_;
};

}  // namespace ddp
