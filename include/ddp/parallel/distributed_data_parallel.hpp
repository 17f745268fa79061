// DistributedDataParallel<Model, Comm, Bucketer>: verifies and broadcasts the model, then averages
// gradients across ranks with bucketed async all-reduces that overlap backward.
#pragma once

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/autograd/backward.hpp"
#include "ddp/bucket/plan.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/parallel/verify.hpp"
#include "ddp/trace/timeline.hpp"

namespace ddp {

struct DdpOptions {
  // Broadcast buffers (e.g. BatchNorm running statistics) from rank 0 before each forward, as PyTorch.
  bool broadcast_buffers = true;
  // false: a parameter that got no gradient in a synchronised backward is an error on every rank, naming
  // it. true: its gradient counts as zero (PyTorch's find_unused_parameters=True).
  bool find_unused_parameters = false;
  // When set, forward, backward and each bucket's all-reduce (launch to observed completion) are recorded.
  Timeline* timeline = nullptr;
};

// Wraps a model whose replicas live on the ranks of `comm`. Guarantees:
//  - construction checks that every rank has the same parameters (names, shapes) and bucket plan, then
//    copies rank 0's parameters and buffers to every rank (one broadcast per tensor);
//  - after each backward that followed a forward through this wrapper (outside no_sync), every rank
//    holds the average of the ranks' gradients: buckets are reduced in plan order as soon as they are
//    complete, asynchronously, overlapping the rest of backward (the last bucket, complete only when
//    backward is done, is reduced on the calling thread), and backward returns once all are done;
//  - gradients live in the arena's bucket slices: nothing is copied into or out of a comm buffer;
//  - the 1/world_size factor is part of the reduction (ReduceOp::kAvg);
//  - results are bitwise identical on all ranks when the backend's all-reduce is (threads, MPI).
// Use parameters() for the optimizer. Not copyable or movable (the hooks point at it). One thread per rank.
template <nn::Model M, AsyncCommunicator C, GradientBucketer B = SizeCapped>
class DistributedDataParallel {
 public:
  using value_type = typename M::value_type;
  using space = typename M::space;
  using T = value_type;
  using S = space;
  using V = Variable<T, S>;

  static_assert(C::accepted_spaces::template contains<S>,
                "DistributedDataParallel: the model's tensors live in a memory space this communicator does not "
                "accept (e.g. host Eigen tensors with NcclBackend, which takes device memory only). Use "
                "ThreadsBackend or MpiBackend for host models, or device tensors with NcclBackend.");
  static_assert(C::accepted_spaces::template contains<HostSpace>,
                "DistributedDataParallel exchanges parameter metadata in host memory; this backend needs a host "
                "staging path first");
  static_assert(CommElement<T>, "DistributedDataParallel: parameters must be float or double");

  // Status words after each bucket's gradients, reduced with them: [0] fraction of ranks on which some
  // parameter of the bucket got no gradient, [1] bucket id + 1 (a fingerprint: all ranks reduce the
  // same bucket in the same call).
  static constexpr std::int64_t kStatusSlots = 2;

  DistributedDataParallel(M& model, C& comm, DdpOptions opts = {}, B bucketer = {})
      : model_(&model), comm_(&comm), opts_(opts), bucketer_(std::move(bucketer)) {
    auto params = nn::ParameterArena<T, S>::unique(model.named_parameters());
    std::vector<detail::ParamSignature> sigs;
    std::vector<std::int64_t> numels;
    for (auto const& p : params) {
      sigs.push_back({p.name, p.var.shape()});
      numels.push_back(p.var.numel());
    }
    if (comm.world_size() > 1) detail::verify_parameters_match(comm, sigs);
    plan_ = bucketer_.plan(numels, sizeof(T));
    if (comm.world_size() > 1) detail::verify_plan_match(comm, plan_, bucketer_.name());

    // The bucket's last slot in the arena follows its lowest-registered parameter.
    std::vector<std::int64_t> reserve(params.size(), 0);
    for (auto const& b : plan_.buckets)
      if (!b.params.empty()) reserve[b.params.back()] = kStatusSlots;
    arena_ = nn::ParameterArena<T, S>(params, reserve);
    for (auto const& b : plan_.buckets) {
      std::int64_t const off = b.params.empty() ? 0 : arena_.entries()[b.params.front()].offset;
      slices_.push_back({off, b.numel + kStatusSlots});
    }

    // Rank 0's parameters and buffers everywhere.
    if (comm.world_size() > 1) {
      auto const& es = arena_.entries();
      for (std::size_t i = 0; i < es.size(); ++i)
        comm.broadcast(SpaceSpan<T, S>(arena_.values().data() + es[i].offset, static_cast<std::size_t>(es[i].numel)), 0,
                       CollectiveTag{"ddp.param", static_cast<std::int64_t>(i)});
      broadcast_buffers();
    }

    single_ = comm.world_size() == 1 && opts_.timeline == nullptr;
    std::size_t const np = arena_.count(), nb = plan_.buckets.size();
    ready_.assign(np, 0);
    unused_.assign(np, 0);
    pending_.assign(nb, 0);
    missing_.assign(nb, 0);
    works_.resize(nb);
    launched_at_.resize(nb);
    bucket_done_.assign(nb, 0);
    // With one rank there is nothing to overlap: finalize() alone marks every gradient ready (and finds
    // unused parameters), so the per-parameter hooks are only installed when they can launch work early.
    if (comm.world_size() > 1 || opts_.timeline)
      for (std::size_t i = 0; i < np; ++i)
        arena_.entries()[i].var.node().grad_hook = [this, i](Node<T, S>&) { on_grad_ready(i); };
  }

  DistributedDataParallel(DistributedDataParallel const&) = delete;
  DistributedDataParallel& operator=(DistributedDataParallel const&) = delete;

  ~DistributedDataParallel() {
    for (auto& w : works_)
      if (w) try {
          w->wait();
        } catch (...) {
        }
    for (auto const& e : arena_.entries()) e.var.node().grad_hook = nullptr;
    cancel_post_backward(this);  // a forward without its backward (same thread)
  }

  // Runs the model; records whether the coming backward synchronises (not inside no_sync()).
  V forward(V const& x) {
    if (opts_.broadcast_buffers && comm_->world_size() > 1) broadcast_buffers();
    if (grad_enabled()) {
      if (single_) {
        sync_ = no_sync_depth_ == 0;  // one rank: nothing to reduce, finalize() only checks for unused ones
      } else {
        prepare(no_sync_depth_ == 0);
      }
      // Once per backward (two forwards may feed one loss). The queue is checked rather than a flag: a
      // backward that throws drops its callbacks.
      if (!post_backward_queued(this)) queue_post_backward(this, [this] { finalize(); });  // no allocation
    }
    if (!opts_.timeline) return model_->forward(x);
    auto const t0 = Timeline::clock::now();
    V y = model_->forward(x);
    backward_start_ = Timeline::clock::now();
    opts_.timeline->add("forward", "step", t0, backward_start_);
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

  // Waits for every bucket and checks the status words. Called automatically at the end of backward.
  void finalize() {
    if (!sync_) return;
    sync_ = false;
    if (single_) {
      finalize_single();
      return;
    }
    auto const& es = arena_.entries();
    bool local_missing = false;
    for (std::size_t i = 0; i < es.size(); ++i) {
      if (ready_[i]) continue;
      auto& n = es[i].var.node();
      if (!n.grad_defined) {  // no gradient this step (nor accumulated under no_sync): zero, and maybe an error
        Kernels<S>::fill(es[i].numel, T(0), n.grad.data());
        n.grad_defined = true;
        if (!opts_.find_unused_parameters) {
          unused_[i] = 1;
          missing_[plan_.bucket_of[i]] = 1;
          local_missing = true;
        }
      }
      mark_ready(i);
    }
    Timeline::clock::time_point t_wait{};
    if (opts_.timeline) {
      t_wait = Timeline::clock::now();
      opts_.timeline->add("backward", "step", backward_start_, t_wait);
    }
    wait_all();
    if (opts_.timeline) opts_.timeline->add("wait for all-reduce", "step", t_wait, Timeline::clock::now());
    bool any_missing = local_missing;
    for (std::size_t b = 0; b < slices_.size(); ++b) {
      T const* st = arena_.grads().data() + slices_[b].offset + slices_[b].numel - kStatusSlots;
      if (st[0] > T(0)) any_missing = true;
      if (std::abs(double(st[1]) - double(b + 1)) > 0.25)
        throw DdpError(detail::cat("DistributedDataParallel: bucket ", b, " was reduced against a different bucket on "
                                   "another rank (fingerprint ", double(st[1]), "); ranks issued collectives in different orders"));
    }
    if (any_missing) raise_unused();
  }

  nn::ParameterArena<T, S>& parameters() noexcept { return arena_; }
  BucketPlan const& plan() const noexcept { return plan_; }
  M& module() noexcept { return *model_; }
  C& comm() noexcept { return *comm_; }
  DdpOptions const& options() const noexcept { return opts_; }
  // What was composed, for logs.
  std::string describe() const {
    return detail::cat("DistributedDataParallel<", bucketer_.name(), "> over ", comm_->world_size(), " ranks: ",
                       arena_.count(), " parameters (", arena_.parameter_numel(), " elements) in ", plan_.buckets.size(),
                       " buckets");
  }

 private:
  struct Slice {
    std::int64_t offset, numel;  // numel includes the status slots
  };

  void broadcast_buffers() {
    std::int64_t i = 0;
    for (auto& b : model_->named_buffers())
      comm_->broadcast(SpaceSpan<T, S>(b.tensor.data(), static_cast<std::size_t>(b.tensor.numel())), 0,
                       CollectiveTag{"ddp.buffer", i++});
  }

  void prepare(bool sync) {
    if (sync_) {
      // The previous synchronised step never finished (no backward yet, or one that threw): let anything
      // it launched complete before its buffers are reused, then start over.
      for (auto& w : works_) {
        if (!w) continue;
        try {
          w->wait();
        } catch (...) {  // the failure was or will be reported by the collective that raised it
        }
        w.reset();
      }
    }
    sync_ = sync;
    if (!sync) return;
    std::fill(ready_.begin(), ready_.end(), 0);
    std::fill(unused_.begin(), unused_.end(), 0);
    std::fill(missing_.begin(), missing_.end(), 0);
    for (std::size_t b = 0; b < plan_.buckets.size(); ++b) pending_[b] = static_cast<std::int64_t>(plan_.buckets[b].params.size());
    next_launch_ = 0;
  }

  void on_grad_ready(std::size_t i) {
    if (!sync_ || ready_[i]) return;
    if (opts_.timeline) poll_buckets();
    mark_ready(i);
  }

  // One rank, no timeline: no buckets to launch or wait for; only gradients nobody produced matter.
  void finalize_single() {
    auto const& es = arena_.entries();
    bool missing = false;
    for (std::size_t i = 0; i < es.size(); ++i) {
      auto& n = es[i].var.node();
      if (n.grad_defined) continue;
      Kernels<S>::fill(es[i].numel, T(0), n.grad.data());
      n.grad_defined = true;
      if (opts_.find_unused_parameters) continue;
      if (!missing) std::fill(unused_.begin(), unused_.end(), 0);
      unused_[i] = 1;
      missing = true;
    }
    if (missing) raise_unused();
  }

  // Waits for every launched bucket in order; rethrows the first failure after all have finished.
  void wait_all() {
    std::exception_ptr err;
    for (std::size_t b = 0; b < works_.size(); ++b) {
      auto& w = works_[b];
      if (!w) continue;
      try {
        w->wait();
      } catch (...) {
        if (!err) err = std::current_exception();
      }
      if (opts_.timeline) record_bucket(b);
      w.reset();
    }
    if (err) std::rethrow_exception(err);
  }

  // Timeline only: a bucket's span ends when its completion is first observed (here or in finalize).
  void poll_buckets() {
    for (std::size_t b = 0; b < next_launch_; ++b)
      if (works_[b] && !bucket_done_[b] && works_[b]->test()) record_bucket(b);
  }
  void record_bucket(std::size_t b) {
    if (bucket_done_[b]) return;
    bucket_done_[b] = 1;
    opts_.timeline->add(detail::cat("all_reduce bucket ", b), "comm", launched_at_[b], Timeline::clock::now(),
                        Timeline::kComm);
  }

  void mark_ready(std::size_t i) {
    ready_[i] = 1;
    if (--pending_[plan_.bucket_of[i]] != 0) return;
    while (next_launch_ < plan_.buckets.size() && pending_[next_launch_] == 0) launch(next_launch_++);
  }

  void launch(std::size_t b) {
    T* slice = arena_.grads().data() + slices_[b].offset;
    T* st = slice + slices_[b].numel - kStatusSlots;
    st[0] = missing_[b] ? T(1) : T(0);
    st[1] = T(b + 1);
    if (comm_->world_size() == 1) return;
    if (opts_.timeline) {
      launched_at_[b] = Timeline::clock::now();
      bucket_done_[b] = 0;
    }
    SpaceSpan<T, S> const span(slice, static_cast<std::size_t>(slices_[b].numel));
    CollectiveTag const tag{"bucket", static_cast<std::int64_t>(b)};
    if (b + 1 == slices_.size()) {
      // The last bucket completes when backward is (all but) over: nothing is left to overlap with, so it
      // is reduced on this thread, saving the hand-off to the progress thread and back. Issue order is
      // kept: the earlier buckets finish first.
      wait_all();
      comm_->all_reduce(span, ReduceOp::kAvg, tag);
      if (opts_.timeline) {
        bucket_done_[b] = 1;
        opts_.timeline->add(detail::cat("all_reduce bucket ", b), "comm", launched_at_[b], Timeline::clock::now(),
                            Timeline::kComm);
      }
      return;
    }
    works_[b].emplace(comm_->all_reduce_async(SpaceSpan<T, S>(slice, static_cast<std::size_t>(slices_[b].numel)),
                                              ReduceOp::kAvg, CollectiveTag{"bucket", static_cast<std::int64_t>(b)}));
  }

  // Some rank had a parameter without a gradient: every rank learns which ones, from whom, and throws.
  [[noreturn]] void raise_unused() {
    auto const& es = arena_.entries();
    int const n = comm_->world_size();
    std::vector<std::int32_t> mine(es.size(), 0), all(es.size() * static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < es.size(); ++i) mine[i] = unused_[i];
    if (n > 1) comm_->all_gather(mine, all, CollectiveTag{"ddp.unused"});
    else all = mine;
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
  BucketPlan plan_;
  nn::ParameterArena<T, S> arena_;
  std::vector<Slice> slices_;
  std::vector<char> ready_, missing_, unused_;  // per parameter, per bucket, per parameter
  std::vector<std::int64_t> pending_;
  using work_t = decltype(std::declval<C&>().all_reduce_async(std::declval<SpaceSpan<T, S>>(), ReduceOp::kAvg,
                                                               CollectiveTag{}));
  std::vector<std::optional<work_t>> works_;
  std::vector<Timeline::clock::time_point> launched_at_;
  std::vector<char> bucket_done_;
  Timeline::clock::time_point backward_start_{};
  std::size_t next_launch_ = 0;
  bool sync_ = false;
  bool single_ = false;  // world size 1 without a timeline: the direct path (no buckets in flight)
  int no_sync_depth_ = 0;
};

}  // namespace ddp
