// ddp::join: data-parallel training on uneven inputs. A rank whose batches run out keeps answering the other
// ranks' collectives (shadow all-reduces of zeros, as PyTorch's Join) until every rank is done; then every rank
// leaves with the same parameters, buffers and (when given) optimizer state.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "ddp/parallel/replicas.hpp"

namespace ddp {

struct JoinOptions {
  // How a step some ranks sit out divides its summed gradient. true (PyTorch's default): by the world size,
  // as in every other step, so every sample weighs the same however many ranks still train (a joined rank adds
  // zeros). false: by the number of ranks still training, so the step averages over its own samples (parity
  // with training on a smaller world; the last few batches then weigh more).
  bool divide_by_initial_world_size = true;
  // true: no shadowing; the first step at which some rank has run out is a DdpError on every rank, naming
  // the ranks that ran out and their step counts (PyTorch's throw_on_early_termination: for loops with
  // collectives a joined rank cannot shadow, such as SyncBatchNorm's). The same on every rank.
  bool throw_on_early_termination = false;
};

// What a join did; every field but `steps` is the same on every rank.
struct JoinResult {
  std::int64_t steps = 0;   // synchronised steps this rank ran on its own data
  std::int64_t rounds = 0;  // synchronised steps of the whole join: the most any rank ran
  int last_rank = 0;        // a rank that ran all `rounds` steps (the lowest): every rank left with its state
  bool uneven = false;      // some step ran without every rank (and the final state was broadcast)
};

namespace detail {

// How a join appears to the composition rules (composition.hpp).
inline HookTraits join_traits() { return {.name = "ddp::join", .caps = Capability::kAgreesOnRounds}; }

// The per-step agreement. Each synchronised round starts with one all-reduce (kSum) of 2·world int64 words:
// [rank r has a batch this round][steps rank r has run on its own data]; each rank writes only its own
// two words. A rank with a batch calls it from DDP's forward, a joined rank from shadow_rest(), so the two
// meet in the same collective; every rank then knows the same active set and decides alike. Attached to
// the DDP for its lifetime (RAII), so an exception leaves the DDP as it was.
template <class D>
class JoinDriver final : public DdpHook {
 public:
  JoinDriver(D& ddp, JoinOptions const& opts)
      : ddp_(&ddp),
        opts_(opts),
        world_(ddp.comm().world_size()),
        rank_(ddp.comm().rank()),
        words_(2 * static_cast<std::size_t>(world_)),
        attachment_(ddp.attach(*this)) {}
  JoinDriver(JoinDriver const&) = delete;
  JoinDriver& operator=(JoinDriver const&) = delete;
  ~JoinDriver() = default;

  HookTraits traits() const override { return join_traits(); }
  JoinRound on_round() override { return agree(Batch::kHas); }

  // This rank has no batches left: answers the others' rounds until no rank has any.
  void shadow_rest() {
    for (;;) {
      JoinRound const r = agree(Batch::kNone);
      if (active_ == 0) return;
      ddp_->shadow_round(attachment_, r);
    }
  }

  JoinResult result() const { return {.steps = steps_, .rounds = rounds_, .last_rank = last_rank_, .uneven = uneven_}; }

 private:
  // Whether this rank brings a batch to the round.
  enum class Batch { kHas, kNone };

  JoinRound agree(Batch batch) {
    bool const has_batch = batch == Batch::kHas;
    std::fill(words_.begin(), words_.end(), std::int64_t{0});
    words_[static_cast<std::size_t>(rank_)] = has_batch ? 1 : 0;
    words_[static_cast<std::size_t>(world_ + rank_)] = steps_;
    if (world_ > 1)
      host_all_reduce(ddp_->comm(), std::span<std::int64_t>(words_), ReduceOp::kSum,
                      CollectiveTag{"ddp.join", rounds_});
    active_ = 0;
    int lowest = -1;
    for (int r = 0; r < world_; ++r)
      if (words_[static_cast<std::size_t>(r)]) {
        ++active_;
        if (lowest < 0) lowest = r;
      }
    if (active_ == 0) return {};
    if (active_ < world_) {
      uneven_ = true;
      if (opts_.throw_on_early_termination) throw DdpError(early_termination());
    }
    ++rounds_;
    if (has_batch) ++steps_;
    last_rank_ = lowest;
    return {.buffer_root = lowest,
            .grad_scale = opts_.divide_by_initial_world_size ? 1.0 : double(world_) / double(active_)};
  }

  // Built from the reduced words alone, so every rank raises the same message.
  std::string early_termination() const {
    std::string out, in;
    for (int r = 0; r < world_; ++r) {
      std::int64_t const s = words_[static_cast<std::size_t>(world_ + r)];
      if (words_[static_cast<std::size_t>(r)])
        in += cat(in.empty() ? "" : ", ", r);
      else
        out += cat(out.empty() ? "" : ", ", "rank ", r, " after ", s, s == 1 ? " step" : " steps");
    }
    return cat("ddp::join: uneven inputs: ", out, " ran out of data while rank(s) ", in, " still have batches (step ",
               rounds_,
               "). JoinOptions::throw_on_early_termination is set, so every rank raises this error instead "
               "of shadowing the others' steps; unset it to let finished ranks shadow them.");
  }

  D* ddp_;
  JoinOptions opts_;
  int world_, rank_;
  std::vector<std::int64_t> words_;
  int active_ = 0;
  std::int64_t steps_ = 0, rounds_ = 0;
  int last_rank_ = 0;
  bool uneven_ = false;
  Attachment attachment_;  // last: attached once the rest is ready
};

// root's optimizer state (learning rate, step counts, state buffers) on every rank. Every rank must hold the
// same kind of optimizer over the same parameters: checked first (one all-gather), the same error everywhere.
template <Communicator C, optim::Optimizer O>
void broadcast_optimizer_state(C& comm, O& opt, int root) {
  using T = typename O::value_type;
  auto st = opt.state();
  std::int64_t values = 0;
  for (auto const& p : st.parameters)
    for (auto const& b : p.buffers) values += static_cast<std::int64_t>(b.size());
  std::vector<std::int64_t> const mine{static_cast<std::int64_t>(st.parameters.size()),
                                       static_cast<std::int64_t>(st.buffer_names.size()), values};
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(comm.world_size()));
  host_all_gather(comm, std::span<std::int64_t const>(mine), std::span<std::int64_t>(all),
                  CollectiveTag{"ddp.join.optimizer_layout"});
  auto const at = [&](int r, int k) { return all[3 * static_cast<std::size_t>(r) + static_cast<std::size_t>(k)]; };
  for (int r = 0; r < comm.world_size(); ++r)
    if (at(r, 0) != at(root, 0) || at(r, 1) != at(root, 1) || at(r, 2) != at(root, 2))
      throw DdpError(cat("ddp::join: rank ", r, "'s optimizer holds ", at(r, 0), " parameters, ", at(r, 1),
                         " state buffers and ", at(r, 2), " values, rank ", root, "'s ", at(root, 0), ", ", at(root, 1),
                         " and ", at(root, 2),
                         ". Every rank must pass the same kind of optimizer, with the same options, to ddp::join."));
  std::vector<double> lr{st.lr};
  host_broadcast(comm, std::span<double>(lr), root, CollectiveTag{"ddp.join.lr"});
  std::vector<std::int64_t> steps;
  std::vector<T> flat;
  flat.reserve(static_cast<std::size_t>(values));
  for (auto const& p : st.parameters) {
    steps.push_back(p.steps);
    for (auto const& b : p.buffers) flat.insert(flat.end(), b.begin(), b.end());
  }
  host_broadcast(comm, std::span<std::int64_t>(steps), root, CollectiveTag{"ddp.join.steps"});
  host_broadcast(comm, std::span<T>(flat), root, CollectiveTag{"ddp.join.optimizer_state"});
  st.lr = lr[0];
  auto it = flat.begin();
  for (std::size_t i = 0; i < st.parameters.size(); ++i) {
    st.parameters[i].steps = steps[i];
    for (auto& b : st.parameters[i].buffers) {
      std::copy(it, it + static_cast<std::ptrdiff_t>(b.size()), b.begin());
      it += static_cast<std::ptrdiff_t>(b.size());
    }
  }
  opt.load_state(st);
}

}  // namespace detail

// Runs `body` (this rank's training loop: forward, backward, optimizer step per batch) inside a join over
// `ddp`, on every rank; ranks may run different numbers of synchronised steps. Collective.
//  - Each synchronised step (a DDP forward outside no_sync with autograd on, then its backward) first agrees,
//    with one small all-reduce, on which ranks still have a batch; buffers then come from the lowest of them.
//  - Once `body` returns, this rank has joined: for every step the others still run it answers their
//    collectives (buffer broadcast, each bucket's all-reduce with zero gradients and status words saying
//    "nothing here"), so their averaged gradient is the sum over the ranks still training divided as
//    JoinOptions says (by the world size by default, as PyTorch). A joined rank runs no forward, backward or
//    optimizer step; errors the round raises (a missing gradient, NaN) it raises too.
//  - When every rank has joined, if some step ran without every rank, the parameters (frozen ones too),
//    buffers and the optimizers' state (learning rate, step counts, momentum...) of result.last_rank, which
//    ran every step, are broadcast to every rank: all leave identical.
// Inside a join, each synchronised forward must be followed by its backward (the joined ranks shadow a whole
// round), and forwards that open no round (under no_sync or without autograd) do not broadcast buffers.
// Collectives of your own inside `body` cannot be shadowed: use throw_on_early_termination for such loops.
// Per-step cost: one all-reduce of 2·world_size words; nothing when no join runs. One join at a time per DDP.
//
//   auto r = ddp::join(ddp, opt, [&] {
//     for (auto const& b : loader) { opt.zero_grad(); backward(loss(ddp(Var(b.x)), b.y)); opt.step(); }
//   });
//
// Without an optimizer: parameters and buffers are made identical at the end, optimizer state is not (as with
// PyTorch's DDP.join); an optimizer with state (momentum, Adam) would then differ across ranks: pass it.
template <nn::Model M, AsyncCommunicator C, GradientBucketer B, ReductionPolicy R, BatchingPolicy Bt,
          std::invocable Body>
JoinResult join(DistributedDataParallel<M, C, B, R, Bt>& ddp, Body&& body, JoinOptions const& opts = {}) {
  static_assert(!R::world_size_invariant,
                "ddp::join: a finished rank cannot shadow an exact (deterministic) reduction, which needs every rank's "
                "micro-batches; deterministic mode gives every rank the same number of batches (GlobalBatchSampler), "
                "so it needs no join");
  using D = DistributedDataParallel<M, C, B, R, Bt>;
  JoinResult r;
  {
    detail::JoinDriver<D> driver(ddp, opts);
    std::invoke(body);
    driver.shadow_rest();
    r = driver.result();
  }
  if (r.uneven) detail::broadcast_state(ddp.comm(), ddp.module(), r.last_rank);
  return r;
}

// The same, and `optimizer`'s state also follows the last rank at the end, so training can go on in step.
template <nn::Model M, AsyncCommunicator C, GradientBucketer B, ReductionPolicy R, BatchingPolicy Bt,
          optim::Optimizer O, std::invocable Body>
JoinResult join(DistributedDataParallel<M, C, B, R, Bt>& ddp, O& optimizer, Body&& body, JoinOptions const& opts = {}) {
  if constexpr (requires { optimizer.traits(); }) {  // ZeroRedundancyOptimizer: its slices cannot follow one rank
    HookTraits const opt = optimizer.traits(), joining = detail::join_traits();
    check_composition({.ddp = ddp.composition(), .attached = std::span(&opt, 1), .attaching = &joining});
  }
  JoinResult const r = join(ddp, std::forward<Body>(body), opts);
  if (r.uneven) detail::broadcast_optimizer_state(ddp.comm(), optimizer, r.last_rank);
  return r;
}

}  // namespace ddp
