// DistributedDataParallel<Model, Comm, Bucketer, Reduction, Batching>: verifies and broadcasts the model, then
// reduces its gradients across ranks after each step's backward, with the reduction and batching policies of
// parallel/policies.hpp (the default: bucketed async all-reduces that average and overlap backward).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ddp/autograd/backward.hpp"
#include "ddp/bucket/plan.hpp"
#include "ddp/bucket/round.hpp"
#include "ddp/bucket/stage.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/parallel/invariance.hpp"
#include "ddp/parallel/join_hook.hpp"
#include "ddp/parallel/micro_batch.hpp"
#include "ddp/parallel/policies.hpp"
#include "ddp/parallel/replicas.hpp"
#include "ddp/parallel/update_hook.hpp"
#include "ddp/parallel/verify.hpp"
#include "ddp/trace/timeline.hpp"

namespace ddp {

struct DdpOptions {
  // Broadcast buffers (e.g. BatchNorm running statistics) from rank 0 before each step's forward, as PyTorch.
  bool broadcast_buffers = true;
  // Missing gradients: an error on every rank, or (true, PyTorch's find_unused_parameters) zeros (RoundOptions).
  bool find_unused_parameters = false;
  // When set, forward, backward and each bucket's reduction (launch to observed completion) are recorded.
  Timeline* timeline = nullptr;
  // NaN/Inf in the reduced gradients: ignored, an error on every rank, or the step skipped on every rank.
  NonFinite non_finite = NonFinite::kIgnore;
  // Every step gives gradients to the same parameters (PyTorch's static_graph). On device tensors, after the
  // first step the round's bookkeeping (each bucket's status words) no longer crosses to the host: a DDP step then
  // makes no synchronous copy, and a desync or a changed graph is reported at the next host read (a loss read,
  // an evaluation) on every rank instead of at once. A non-finite check keeps the host read. Host tensors and
  // deterministic mode (ExactSum) read their bookkeeping on the host regardless.
  bool static_graph = false;
  // With static_graph on device tensors: the host reads the device's check at least every this many steps (one
  // word copied back), so a desync is reported at most this many steps late even when nothing else reads the
  // device (TrainerOptions::loss_every). At least 1.
  std::int64_t static_graph_check_every = 16;
};

// Wraps a model whose replicas live on the ranks of `comm`. Guarantees:
//  - construction checks that every rank has the same parameters (names, shapes, frozen or not) and a well-formed,
//    identical bucket plan, then copies rank 0's parameters (frozen ones too) and buffers to every rank;
//  - a step is one round: the forward/backward passes of this rank's micro-batches (one under OnePass), then the
//    reduction. After the backward of the round's last micro-batch, every rank holds the reduced mean gradient of
//    the global batch (AverageAllReduce: launched bucket by bucket as backward completes them, overlapping it);
//    a backward that does not reach this model's parameters leaves the round open;
//  - the loop is the same for every composition:
//      opt.zero_grad();
//      for (auto const& mb : ddp.micro_batches(x, y, {.step = s})) backward(loss(ddp(mb), mb.y));
//      opt.step();
//    and under OnePass also PyTorch's: backward(loss(ddp(Var(x)), y));
//  - gradients live in the arena's bucket slices; gradient hooks users set (Variable::set_grad_hook) run first;
//  - NonFinite::kRaise / kSkipStep act on every rank alike (step_skipped(), skipped_steps());
//  - ranks with different numbers of batches train inside ddp::join (parallel/join.hpp).
// Determinism is the reduction policy's (policies.hpp). Build the optimizer after this wrapper, from parameters().
// Not copyable or movable (the hooks point at it). One thread per rank.
template <nn::Model M, AsyncCommunicator C, GradientBucketer B = SizeCapped, ReductionPolicy R = AverageAllReduce,
          BatchingPolicy Bt = OnePass>
class DistributedDataParallel {
 public:
  using value_type = typename M::value_type;
  using space = typename M::space;
  using T = value_type;
  using S = space;
  using V = Variable<T, S>;
  using reducer_t = typename R::template stage<T, S, C>;

  static_assert(C::accepted_spaces::template contains<S> || !std::same_as<S, HostSpace>,
                "DistributedDataParallel: the model's tensors are host (Eigen) tensors, but this communicator takes "
                "device memory only (e.g. NcclBackend). Build the model over device tensors (Variable<T, "
                "DeviceSpace>, <ddp/tensor/device.hpp>), or use ThreadsBackend / MpiBackend for host models.");
  static_assert(C::accepted_spaces::template contains<S> || std::same_as<S, HostSpace>,
                "DistributedDataParallel: the model's tensors are device tensors, but this communicator takes host "
                "memory only (e.g. MpiBackend). Name a host-staging adapter: HostStaging<MpiBackend> staged(mpi) "
                "from <ddp/comm/host_staging.hpp> copies each bucket through host memory; or use NcclBackend.");
  static_assert(CommElement<T>, "DistributedDataParallel: parameters must be float or double");
  // The reduction's stage keeps the round contract (bucket/stage.hpp); a missing member is named here. After the
  // checks above: a stage over the wrong memory would only repeat their error.
  static_assert(detail::reduction_stage_checked<reducer_t, C::accepted_spaces::template contains<S>>);

  DistributedDataParallel(M& model, C& comm, DdpOptions opts = {}, B bucketer = {}, R reduction = {}, Bt batching = {})
      : model_(&model),
        comm_(&comm),
        opts_(opts),
        bucketer_(std::move(bucketer)),
        reduction_(reduction),
        batching_(batching),
        per_rank_(batching_.per_rank(comm.world_size())) {
    using Arena = nn::ParameterArena<T, S>;
    auto const params = Arena::trainable(model.named_parameters());
    int const world = comm.world_size();
    if constexpr (!detail::reduces_gradients<R>)
      if (opts_.non_finite != NonFinite::kIgnore)
        throw ArgumentError(detail::cat("DistributedDataParallel: ", reduction_.name(),
                                        " leaves the gradients unreduced until the optimizer's step, so there are no "
                                        "reduced gradients to check for NaN/Inf: use NonFinite::kIgnore with it, or "
                                        "AverageAllReduce with ZeroRedundancyOptimizer for the checks"));
    if (opts_.static_graph_check_every < 1)
      throw ArgumentError(
          detail::cat("DistributedDataParallel: DdpOptions::static_graph_check_every must be at least 1, "
                      "got ",
                      opts_.static_graph_check_every));
    if (world > 1) detail::verify_parameters_match(comm, detail::signatures(model));
    // An arena made before wrapping (say, an optimizer's) would keep updating storage the model no longer reads
    // once this wrapper re-packs the parameters. The same on every rank (same model everywhere).
    if (auto const* p = Arena::find_packed(params))
      throw ArgumentError(detail::cat(
          "DistributedDataParallel: parameter '", p->name,
          "' is already packed in a live ParameterArena (an optimizer built before wrapping the model?). Wrapping "
          "re-packs the parameters, so that optimizer would update orphaned copies. Construct the optimizer after "
          "DistributedDataParallel, from ddp.parameters()."));
    std::vector<std::int64_t> numels;
    for (auto const& p : params) numels.push_back(p.var.numel());
    BucketPlan plan = bucketer_.plan(numels, R::template element_bytes<T>);
    detail::verify_plan(comm, plan, numels, bucketer_.name());
    arena_ = Arena(params, reducer_t::reserve(plan, params.size(), world), detail::gradient_storage<T, S>(comm));
    if (world > 1) detail::broadcast_state(comm, model, 0);  // rank 0's parameters and buffers everywhere
    if constexpr (R::world_size_invariant) detail::broadcast_generators(comm, nn::generators_of(model), 0);
    if (opts_.timeline) timeline_.emplace(*opts_.timeline);
    reducer_.emplace(comm, std::move(plan), arena_, per_rank_,
                     ReducerOptions{.observer = timeline_ ? &*timeline_ : nullptr,
                                    .non_finite = opts_.non_finite,
                                    .static_graph = opts_.static_graph,
                                    .static_graph_check_every = opts_.static_graph_check_every},
                     detail::wire_config(reduction_));
    round_.emplace(
        comm, arena_,
        RoundOptions{.find_unused_parameters = opts_.find_unused_parameters, .non_finite = opts_.non_finite});
    for (std::size_t i = 0; i < arena_.count(); ++i)
      arena_.entries()[i].var.node().leaf_hooks().ready_hook = {.fn = &ready_trampoline, .ctx = this, .index = i};
  }

  DistributedDataParallel(DistributedDataParallel const&) = delete;
  DistributedDataParallel& operator=(DistributedDataParallel const&) = delete;
  ~DistributedDataParallel() {
    reducer_->abandon();
    for (auto const& e : arena_.entries()) e.var.node().leaf_hooks().ready_hook = {};
    cancel_post_backward(this);  // a backward that reached the hooks but has not run its callbacks (same thread)
  }

  // This rank's share of a step, cut into the batching policy's micro-batches (views of x's and y's rows; one
  // under OnePass), each knowing its global sample index. x and y have the same number of rows. World-size-
  // invariant reductions first check, on every rank at once, that the ranks agree (invariance.hpp).
  template <class Y>
  std::vector<MicroBatch<Tensor<T, S>, Y>> micro_batches(Tensor<T, S> const& x, Y const& y, BatchStep at = {}) {
    std::int64_t const rows = x.shape().rank() == 0 ? 0 : x.shape()[0];
    if (y.shape().rank() == 0 || y.shape()[0] != rows)
      throw ShapeError(
          detail::cat("DistributedDataParallel: targets of shape ", y.shape(), " for ", rows, " input rows"));
    if constexpr (R::world_size_invariant)
      detail::check_invariant_step(*comm_, nn::generators_of(*model_), x.shape(), per_rank_, at.step);
    else if (rows % per_rank_ != 0)
      throw ShapeError(detail::cat("DistributedDataParallel: rank ", comm_->rank(), "'s batch has ", rows,
                                   " rows (shape ", x.shape(), "), which is not ", per_rank_, " equal micro-batches"));
    return detail::split_rows(x, y, per_rank_, at.step, comm_->rank() * rows);
  }

  // Runs the model on one micro-batch; the round opens with micro-batch 0 (outside no_sync, with autograd on) and
  // its reduction follows the backward of the last.
  template <class Y>
  V forward(MicroBatch<Tensor<T, S>, Y> const& mb) {
    if (mb.count != per_rank_ || mb.index < 0 || mb.index >= mb.count)
      throw ArgumentError(detail::cat("DistributedDataParallel: micro-batch ", mb.index, " of ", mb.count, " under ",
                                      batching_.name(), ", which gives each rank ", per_rank_,
                                      "; forward the micro-batches micro_batches() returns, in order"));
    return run(V(mb.x), &mb.key, mb.index);
  }
  template <class Y>
  V operator()(MicroBatch<Tensor<T, S>, Y> const& mb) {
    return forward(mb);
  }
  // PyTorch's form, one forward per step (OnePass only).
  V forward(V const& x) {
    static_assert(std::same_as<Bt, OnePass>,
                  "DistributedDataParallel: with micro-batches, forward each one: for (auto const& mb : "
                  "ddp.micro_batches(x, y, {.step = s})) backward(loss(ddp(mb), mb.y));");
    return run(x, nullptr, 0);
  }
  V operator()(V const& x) { return forward(x); }

  // Scope guard: forwards and backwards inside it accumulate gradients locally (no communication); the first
  // round after it reduces the accumulated sum. k micro-batches under no_sync plus one outside equal one batch
  // k+1 times as large (for mean losses, scale each by 1/(k+1)).
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& d) : d_(&d) { ++d_->no_sync_depth_; }
    ~NoSync() { --d_->no_sync_depth_; }
    NoSync(NoSync const&) = delete;
    NoSync& operator=(NoSync const&) = delete;

   private:
    DistributedDataParallel* d_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  // Whether the last round's gradients were dropped as non-finite (NonFinite::kSkipStep), on every rank alike.
  bool step_skipped() const noexcept { return round_->step_skipped(); }
  std::int64_t skipped_steps() const noexcept { return round_->skipped_steps(); }
  std::vector<std::string> const& non_finite_parameters() const noexcept { return round_->non_finite_parameters(); }

  nn::ParameterArena<T, S>& parameters() noexcept { return arena_; }
  BucketPlan const& plan() const noexcept { return reducer_->plan(); }
  // What the reduction's wire carries between rounds (PowerSGD's round counts, Q and error feedback; empty for
  // other wires), and loading it back between rounds: checkpoints keep it (save_checkpoint with a RoundState).
  WireState<T> wire_state() const {
    if constexpr (requires { reducer_->wire_state(); })
      return reducer_->wire_state();
    else
      return {};
  }
  void load_wire_state(WireState<T> const& st, WireStateFrom from) {
    if constexpr (requires { reducer_->load_wire_state(st, from); }) {
      reducer_->load_wire_state(st, from);
    } else if (!st.kind.empty()) {
      throw ArgumentError(detail::cat("DistributedDataParallel: ", reduction_.name(), " keeps no wire state, but a ",
                                      st.kind, " state was given to load"));
    }
  }
  M& module() noexcept { return *model_; }
  C& comm() noexcept { return *comm_; }
  DdpOptions const& options() const noexcept { return opts_; }
  // Micro-batches per step on this rank.
  std::int64_t micro_batches_per_rank() const noexcept { return per_rank_; }
  static constexpr bool world_size_invariant = R::world_size_invariant;
  // Whether the reduced gradients are in the arena after backward (false under OwnerReduce: the optimizer reduces).
  static constexpr bool reduces_gradients = detail::reduces_gradients<R>;
  // What was composed, for logs.
  std::string describe() const {
    std::string wire;  // what the reduction stage sends per step, where it says
    if constexpr (requires { reducer_->wire_bytes(); })
      wire = detail::cat(", ", reducer_->wire_bytes(), " bytes a step");
    // static_graph changes nothing on host tensors (their status words are read in place): named where it acts.
    bool const frozen = opts_.static_graph && !std::same_as<S, HostSpace>;
    return detail::cat("DistributedDataParallel<", bucketer_.name(), ", ", reduction_.name(), ", ", batching_.name(),
                       "> over ", comm_->world_size(), " ranks", frozen ? ", static graph" : "", ": ", arena_.count(),
                       " parameters (", arena_.parameter_numel(), " elements) in ", reducer_->plan().buckets.size(),
                       " buckets", wire);
  }

 private:
  friend struct detail::JoinAccess;
  friend struct detail::UpdateAccess;
  friend struct detail::OwnerAccess;

  // The synchronised round in progress: which micro-batch's backward is due, what the round was agreed to be.
  struct Open {
    std::int64_t micro_batch = 0;
    std::int64_t step = -1;
    detail::JoinRound join{};
    std::uint64_t queued_epoch = 0;  // the backward (Node::visit_epoch) that queued end_backward
    std::uint64_t buffers = 0;       // world-size-invariant reductions: the buffers' fingerprint at the start
  };

  V run(V const& x, SampleKey const* key, std::int64_t index) {
    bool const sync = grad_enabled() && no_sync_depth_ == 0;
    if (sync && index == 0) {
      open_round(key);
    } else if (index == 0 && !join_ && opts_.broadcast_buffers && comm_->world_size() > 1) {
      // A forward outside a round (evaluation, no_sync) sees rank 0's buffers too.
      detail::broadcast_buffers(*comm_, *model_, 0);
    } else if (sync && (!open_ || open_->micro_batch != index)) {
      throw ArgumentError(detail::cat("DistributedDataParallel: micro-batch ", index, " forwarded while micro-batch ",
                                      open_ ? open_->micro_batch : 0,
                                      " is due; forward and backward each micro-batch in order"));
    }
    std::optional<SampleKeyScope> keyed;  // dropout keyed by the sample, not a generator's stream (policies.hpp)
    if constexpr (R::world_size_invariant)
      if (key) keyed.emplace(*key);
    auto const t0 = timeline_ ? Timeline::clock::now() : Timeline::clock::time_point{};
    V y = model_->forward(x);
    if (timeline_) timeline_->forward(t0, Timeline::clock::now());
    if constexpr (R::world_size_invariant)
      if (sync && index + 1 == per_rank_)
        detail::check_buffers_unchanged(*comm_, *model_, detail::buffers_fingerprint(*model_) != open_->buffers);
    return y;
  }

  void open_round(SampleKey const* key) {
    if constexpr (!reduces_gradients)
      if (!reduction_owner_)
        throw ArgumentError(detail::cat("DistributedDataParallel: ", reduction_.name(),
                                        " leaves each rank's gradients local for the optimizer to reduce, and no "
                                        "optimizer reduces them: build a ZeroRedundancyOptimizer (stage 1 or 2) from "
                                        "this DistributedDataParallel before the first step"));
    detail::JoinRound const agreed = join_ ? join_->on_round() : detail::JoinRound{};
    if (opts_.broadcast_buffers && comm_->world_size() > 1)
      detail::broadcast_buffers(*comm_, *model_, agreed.buffer_root);
    reducer_->begin();
    open_ = Open{.step = key ? static_cast<std::int64_t>(key->step) : -1, .join = agreed};
    if constexpr (R::world_size_invariant) open_->buffers = detail::buffers_fingerprint(*model_);
  }

  // Parameter i's gradient is final in this backward. Only a backward that reaches this model's parameters queues
  // the end of its micro-batch, so an unrelated backward on the same thread cannot consume it.
  static void ready_trampoline(void* self, std::size_t i, Node<T, S>& n) {
    auto& d = *static_cast<DistributedDataParallel*>(self);
    if (!d.open_) return;
    if (n.visit_epoch != d.open_->queued_epoch) {  // the first hook of this backward
      d.open_->queued_epoch = n.visit_epoch;
      if (!post_backward_queued(&d)) queue_post_backward(&d, [&d] { d.end_backward(); });
    }
    if (d.open_->micro_batch + 1 < d.per_rank_ || d.reducer_->is_ready(i)) return;  // not the last, or retain_graph
    d.reducer_->mark_ready(i, n.grad_defined || d.round_->fill_missing(i));
  }

  void end_backward() {
    if (!open_) return;
    if (open_->micro_batch + 1 < per_rank_) {
      reducer_->end_micro_batch();
      ++open_->micro_batch;
      return;
    }
    Open const round = *open_;
    open_.reset();
    if (!reducer_->all_ready())
      for (std::size_t i = 0; i < arena_.count(); ++i)  // parameters this backward did not reach
        if (!reducer_->is_ready(i)) reducer_->mark_ready(i, round_->fill_missing(i));
    // An attached optimizer updates each bucket as it lands, unless the round needs every bucket first: a
    // non-finite check (it may drop the whole step) or a join's divisor.
    bool const per_bucket = update_ && opts_.non_finite == NonFinite::kIgnore && !join_;
    auto const land = [this](std::size_t b) {
      auto const& bucket = reducer_->plan().buckets[b];  // one contiguous slice of the arena
      if (!round_->land(bucket.params, reducer_->outcome())) return false;
      std::int64_t const lo = arena_.entries()[bucket.params.front()].offset;
      update_->on_bucket_reduced(lo, lo + bucket.numel);
      return true;
    };
    round_->end(per_bucket ? reducer_->finish(land) : reducer_->finish(),
                RoundEnd{.grad_scale = round.join.grad_scale, .step = round.step},
                [this](std::size_t i) { return reducer_->had_grad(i); });
  }

  // OverlappedOptimizer (overlapped_update.hpp): attached, it is told of each bucket as its reduction lands, and
  // with more than one bucket the last is reduced on the progress thread so that the others' updates overlap it
  // (a single bucket has nothing to overlap with: it stays on the caller's thread).
  void attach_update(detail::UpdateHook* hook) {
    update_ = hook;
    if constexpr (requires { reducer_->reduce_last_bucket_async(true); })
      reducer_->reduce_last_bucket_async(hook != nullptr && reducer_->plan().buckets.size() > 1);
  }

  // Join (join.hpp): while attached, a round's first forward agrees on the round with the hook first.
  void attach_join(detail::JoinHook* hook) noexcept { join_ = hook; }
  // Join: this rank has no batch; it answers the round the others agreed on (buffers from round.buffer_root,
  // then every bucket with zeros) and ends it as they do, errors included.
  void shadow_round(detail::JoinRound round) {
    static_assert(ShadowingStage<reducer_t>,
                  "ddp::join: this reduction's stage has no shadow_round() to answer a round for a rank without a "
                  "batch (bucket/stage.hpp)");
    if (opts_.broadcast_buffers) detail::broadcast_buffers(*comm_, *model_, round.buffer_root);
    round_->end(reducer_->shadow_round(), RoundEnd{.part = Participation::kShadow, .grad_scale = round.grad_scale},
                [this](std::size_t i) { return reducer_->had_grad(i); });
  }

  M* model_;
  C* comm_;
  DdpOptions opts_;
  B bucketer_;
  R reduction_;
  Bt batching_;
  std::int64_t per_rank_;  // micro-batches per step on this rank
  nn::ParameterArena<T, S> arena_;
  std::optional<TimelineObserver> timeline_;
  std::optional<reducer_t> reducer_;     // built once the arena exists; destroyed before it
  std::optional<Round<T, S, C>> round_;  // what a finished round means (bucket/round.hpp)
  std::optional<Open> open_;             // the synchronised round in progress, if any
  int no_sync_depth_ = 0;
  detail::JoinHook* join_ = nullptr;       // a ddp::join running on this rank
  detail::UpdateHook* update_ = nullptr;   // an optimizer that updates each bucket as it lands
  void const* reduction_owner_ = nullptr;  // OwnerReduce: the optimizer that reduces the gradients (OwnerAccess)
};

}  // namespace ddp
