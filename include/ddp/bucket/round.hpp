// Round: what a finished synchronised round means for a model's gradients, written once for every reduction
// policy. A round is one step's forward/backward passes on this rank (one per micro-batch) and the reduction
// after the last; at its end the round stage zero-fills what no backward wrote, applies what the ranks agreed on
// (which gradients exist, the unused-parameter error, the join divisor, the micro-batch mean) and the
// non-finite policy. It also counts rounds and skipped steps.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ddp/bucket/outcome.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

struct RoundOptions {
  // false: a parameter that got no gradient in a round, on any rank, is an error on every rank naming it and the
  // ranks. true (PyTorch's find_unused_parameters=True): a rank without its gradient contributes zeros; a
  // parameter unused on every rank keeps no gradient, and optimizers skip it.
  bool find_unused_parameters = false;
  NonFinite non_finite = NonFinite::kIgnore;
};

// How a round ends: the step it belongs to (for messages) and the factor on the reduced gradients (1, or a join
// round's world / active ranks, times 1 / micro-batches per rank for a sum of micro-batch gradients).
struct RoundEnd {
  Participation part = Participation::kActive;
  double grad_scale = 1.0;
  std::int64_t step = -1;  // the training step (MicroBatch::key); -1: count rounds instead
};

// One model's rounds on one rank. Thread safety: the rank's thread only.
template <class T, MemorySpace S, Communicator C>
class Round {
 public:
  Round(C& comm, nn::ParameterArena<T, S>& arena, RoundOptions opts) : comm_(&comm), arena_(&arena), opts_(opts) {}

  RoundOptions const& options() const noexcept { return opts_; }

  // Parameter i's gradient is final for this micro-batch: zeros where no backward wrote one. Returns whether
  // this rank had a gradient. The one place a missing gradient becomes zeros.
  bool fill_missing(std::size_t i) { return arena_->fill_missing_grad(i); }

  // A bucket's parameters are final before the round ends (an optimizer updates them now): their has_grad()
  // as the ranks agreed. Returns false, changing nothing, where end() will raise for one of them (a gradient
  // missing on some rank without find_unused_parameters).
  bool land(std::vector<std::size_t> const& params, ReduceOutcome const& out) {
    for (auto const i : params)
      if (out.missing_somewhere[i] && !opts_.find_unused_parameters) return false;
    for (auto const i : params) arena_->set_has_grad(i, out.present_somewhere[i] != 0);
    return true;
  }

  // Applies what every rank agreed on. `had_grad(i)`: whether this rank had parameter i's gradient.
  template <class HadGrad>
  void end(ReduceOutcome const& out, RoundEnd const& how, HadGrad&& had_grad) {
    std::size_t const np = arena_->count();
    ++rounds_;
    bool any_missing = false;
    for (std::size_t i = 0; i < np; ++i) {
      if (out.missing_somewhere[i]) any_missing = true;
      // The slice holds the reduction (or zeros nobody produced): defined exactly when some rank had a gradient.
      arena_->set_has_grad(i, out.present_somewhere[i] != 0);
    }
    if (any_missing && !opts_.find_unused_parameters) {
      std::vector<std::int32_t> mine(np, 0);  // a shadowing rank had nothing to miss
      for (std::size_t i = 0; i < np; ++i) mine[i] = how.part == Participation::kActive && !had_grad(i) ? 1 : 0;
      raise_unused(mine);
    }
    if (out.reduced && how.grad_scale != 1.0)
      for (std::size_t i = 0; i < np; ++i) {
        auto const& e = arena_->entries()[i];
        T* g = arena_->grads().data() + e.offset;
        Kernels<S>::axpby(e.numel, T(how.grad_scale), g, T(0), g);
      }
    step_skipped_ = false;
    non_finite_.clear();
    if (opts_.non_finite == NonFinite::kIgnore && out.reduced) return;
    for (std::size_t i = 0; i < np; ++i) {
      if (!out.present_somewhere[i]) continue;
      auto const& e = arena_->entries()[i];
      bool const bad = out.non_finite.empty() ? !detail::all_finite<T, S>(e.numel, arena_->grads().data() + e.offset)
                                              : out.non_finite[i] != 0;
      if (bad) non_finite_.push_back(e.name);
    }
    std::vector<int> ranks = out.non_finite_ranks;
    if (non_finite_.empty() && ranks.empty()) return;
    if (comm_->world_size() == 1) ranks = {0};                            // its own gradients are the "reduced" ones
    for (std::size_t i = 0; i < np; ++i) arena_->set_has_grad(i, false);  // optimizers skip them
    if (opts_.non_finite == NonFinite::kSkipStep) {
      step_skipped_ = true;
      ++skipped_steps_;
      return;
    }
    raise_non_finite(out.reduced, how.step, ranks);
  }

  std::int64_t rounds() const noexcept { return rounds_; }
  bool step_skipped() const noexcept { return step_skipped_; }
  // A step without a round (a local step: parallel/local_sgd.hpp) skips nothing.
  void local_step() noexcept { step_skipped_ = false; }
  std::int64_t skipped_steps() const noexcept { return skipped_steps_; }
  std::vector<std::string> const& non_finite_parameters() const noexcept { return non_finite_; }

 private:
  // The names in the reduced result are the same on every rank, so every rank throws the same message.
  [[noreturn]] void raise_non_finite(bool reduced, std::int64_t step, std::vector<int> const& ranks) const {
    std::string names, from;
    for (std::size_t k = 0; k < non_finite_.size() && k < 5; ++k) names += (k ? ", '" : "'") + non_finite_[k] + "'";
    if (non_finite_.size() > 5) names += detail::cat(" and ", non_finite_.size() - 5, " more");
    for (std::size_t k = 0; k < ranks.size(); ++k) from += (k ? ", " : "") + std::to_string(ranks[k]);
    std::string const fix =
        " Look for NaN/Inf in those ranks' inputs or loss or lower the learning rate; or construct with "
        "DdpOptions{.non_finite = NonFinite::kSkipStep} to skip such steps on every rank.";
    if (!reduced)  // an exact sum cannot carry them: say where they were, before any reduction
      throw DdpError(detail::cat("DistributedDataParallel: non-finite gradients (NaN or Inf) at step ",
                                 step < 0 ? rounds_ : step, " in parameter", non_finite_.size() == 1 ? " " : "s ",
                                 names,
                                 " (on some rank), which deterministic mode cannot sum exactly. Every rank "
                                 "raises this error.",
                                 fix));
    throw DdpError(detail::cat(
        "DistributedDataParallel: non-finite gradient (NaN or Inf) after the all-reduce of step ", rounds_,
        non_finite_.empty() ? std::string(" (no parameter holds it after the reduction)") : " in parameter(s) " + names,
        ranks.empty() ? std::string() : "; rank(s) " + from + " had NaN/Inf in their own gradients",
        ". Every rank raises this error.", fix));
  }

  // Some rank had a parameter without a gradient: every rank learns which ones, from whom, and throws.
  // `mine[i]`: 1 where this rank had no gradient for parameter i.
  [[noreturn]] void raise_unused(std::vector<std::int32_t> const& mine) {
    auto const& es = arena_->entries();
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

  C* comm_;
  nn::ParameterArena<T, S>* arena_;
  RoundOptions opts_;
  std::int64_t rounds_ = 0;  // rounds ended since construction (for messages)
  std::int64_t skipped_steps_ = 0;
  bool step_skipped_ = false;  // the last round's gradients were dropped as non-finite
  std::vector<std::string> non_finite_;
};

}  // namespace ddp
