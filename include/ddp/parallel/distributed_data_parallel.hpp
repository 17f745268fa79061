// DistributedDataParallel<Model, Comm, Bucketer, Reduction, Batching>: verifies and broadcasts the model, then
// reduces its gradients across ranks after each step's backward, with the reduction and batching policies of
// parallel/policies.hpp (the default: bucketed async all-reduces that average and overlap backward).
#pragma once

#include <algorithm>
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
#include "ddp/parallel/attachment.hpp"
#include "ddp/parallel/composition.hpp"
#include "ddp/parallel/ddp_options.hpp"
#include "ddp/parallel/invariance.hpp"
#include "ddp/parallel/micro_batch.hpp"
#include "ddp/parallel/policies.hpp"
#include "ddp/parallel/replicas.hpp"
#include "ddp/parallel/verify.hpp"
#include "ddp/trace/timeline.hpp"

namespace ddp {

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
//  - what else takes part in its rounds (ddp::join for uneven inputs, an overlapped update, an optimizer that shards
//    or reduces) attaches through attach(hook), which refuses what does not compose (composition.hpp).
// Determinism is the reduction policy's (policies.hpp). Build the optimizer after this wrapper, from parameters().
// Not copyable or movable (the hooks point at it). One thread per rank.
template <nn::Model M, AsyncCommunicator C, GradientBucketer B = SizeCapped, ReductionPolicy R = AverageAllReduce,
          BatchingPolicy Bt = OnePass>
class DistributedDataParallel : detail::HookSite {
 public:
  using value_type = typename M::value_type;
  using space = typename M::space;
  using T = value_type;
  using S = space;
  using V = Variable<T, S>;
  using reducer_t = typename R::template stage<T, S, C>;

  static_assert(detail::types_compose<T, S, C, reducer_t>());  // composition.hpp: each refusal names the fix

  DistributedDataParallel(M& model, C& comm, DdpOptions opts = {}, DdpPolicies<B, R, Bt> policies = {})
      : model_(&model),
        comm_(&comm),
        opts_(opts),
        bucketer_(std::move(policies.bucketer)),
        reduction_(policies.reduction),
        batching_(policies.batching),
        per_rank_(batching_.per_rank(comm.world_size())) {
    auto const params = nn::ParameterArena<T, S>::trainable(model.named_parameters());
    int const world = comm.world_size();
    check_composition({.ddp = composition()});
    detail::check_options(opts_);
    if (world > 1) detail::verify_parameters_match(comm, detail::signatures(model));
    detail::refuse_packed(params);
    BucketPlan plan = detail::verified_plan(comm, bucketer_, params, R::template element_bytes<T>);
    arena_ = nn::ParameterArena<T, S>(params, reducer_t::reserve(plan, params.size(), world),
                                      detail::gradient_storage<T, S>(comm));
    if (world > 1) detail::broadcast_state(comm, model, 0);  // rank 0's parameters and buffers everywhere
    if constexpr (R::world_size_invariant) detail::broadcast_generators(comm, nn::generators_of(model), 0);
    if (opts_.timeline) timeline_.emplace(*opts_.timeline);
    reducer_.emplace(comm, std::move(plan), arena_, per_rank_,
                     detail::reducer_options(opts_, timeline_ ? &*timeline_ : nullptr),
                     detail::wire_config(reduction_));
    round_.emplace(
        comm, arena_,
        RoundOptions{.find_unused_parameters = opts_.find_unused_parameters, .non_finite = opts_.non_finite});
    for (std::size_t i = 0; i < arena_.count(); ++i)
      arena_.entries()[i].var.node().leaf_hooks().ready_hook = {.fn = &ready_trampoline, .ctx = this, .index = i};
  }

  DistributedDataParallel(DistributedDataParallel const&) = delete;
  DistributedDataParallel& operator=(DistributedDataParallel const&) = delete;
  // Attachments must end first (ddp::join, optimizers built from this wrapper: declare them after it).
  ~DistributedDataParallel() {
    reducer_->abandon();
    for (auto const& e : arena_.entries()) e.var.node().leaf_hooks().ready_hook = {};
    cancel_post_backward(this);  // a backward that reached the hooks but has not run its callbacks (same thread)
  }

  // This rank's share of a step as the batching policy's micro-batches (views of x's and y's rows, each knowing its
  // global sample index); world-size-invariant reductions first check, on every rank at once, that the ranks agree.
  template <class Y>
  std::vector<MicroBatch<Tensor<T, S>, Y>> micro_batches(Tensor<T, S> const& x, Y const& y, BatchStep at = {}) {
    if constexpr (R::world_size_invariant)
      if (y.shape().rank() > 0 && x.shape().rank() > 0 && y.shape()[0] == x.shape()[0])
        detail::check_invariant_step(*comm_, nn::generators_of(*model_), x.shape(), per_rank_, at.step);
    return detail::rank_micro_batches(x, y, per_rank_, at.step, comm_->rank(), R::world_size_invariant);
  }

  // Runs the model on one micro-batch: micro-batch 0 opens the round, the backward of the last reduces it.
  template <class Y>
  V forward(MicroBatch<Tensor<T, S>, Y> const& mb) {
    detail::check_micro_batch(mb, per_rank_, batching_.name());
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

  // Scope guard: gradients accumulate locally inside it; the first round after it reduces the sum (k micro-batches
  // under no_sync plus one outside equal one batch k+1 times as large: scale mean losses by 1/(k+1)).
  using NoSync = detail::ScopedDepth;
  [[nodiscard]] NoSync no_sync() { return NoSync(no_sync_depth_); }

  // Whether the last round's gradients were dropped as non-finite (NonFinite::kSkipStep), on every rank alike.
  bool step_skipped() const noexcept { return round_->step_skipped(); }
  std::int64_t skipped_steps() const noexcept { return round_->skipped_steps(); }
  std::vector<std::string> const& non_finite_parameters() const noexcept { return round_->non_finite_parameters(); }

  nn::ParameterArena<T, S>& parameters() noexcept { return arena_; }
  BucketPlan const& plan() const noexcept { return reducer_->plan(); }
  // What the reduction's wire carries between rounds (PowerSGD's counters, Q and E), for checkpoints (RoundState).
  WireState<T> wire_state() const { return detail::stage_wire_state<reducer_t, T>(*reducer_); }
  void load_wire_state(WireState<T> const& st, WireStateFrom from) {
    detail::load_stage_wire_state(*reducer_, st, from, reduction_.name());
  }
  // What this rank sends in one synchronised round (gradients and status words; 0 where the stage does not say).
  std::int64_t wire_bytes() const { return detail::stage_wire_byte_count(*reducer_); }
  M& module() noexcept { return *model_; }
  C& comm() noexcept { return *comm_; }
  DdpOptions const& options() const noexcept { return opts_; }
  std::int64_t micro_batches_per_rank() const noexcept { return per_rank_; }
  static constexpr bool world_size_invariant = R::world_size_invariant;
  // Whether the reduced gradients are in the arena after backward (false under OwnerReduce: the optimizer reduces).
  static constexpr bool reduces_gradients = detail::reduces_gradients<R>;
  // Attaches `hook` until the Attachment goes, between rounds; composition_refusal()'s ArgumentError where it does not
  // compose.
  [[nodiscard]] Attachment attach(DdpHook& hook) {
    HookTraits traits = hook.traits();
    check_composition({.ddp = composition(), .attached = hooks_.traits(), .attaching = &traits});
    hooks_.add(hook, std::move(traits));
    sync_hooks();
    return Attachment(*this, hook);
  }
  // The DDP side of a composition (composition.hpp).
  CompositionView composition() const {
    return {.reduction = reduction_.name(),
            .reduces_gradients = reduces_gradients,
            .non_finite = opts_.non_finite,
            .world = comm_->world_size(),
            .world_size_invariant = R::world_size_invariant};
  }
  // ddp::join, through its attachment: this rank has no batch; it answers the round the others agreed on (buffers
  // from round.buffer_root, then every bucket with zeros) and ends it as they do, errors included.
  void shadow_round(Attachment const& by, JoinRound round) {
    static_assert(detail::check_shadowing_stage<reducer_t>());
    if (!hooks_.join() || !by.holds(*this, *hooks_.join()))
      throw ArgumentError("DistributedDataParallel::shadow_round: only the attached ddp::join answers rounds");
    if (opts_.broadcast_buffers) detail::broadcast_buffers(*comm_, *model_, round.buffer_root);
    round_->end(reducer_->shadow_round(), RoundEnd{.part = Participation::kShadow, .grad_scale = round.grad_scale},
                [this](std::size_t i) { return reducer_->had_grad(i); });
  }

  // What was composed, for logs (static_graph named where it acts: host tensors read their words in place).
  std::string describe() const {
    return detail::cat("DistributedDataParallel<", bucketer_.name(), ", ", reduction_.name(), ", ", batching_.name(),
                       "> over ", comm_->world_size(), " ranks",
                       opts_.static_graph && !std::same_as<S, HostSpace> ? ", static graph" : "", ": ", arena_.count(),
                       " parameters (", arena_.parameter_numel(), " elements) in ", reducer_->plan().buckets.size(),
                       " buckets", detail::stage_wire_bytes(*reducer_));
  }

 private:
  V run(V const& x, SampleKey const* key, std::int64_t index) {
    bool const local = hooks_.local_round();  // a local step (LocalSgd, DiLoCo): no round, buffers stay
    bool const sync = grad_enabled() && no_sync_depth_ == 0 && !local;
    if (local && index == 0) round_->local_step();
    if (local && grad_enabled()) hooks_.local_forward(index);  // virtual replicas switch between micro-batches
    if (sync && index == 0)
      open_round(key);
    else if (sync && (!open_ || open_->micro_batch != index))
      detail::refuse_out_of_order(index, open_ ? open_->micro_batch : 0);
    else if (index == 0 && !local && !hooks_.join() && opts_.broadcast_buffers && comm_->world_size() > 1)
      detail::broadcast_buffers(*comm_, *model_, 0);  // outside a round (evaluation, no_sync) too
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
    if constexpr (!reduces_gradients)  // the rules only when no reducer is attached: no work per round otherwise
      if (!hooks_.has(Capability::kReducesGradients))
        check_composition({.ddp = composition(), .attached = hooks_.traits(), .opening_round = true});
    JoinRound const agreed = hooks_.join() ? hooks_.join()->on_round() : JoinRound{};
    if (opts_.broadcast_buffers && comm_->world_size() > 1)
      detail::broadcast_buffers(*comm_, *model_, agreed.buffer_root);
    reducer_->begin();
    open_ = detail::OpenRound{.step = key ? static_cast<std::int64_t>(key->step) : -1, .join = agreed};
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
    detail::OpenRound const round = *open_;
    open_.reset();
    if (!reducer_->all_ready())
      for (std::size_t i = 0; i < arena_.count(); ++i)  // parameters this backward did not reach
        if (!reducer_->is_ready(i)) reducer_->mark_ready(i, round_->fill_missing(i));
    // An attached optimizer updates each bucket as it lands, unless the round needs every bucket first: a
    // non-finite check (it may drop the whole step) or a join's divisor.
    DdpHook* const update = hooks_.update();
    bool const per_bucket = update && opts_.non_finite == NonFinite::kIgnore && !hooks_.join();
    auto const land = [this, update](std::size_t b) {
      auto const& bucket = reducer_->plan().buckets[b];  // one contiguous slice of the arena
      if (!round_->land(bucket.params, reducer_->outcome())) return false;
      std::int64_t const lo = arena_.entries()[bucket.params.front()].offset;
      update->on_bucket_reduced(lo, lo + bucket.numel);
      return true;
    };
    round_->end(per_bucket ? reducer_->finish(land) : reducer_->finish(),
                RoundEnd{.grad_scale = round.join.grad_scale, .step = round.step},
                [this](std::size_t i) { return reducer_->had_grad(i); });
  }

  // HookSite: an Attachment detaches. With an update in backward and more than one bucket, the last bucket is reduced
  // on the progress thread so that the others' updates overlap it (one bucket stays on the caller's thread).
  void detach(DdpHook& hook) noexcept override {
    hooks_.remove(hook);
    sync_hooks();
  }
  void sync_hooks() noexcept {
    if constexpr (requires { reducer_->reduce_last_bucket_async(true); })
      reducer_->reduce_last_bucket_async(hooks_.update() != nullptr && reducer_->plan().buckets.size() > 1);
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
  std::optional<reducer_t> reducer_;       // built once the arena exists; destroyed before it
  std::optional<Round<T, S, C>> round_;    // what a finished round means (bucket/round.hpp)
  std::optional<detail::OpenRound> open_;  // the synchronised round in progress, if any
  int no_sync_depth_ = 0;
  detail::HookList hooks_;  // attached: ddp::join (join()), an update in backward (update()), optimizers
};

}  // namespace ddp
