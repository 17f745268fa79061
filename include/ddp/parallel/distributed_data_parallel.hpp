// DistributedDataParallel<Model, Comm, Bucketer>: verifies and broadcasts the model, then averages
// gradients across ranks with bucketed async all-reduces that overlap backward.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/autograd/backward.hpp"
#include "ddp/bucket/plan.hpp"
#include "ddp/bucket/reducer.hpp"
#include "ddp/bucket/reducer_observer.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/parallel/verify.hpp"
#include "ddp/trace/timeline.hpp"

namespace ddp {

// What DDP does when the averaged gradients of a step hold a NaN or Inf. The check runs after the reduction,
// whose result is the same on every rank, so every rank decides alike; each rank also flags, in its buckets'
// status words, whether its own gradients were non-finite before the reduction, so the error can name the
// ranks they came from. Cost when on: one pass over the gradients before and one after the reduction.
enum class NonFinite {
  kIgnore,    // no check (the default, and PyTorch's): NaN/Inf reach the optimizer
  kRaise,     // DdpError on every rank naming the parameter(s) and the rank(s) that produced them
  kSkipStep,  // every rank drops the step's gradients (has_grad() false, so optimizer.step() changes nothing:
              // no parameter, momentum or step count moves); counted by skipped_steps()
};

struct DdpOptions {
  // Broadcast buffers (e.g. BatchNorm running statistics) from rank 0 before each forward, as PyTorch.
  bool broadcast_buffers = true;
  // false: a parameter that got no gradient in a synchronised backward, on any rank, is an error on every
  // rank naming it and the ranks. true (PyTorch's find_unused_parameters=True): a rank without its gradient
  // contributes zeros; a parameter unused on every rank keeps no gradient, and optimizers skip it.
  bool find_unused_parameters = false;
  // When set, forward, backward and each bucket's all-reduce (launch to observed completion) are recorded.
  Timeline* timeline = nullptr;
  // NaN/Inf in the averaged gradients: ignored, an error on every rank, or the step skipped on every rank.
  NonFinite non_finite = NonFinite::kIgnore;
};

namespace detail {
// What one synchronised round under ddp::join (parallel/join.hpp) was agreed to be: where buffers come from
// (the lowest rank that still has data) and the factor applied to the averaged gradients (1, or
// world / ranks with data when JoinOptions::divide_by_initial_world_size is false).
struct JoinRound {
  int buffer_root = 0;
  double grad_scale = 1.0;
};
// Implemented by ddp::join: called by a synchronised forward on a rank that still has data, before any of the
// round's collectives, to agree with the other ranks on the round.
class JoinHook {
 public:
  virtual JoinRound on_round() = 0;

 protected:
  ~JoinHook() = default;
};
struct JoinAccess;  // join.hpp's way in: attach a hook, shadow a round, broadcast the state
}  // namespace detail

// Wraps a model whose replicas live on the ranks of `comm`. Guarantees:
//  - construction checks that every rank has the same parameters (names, shapes, frozen or not) and bucket
//    plan, then copies rank 0's parameters (frozen ones too) and buffers to every rank (one broadcast per
//    tensor); frozen parameters (requires_grad false) are otherwise left alone, as in PyTorch;
//  - after each backward that followed a forward through this wrapper (outside no_sync) and reached its
//    parameters, every rank holds the average of the ranks' gradients (a backward through other models on
//    the same thread leaves this one's round open): buckets are reduced in plan order (BucketReducer) as soon as they are
//    complete, asynchronously, overlapping the rest of backward (the last bucket, complete only when
//    backward is done, is reduced on the calling thread), and backward returns once all are done;
//  - gradients live in the arena's bucket slices: nothing is copied into or out of a comm buffer;
//  - the 1/world_size factor is part of the reduction (ReduceOp::kAvg);
//  - results are bitwise identical on all ranks when the backend's all-reduce is (threads, MPI);
//  - gradient hooks users set on parameters (Variable::set_grad_hook) keep working: they run first, and the
//    reduction sees the gradient as they left it;
//  - with DdpOptions::non_finite set, NaN/Inf in the averaged gradients raise, or skip the step, on every rank
//    alike (step_skipped(), skipped_steps());
//  - ranks with different numbers of batches train inside ddp::join (parallel/join.hpp), which shadows the
//    finished ranks' collectives; without it, every rank must run the same number of synchronised steps.
// Use parameters() for the optimizer, built after this wrapper (an earlier arena is rejected at construction). Not copyable or movable (the hooks point at it). One thread per rank.
template <nn::Model M, AsyncCommunicator C, GradientBucketer B = SizeCapped>
class DistributedDataParallel {
 public:
  using value_type = typename M::value_type;
  using space = typename M::space;
  using T = value_type;
  using S = space;
  using V = Variable<T, S>;

  static_assert(C::accepted_spaces::template contains<S> || !std::same_as<S, HostSpace>,
                "DistributedDataParallel: the model's tensors are host (Eigen) tensors, but this communicator takes "
                "device memory only (e.g. NcclBackend). Build the model over device tensors (Variable<T, "
                "DeviceSpace>, <ddp/tensor/device.hpp>), or use ThreadsBackend / MpiBackend for host models.");
  static_assert(C::accepted_spaces::template contains<S> || std::same_as<S, HostSpace>,
                "DistributedDataParallel: the model's tensors are device tensors, but this communicator takes host "
                "memory only (e.g. MpiBackend). Name a host-staging adapter: HostStaging<MpiBackend> staged(mpi) "
                "from <ddp/comm/host_staging.hpp> copies each bucket through host memory; or use NcclBackend.");
  static_assert(CommElement<T>, "DistributedDataParallel: parameters must be float or double");

  DistributedDataParallel(M& model, C& comm, DdpOptions opts = {}, B bucketer = {})
      : model_(&model), comm_(&comm), opts_(opts), bucketer_(std::move(bucketer)) {
    using Arena = nn::ParameterArena<T, S>;
    auto const named = model.named_parameters();
    auto const all = Arena::unique_all(named);
    auto const params = Arena::trainable(named);
    std::vector<detail::ParamSignature> sigs;
    std::vector<std::int64_t> numels;
    for (auto const& p : all) sigs.push_back({p.name, p.var.shape(), !p.var.requires_grad()});
    for (auto const& p : params) numels.push_back(p.var.numel());
    int const world = comm.world_size();
    if (world > 1) detail::verify_parameters_match(comm, sigs);
    // An arena made before wrapping (say, an optimizer's) would keep updating storage the model no longer
    // reads once this wrapper re-packs the parameters. Checked on every rank alike (same model everywhere).
    if (auto const* p = Arena::find_packed(params))
      throw ArgumentError(detail::cat(
          "DistributedDataParallel: parameter '", p->name,
          "' is already packed in a live ParameterArena (an optimizer "
          "built before wrapping the model?). Wrapping re-packs the parameters, so that optimizer would update "
          "orphaned copies. Construct the optimizer after DistributedDataParallel, from ddp.parameters()."));
    BucketPlan plan = bucketer_.plan(numels, sizeof(T));
    if (world > 1) detail::verify_plan_match(comm, plan, bucketer_.name());

    // Each bucket's status words follow its lowest-registered parameter, inside the bucket's slice.
    std::vector<std::int64_t> reserve(params.size(), 0);
    for (auto const& b : plan.buckets)
      if (!b.params.empty()) reserve[b.params.back()] = reducer_t::status_slots(b.params.size(), world);
    // Gradients where the communicator can all-reduce them in place (MpiBackend on one node), if it can.
    typename Arena::GradStorage storage;
    if constexpr (requires(C & c, std::int64_t n) {
                    { c.template gradient_storage<T>(n) } -> std::same_as<Tensor<T, S>>;
                  }) {
      storage = [&comm](std::int64_t n) { return comm.template gradient_storage<T>(n); };
    }
    arena_ = Arena(params, reserve, storage);
    std::vector<std::int64_t> offsets;
    for (auto const& b : plan.buckets)
      offsets.push_back(b.params.empty() ? 0 : arena_.entries()[b.params.front()].offset);

    // Rank 0's parameters (frozen ones too) and buffers everywhere.
    if (world > 1) broadcast_state(0);

    if (opts_.timeline) timeline_.emplace(*opts_.timeline);
    reducer_.emplace(comm, std::move(plan), std::move(offsets), arena_.grads(),
                     ReducerOptions{.observer = timeline_ ? &*timeline_ : nullptr,
                                    .flag_non_finite = opts_.non_finite != NonFinite::kIgnore});
    // One rank without a timeline has nothing to launch early: its hooks only queue finalize (defect 1: only a
    // backward that reaches this model may finish its round), and finalize reads the gradients directly.
    single_ = world == 1 && !timeline_;
    auto* const hook =
        single_ ? &DistributedDataParallel::single_rank_ready : &DistributedDataParallel::ready_trampoline;
    for (std::size_t i = 0; i < arena_.count(); ++i) {
      nodes_.push_back(&arena_.entries()[i].var.node());
      nodes_.back()->leaf_hooks().ready_hook = {.fn = hook, .ctx = this, .index = i};
    }
  }

  DistributedDataParallel(DistributedDataParallel const&) = delete;
  DistributedDataParallel& operator=(DistributedDataParallel const&) = delete;

  ~DistributedDataParallel() {
    reducer_->abandon();
    for (auto const& e : arena_.entries()) e.var.node().leaf_hooks().ready_hook = {};
    cancel_post_backward(this);  // a backward that reached the hooks but has not run its callbacks (same thread)
  }

  // Runs the model; a backward that reaches this model's parameters afterwards synchronises their gradients
  // (unless inside no_sync()).
  V forward(V const& x) {
    bool const opens = grad_enabled() && no_sync_depth_ == 0;  // this forward starts a synchronised round
    if (join_) {
      // Under ddp::join only the forwards that open a round talk to the other ranks (those that ran out of
      // data shadow exactly these): first the round is agreed on, then buffers come from the lowest rank that
      // still has data.
      if (opens) {
        round_ = join_->on_round();
        if (opts_.broadcast_buffers && comm_->world_size() > 1) broadcast_buffers(round_.buffer_root);
      }
    } else if (opts_.broadcast_buffers && comm_->world_size() > 1) {
      broadcast_buffers(0);
    }
    if (grad_enabled()) {
      sync_ = opens;
      if (sync_ && !single_) reducer_->begin();
    }
    if (!timeline_) return model_->forward(x);
    auto const t0 = Timeline::clock::now();
    V y = model_->forward(x);
    timeline_->forward(t0, Timeline::clock::now());
    return y;
  }
  V operator()(V const& x) { return forward(x); }

  // Scope guard: forwards and backwards inside it accumulate gradients locally (no communication); the
  // first synchronised backward after it reduces the accumulated sum. k micro-batches under no_sync plus
  // one outside equal one batch k+1 times as large (for mean losses, scale each by 1/(k+1)).
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

  // Waits for every bucket and applies what the ranks agreed on. Runs automatically at the end of a
  // backward that reached this model's parameters; calling it when no synchronised round is open does nothing.
  //  - A parameter without a gradient on this rank contributes zeros.
  //  - find_unused_parameters: a parameter with a gradient on some rank holds the average; one without a
  //    gradient on every rank keeps no gradient (has_grad() false), so optimizers skip it, as in PyTorch.
  //  - otherwise any missing gradient, on any rank, is a DdpError on every rank naming it and the ranks.
  //  - NonFinite::kRaise / kSkipStep: NaN/Inf in the result raise a DdpError, or drop the step's gradients,
  //    on every rank alike.
  void finalize() {
    if (!sync_) return;
    sync_ = false;
    if (single_) return finalize_single();
    auto const& es = arena_.entries();
    for (std::size_t i = 0; i < es.size(); ++i) {
      if (reducer_->is_ready(i)) continue;
      auto& n = *nodes_[i];
      if (!n.grad_defined) Kernels<S>::fill(es[i].numel, T(0), n.grad.data());  // none this step (nor under no_sync)
      reducer_->mark_ready(i, n.grad_defined);
    }
    apply(reducer_->finalize(), Participation::kActive);
  }

  // Whether the last synchronised step's gradients were dropped as non-finite (NonFinite::kSkipStep), on
  // every rank alike; its parameters are in non_finite_parameters().
  bool step_skipped() const noexcept { return step_skipped_; }
  // Steps dropped as non-finite since construction (the same on every rank).
  std::int64_t skipped_steps() const noexcept { return skipped_steps_; }
  // The parameters whose averaged gradient held NaN/Inf in the last synchronised step (empty when none, or
  // when NonFinite::kIgnore).
  std::vector<std::string> const& non_finite_parameters() const noexcept { return non_finite_; }

  nn::ParameterArena<T, S>& parameters() noexcept { return arena_; }
  BucketPlan const& plan() const noexcept { return reducer_->plan(); }
  M& module() noexcept { return *model_; }
  C& comm() noexcept { return *comm_; }
  DdpOptions const& options() const noexcept { return opts_; }
  // What was composed, for logs.
  std::string describe() const {
    return detail::cat("DistributedDataParallel<", bucketer_.name(), "> over ", comm_->world_size(),
                       " ranks: ", arena_.count(), " parameters (", arena_.parameter_numel(), " elements) in ",
                       reducer_->plan().buckets.size(), " buckets");
  }

 private:
  using reducer_t = BucketReducer<T, S, C>;
  friend struct detail::JoinAccess;

  void broadcast_buffers(int root) {
    std::int64_t i = 0;
    for (auto& b : model_->named_buffers())
      comm_->broadcast(SpaceSpan<T, S>(b.tensor.data(), static_cast<std::size_t>(b.tensor.numel())), root,
                       CollectiveTag{"ddp.buffer", i++});
  }
  // `root`'s parameters (frozen ones too) and buffers on every rank: one broadcast per tensor.
  void broadcast_state(int root) {
    std::int64_t i = 0;
    for (auto const& p : nn::ParameterArena<T, S>::unique_all(model_->named_parameters())) {
      Tensor<T, S> const& v = p.var.node().value;
      comm_->broadcast(SpaceSpan<T, S>(v.data(), static_cast<std::size_t>(v.numel())), root,
                       CollectiveTag{"ddp.param", i++});
    }
    broadcast_buffers(root);
  }

  // Join (join.hpp): while attached, synchronised forwards agree on their round with the hook first.
  void attach_join(detail::JoinHook* hook) noexcept {
    join_ = hook;
    round_ = {};
  }
  // Join: this rank has no batch; it answers the round the others agreed on (buffers from round.buffer_root,
  // then every bucket with zeros) and ends it as they do, errors included.
  void shadow_round(detail::JoinRound round) {
    if (opts_.broadcast_buffers) broadcast_buffers(round.buffer_root);
    round_ = round;
    apply(reducer_->shadow_round(), Participation::kShadow);
  }

  // Ends a round on what every rank agreed: which gradients are defined, the missing-gradient error, the
  // join divisor and the non-finite check.
  void apply(ReduceOutcome const& out, Participation part) {
    auto const& es = arena_.entries();
    ++rounds_;
    bool any_missing = false;
    for (std::size_t i = 0; i < es.size(); ++i) {
      if (out.missing_somewhere[i]) any_missing = true;
      // The slice holds the average (or zeros nobody produced): defined exactly when some rank had a gradient.
      nodes_[i]->grad_defined = out.present_somewhere[i] != 0;
    }
    if (any_missing && !opts_.find_unused_parameters) {
      std::vector<std::int32_t> mine(es.size(), 0);  // a shadowing rank had nothing to miss
      for (std::size_t i = 0; i < es.size(); ++i)
        mine[i] = part == Participation::kActive && !reducer_->had_grad(i) ? 1 : 0;
      raise_unused(mine);
    }
    if (round_.grad_scale != 1.0)
      for (std::size_t i = 0; i < es.size(); ++i)
        Kernels<S>::axpby(es[i].numel, T(round_.grad_scale), nodes_[i]->grad.data(), T(0), nodes_[i]->grad.data());
    if (opts_.non_finite != NonFinite::kIgnore) check_finite(out.non_finite_ranks);
  }

  // The averaged gradients are the same on every rank (and so are the ranks' flags), so every rank finds the
  // same parameters and takes the same decision.
  void check_finite(std::vector<int> ranks) {
    auto const& es = arena_.entries();
    non_finite_.clear();
    step_skipped_ = false;
    for (std::size_t i = 0; i < es.size(); ++i)
      if (nodes_[i]->grad_defined && !detail::all_finite<T, S>(es[i].numel, nodes_[i]->grad.data()))
        non_finite_.push_back(es[i].name);
    if (non_finite_.empty() && ranks.empty()) return;
    if (comm_->world_size() == 1) ranks = {0};       // its own gradients are the "averaged" ones
    for (auto* n : nodes_) n->grad_defined = false;  // optimizers skip parameters without a gradient
    if (opts_.non_finite == NonFinite::kSkipStep) {
      step_skipped_ = true;
      ++skipped_steps_;
      return;
    }
    std::string names, from;
    for (std::size_t k = 0; k < non_finite_.size() && k < 5; ++k) names += (k ? ", '" : "'") + non_finite_[k] + "'";
    if (non_finite_.size() > 5) names += detail::cat(" and ", non_finite_.size() - 5, " more");
    for (std::size_t k = 0; k < ranks.size(); ++k) from += (k ? ", " : "") + std::to_string(ranks[k]);
    throw DdpError(detail::cat(
        "DistributedDataParallel: non-finite gradient (NaN or Inf) after the all-reduce of step ", rounds_,
        non_finite_.empty() ? std::string(" (no parameter holds it after the reduction)") : " in parameter(s) " + names,
        ranks.empty() ? std::string() : "; rank(s) " + from + " had NaN/Inf in their own gradients",
        ". Every rank raises this error. Look for NaN/Inf in those ranks' inputs or loss or lower the learning "
        "rate; or construct with DdpOptions{.non_finite = NonFinite::kSkipStep} to skip such steps on every rank."));
  }

  // Queues finalize for the end of the backward that reached parameter node `n`, once per backward. A leaf's
  // visit_epoch names the backward visiting it, so only the first hook of each backward looks at the queue
  // (which a backward that throws drops: the next one queues again).
  void queue_finalize(Node<T, S> const& n) {
    if (n.visit_epoch == queued_epoch_) return;
    queued_epoch_ = n.visit_epoch;
    if (!post_backward_queued(this)) queue_post_backward(this, [this] { finalize(); });
  }

  // One rank, no timeline: a gradient without a value here is one on every rank. Unused ones keep none
  // (find_unused_parameters; the optimizers skip them) or are the error.
  void finalize_single() {
    auto const& es = arena_.entries();
    ++rounds_;
    std::vector<std::int32_t> missing;
    for (std::size_t i = 0; i < es.size(); ++i) {
      auto& n = *nodes_[i];
      if (n.grad_defined) continue;
      Kernels<S>::fill(es[i].numel, T(0), n.grad.data());
      if (missing.empty()) missing.assign(es.size(), 0);
      missing[i] = 1;
    }
    if (!missing.empty() && !opts_.find_unused_parameters) raise_unused(missing);
    if (opts_.non_finite != NonFinite::kIgnore) check_finite({});
  }

  static void single_rank_ready(void* self, std::size_t, Node<T, S>& n) {
    auto* d = static_cast<DistributedDataParallel*>(self);
    if (d->sync_) d->queue_finalize(n);
  }
  static void ready_trampoline(void* self, std::size_t i, Node<T, S>& n) {
    static_cast<DistributedDataParallel*>(self)->on_grad_ready(i, n);
  }

  // Parameter i's gradient is final in this backward. Only a backward that reaches this model's parameters
  // queues the end-of-step synchronisation, so an unrelated backward on the same thread cannot consume it.
  void on_grad_ready(std::size_t i, Node<T, S>& n) {
    if (!sync_) return;
    queue_finalize(n);
    if (reducer_->is_ready(i)) return;  // a second backward into the same forward's graph (retain_graph)
    bool const has = n.grad_defined;
    if (!has) Kernels<S>::fill(n.value.numel(), T(0), n.grad.data());  // reached, but no gradient flowed into it
    reducer_->mark_ready(i, has);
  }

  // Some rank had a parameter without a gradient: every rank learns which ones, from whom, and throws.
  // `mine[i]`: 1 where this rank had no gradient for parameter i.
  [[noreturn]] void raise_unused(std::vector<std::int32_t> const& mine) {
    auto const& es = arena_.entries();
    int const n = comm_->world_size();
    std::vector<std::int32_t> all(es.size() * static_cast<std::size_t>(n));
    if (n > 1)
      host_all_gather(*comm_, std::span<std::int32_t const>(mine), std::span<std::int32_t>(all),
                      CollectiveTag{"ddp.unused"});
    else
      all = mine;
    std::string names, ranks;
    int shown = 0;
    std::vector<int> rank_hit(static_cast<std::size_t>(n), 0);
    for (std::size_t i = 0; i < es.size(); ++i) {
      bool any = false;
      for (int r = 0; r < n; ++r)
        if (all[static_cast<std::size_t>(r) * es.size() + i]) any = true, rank_hit[static_cast<std::size_t>(r)] = 1;
      if (any && shown++ < 5) names += (names.empty() ? "'" : ", '") + es[i].name + "'";
    }
    for (int r = 0; r < n; ++r)
      if (rank_hit[static_cast<std::size_t>(r)]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    throw DdpError(detail::cat("DistributedDataParallel: parameter(s) ", names, shown > 5 ? " and more" : "",
                               " received no gradient in this backward on rank(s) ", ranks,
                               ". Every parameter must contribute to the loss on every rank, or construct with "
                               "DdpOptions{.find_unused_parameters = true} to treat missing gradients as zero."));
  }

  M* model_;
  C* comm_;
  DdpOptions opts_;
  B bucketer_;
  nn::ParameterArena<T, S> arena_;
  std::optional<TimelineObserver> timeline_;
  std::optional<reducer_t> reducer_;  // built once the arena exists; destroyed first (it waits for its buckets)
  std::vector<Node<T, S>*> nodes_;    // the arena's parameters' nodes (registration order), kept alive by it
  std::uint64_t queued_epoch_ = 0;    // the backward (Node::visit_epoch) that last queued finalize
  bool single_ = false;               // one rank and no timeline: the reducer is not driven (finalize_single)
  bool sync_ = false;                 // a synchronised round is open (forward outside no_sync, not yet finalized)
  int no_sync_depth_ = 0;
  detail::JoinHook* join_ = nullptr;  // a ddp::join running on this rank
  detail::JoinRound round_{};         // what the current round was agreed to be (defaults outside a join)
  std::int64_t rounds_ = 0;           // synchronised rounds ended since construction (for messages)
  std::int64_t skipped_steps_ = 0;
  bool step_skipped_ = false;  // the last round's gradients were dropped as non-finite
  std::vector<std::string> non_finite_;
};

}  // namespace ddp
