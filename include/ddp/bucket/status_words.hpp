// The status words BucketReducer sends after each bucket's gradients, in the same all-reduce (kAvg): their layout,
// how a rank writes them, how it reads them back after the reduction, and static_graph's freeze that keeps them on
// the device. Kept apart from the readiness and launch driver (reducer.hpp), which only says where a bucket's
// words go and when.
//
// Per bucket with P parameters on N ranks: [P "missing here" flags][P "present here" flags][N rank slots]. A rank
// writes 1 in its flags where they hold and, in rank slot r = its own rank, the bucket's id + 1 (negated when
// ReducerOptions::non_finite asks for checks and its own gradients in the bucket hold a NaN or Inf); every other
// rank slot is 0. A shadowing rank (Participation::kShadow) sets no flag. After the average a flag word is zero
// exactly when it was zero on every rank (a sum of non-negative numbers, scaled by 1/N), and each rank slot holds one
// rank's id / N, which ×N recovers exactly: so the fingerprint check is exact for any world size and names the
// ranks that reduced something else. The words travel in the wire's value_type (bucket/transport.hpp), so ids are
// taken modulo status_id_modulus<V> (a 16-bit wire holds 256 or 2048 distinct integers; BucketReducer refuses plans
// with more buckets).
//
// On one rank nothing travels and there is nobody to disagree with: write() puts the rank's own flags straight into
// the outcome, and read() has nothing to read.
//
// Static graph (ReducerOptions::static_graph), on device tensors: after the first round this rank completes actively
// without an error, the outcome is kept and the words stop crossing to the host. Each bucket's words, as this rank
// sends them, are uploaded once and copied on the device at launch; after the reduction a device kernel checks the
// rank slots and reports a mismatch at the next host read (device_errors.hpp), and at the latest every
// ReducerOptions::static_graph_check_every rounds, when the host reads one word back. A rank whose gradients change
// sends 0 in its slot, so every rank reports it. Non-finite checks need the flags on the host each round and keep
// the host path; so do shadow rounds. Host tensors read their words in place (a memcpy) and never freeze.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/bucket/outcome.hpp"
#include "ddp/bucket/plan.hpp"
#include "ddp/bucket/wire.hpp"
#include "ddp/error.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::detail {

// Status-word bucket ids travelling in V are stored modulo this: every id in range is exact in V.
template <class V>
constexpr std::int64_t status_id_modulus() noexcept {
  if constexpr (requires { V::exact_integers; })
    return V::exact_integers;
  else
    return std::int64_t{1} << 20;
}

template <class T, MemorySpace S>
class BucketStatusWords {
 public:
  // Words stored after a bucket of `params` parameters, on `world` ranks.
  static constexpr std::int64_t slots(std::size_t params, int world) noexcept {
    return 2 * static_cast<std::int64_t>(params) + world;
  }

  // Over `plan` (which must outlive this), on rank `rank` of `world`, with ids modulo `id_modulus`.
  BucketStatusWords(BucketPlan const& plan, int world, int rank, std::int64_t id_modulus, ReducerOptions const& opts)
      : plan_(&plan),
        world_(world),
        rank_(rank),
        id_modulus_(id_modulus),
        flag_non_finite_(opts.non_finite != NonFinite::kIgnore),
        static_graph_(opts.static_graph),
        check_every_(opts.static_graph_check_every),
        non_finite_here_(static_cast<std::size_t>(world), 0) {
    std::size_t widest = 0;
    for (auto const& b : plan.buckets) widest = std::max(widest, b.params.size());
    staging_.assign(static_cast<std::size_t>(slots(widest, world)), T(0));
  }

  // Bucket b's id in its words (exact in the wire's type).
  std::int64_t id(std::size_t b) const noexcept { return static_cast<std::int64_t>(b) % id_modulus_ + 1; }

  // Writes bucket b's words at `tail` (right after its `grads`), for a round this rank takes part in as `part`,
  // from this rank's per-parameter `has_grad` flags: the frozen words once static_graph has frozen them (with 0 in
  // this rank's slot if its flags changed), else encoded on the host and uploaded (with the id negated when the
  // non-finite check finds a NaN or Inf in `grads`). On one rank: the flags into `outcome` instead.
  void write(std::size_t b, Participation part, std::vector<char> const& has_grad, T const* grads, T* tail,
             ReduceOutcome& outcome) {
    auto const& bucket = plan_->buckets[b];
    bool const active = part == Participation::kActive;
    if (world_ == 1) {
      for (auto const i : bucket.params) {
        outcome.missing_somewhere[i] = !(active && has_grad[i]);
        outcome.present_somewhere[i] = active && has_grad[i];
      }
      return;
    }
    T own = T(id(b));
    if (frozen_ && active) {
      if (same_as_frozen(b, has_grad)) {
        Kernels<S>::copy(slots(bucket.params.size(), world_), frozen_->words.data() + frozen_->offsets[b], tail);
        return;
      }
      own = T(0);
    } else if (active && flag_non_finite_ && !all_finite<T, S>(bucket.numel, grads)) {
      own = -own;
    }
    encode_into(b, part, has_grad, own, staging_.data());
    Kernels<S>::from_host(slots(bucket.params.size(), world_), staging_.data(), tail);
  }

  // Whether this round's words are checked on the device (static_graph, frozen, an active round): then read()
  // launches the check and the outcome stays the first round's.
  bool on_device(Participation part) const noexcept { return frozen_.has_value() && part == Participation::kActive; }

  // Before a round's reads.
  void begin_reads() { std::fill(non_finite_here_.begin(), non_finite_here_.end(), 0); }

  // Bucket b's words at `tail` after the reduction: on the device, the rank slots checked there (a mismatch
  // surfaces at the next host read); on the host, the ids checked (DdpError naming the ranks that reduced another
  // collective) and the flags written into `outcome`.
  void read(std::size_t b, T const* tail, Participation part, ReduceOutcome& outcome) {
    if (world_ == 1) return;
    if (on_device(part)) {
      if constexpr (kFreezable)
        Kernels<S>::check_ids(world_, tail + 2 * static_cast<std::int64_t>(plan_->buckets[b].params.size()), T(world_),
                              id(b), static_cast<std::int64_t>(b));
      return;
    }
    decode(b, tail, outcome);
  }

  // After a round's reads: the ranks whose own gradients held a NaN or Inf into `outcome`; under static_graph, the
  // periodic host check of the device's (`last_tail`: any word of this round), and the freeze after the first
  // active round.
  void end_round(Participation part, std::vector<char> const& has_grad, T const* last_tail, ReduceOutcome& outcome) {
    outcome.non_finite_ranks.clear();
    for (int r = 0; r < world_; ++r)
      if (non_finite_here_[static_cast<std::size_t>(r)]) outcome.non_finite_ranks.push_back(r);
    if (on_device(part) && ++device_rounds_ >= check_every_) confirm_on_host(last_tail);
    if (part == Participation::kActive) freeze(has_grad);
  }

 private:
  // static_graph: whether the words can stay on the device.
  static constexpr bool kFreezable = !std::same_as<S, HostSpace>;

  void encode_into(std::size_t b, Participation part, std::vector<char> const& has_grad, T own, T* out) const {
    auto const& bucket = plan_->buckets[b];
    std::size_t const p = bucket.params.size();
    bool const active = part == Participation::kActive;
    for (std::size_t k = 0; k < p; ++k) {
      char const g = has_grad[bucket.params[k]];
      out[k] = active && !g ? T(1) : T(0);
      out[p + k] = active && g ? T(1) : T(0);
    }
    for (int r = 0; r < world_; ++r) out[2 * p + static_cast<std::size_t>(r)] = r == rank_ ? own : T(0);
  }

  void decode(std::size_t b, T const* tail, ReduceOutcome& outcome) {
    auto const& bucket = plan_->buckets[b];
    std::size_t const p = bucket.params.size();
    Kernels<S>::to_host(slots(p, world_), tail, staging_.data());
    std::string others;
    for (int r = 0; r < world_; ++r) {
      double got = double(staging_[2 * p + static_cast<std::size_t>(r)]) * world_;
      if (got < 0) {  // rank r's own gradients in this bucket held a NaN or Inf
        non_finite_here_[static_cast<std::size_t>(r)] = 1;
        got = -got;
      }
      if (std::abs(got - double(id(b))) < 0.25) continue;  // recovered ids are within 1e-6 of an integer
      double const k = std::nearbyint(got) - 1;            // modulo id_modulus
      bool const bucket_like = std::abs(got - (k + 1)) < 0.25 && k >= 0 && k < double(plan_->buckets.size());
      others += cat(others.empty() ? "" : ", ", "rank ", r, " (",
                    bucket_like ? cat("bucket ", static_cast<std::int64_t>(k)) : std::string("not a bucket"), ")");
    }
    if (!others.empty())
      throw DdpError(cat("DistributedDataParallel: rank ", rank_, "'s bucket ", b,
                         " was reduced together with another collective: ", others,
                         ". Ranks issued collectives in different orders (a collective called on some ranks "
                         "only, or models wrapped in a different order on the same communicator)."));
    for (std::size_t k = 0; k < p; ++k) {
      outcome.missing_somewhere[bucket.params[k]] = staging_[k] != T(0);
      outcome.present_somewhere[bucket.params[k]] = staging_[p + k] != T(0);
    }
  }

  // The first round this rank completed actively: keep its flags and upload every bucket's words.
  void freeze(std::vector<char> const& has_grad) {
    if constexpr (kFreezable) {
      if (frozen_ || !static_graph_ || flag_non_finite_ || world_ == 1) return;
      Frozen f{.has_grad = has_grad, .offsets = {}, .words = {}};
      std::int64_t total = 0;
      for (auto const& bucket : plan_->buckets)
        f.offsets.push_back(total), total += slots(bucket.params.size(), world_);
      std::vector<T> host(static_cast<std::size_t>(total));
      for (std::size_t b = 0; b < plan_->buckets.size(); ++b)
        encode_into(b, Participation::kActive, has_grad, T(id(b)), host.data() + f.offsets[b]);
      f.words = Tensor<T, S>(Shape{total});
      Kernels<S>::from_host(total, host.data(), f.words.data());
      frozen_.emplace(std::move(f));
    }
  }
  bool same_as_frozen(std::size_t b, std::vector<char> const& has_grad) const noexcept {
    for (auto const i : plan_->buckets[b].params)
      if (has_grad[i] != frozen_->has_grad[i]) return false;
    return true;
  }
  // The host waits for this round's device checks (a copy of one word to the host, after which the device layer
  // reports what a check found), bounding how late a desync is reported.
  void confirm_on_host(T const* tail) {
    device_rounds_ = 0;
    if constexpr (kFreezable) {
      T word{};
      Kernels<S>::to_host(1, tail, &word);
    }
  }

  BucketPlan const* plan_;
  int world_, rank_;
  std::int64_t id_modulus_;
  bool flag_non_finite_, static_graph_;
  std::int64_t check_every_;
  std::int64_t device_rounds_ = 0;  // rounds checked on the device since the last host check
  std::vector<char> non_finite_here_;
  std::vector<T> staging_;  // one bucket's words on the host
  struct Frozen {
    std::vector<char> has_grad;         // this rank's flags in the first round, per parameter
    std::vector<std::int64_t> offsets;  // bucket b's words in `words`
    Tensor<T, S> words;                 // every bucket's words as this rank sends them
  };
  std::optional<Frozen> frozen_;
};

}  // namespace ddp::detail
