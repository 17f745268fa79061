// ExactReducer: the reduction stage of deterministic mode (the ExactSum policy). It adds the gradients of a
// round's micro-batches, over all ranks, exactly, so the result does not depend on the world size, the bucket
// plan or the backend's all-reduce algorithm. Method and guarantee: docs/deterministic.md.
//
// How: each parameter gets a shared exponent e (the max over ranks and micro-batches of its largest |gradient|
// element: one small all-reduce), every micro-batch gradient is rounded once to a 64-bit integer multiple of
// 2^(e - b), b = 62 - ceil(log2 V), and the integers are summed on the rank and across ranks (integer addition is
// associative: any all-reduce, bucket layout or rank count gives the same sum). The mean over the V
// micro-batches is converted back to T once.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "ddp/bucket/exact_quantum.hpp"
#include "ddp/bucket/outcome.hpp"
#include "ddp/bucket/plan.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/nn/parameter_arena.hpp"

namespace ddp {

// Drives one model's gradients through a round of `per_rank` micro-batches on each rank, V = per_rank x world in
// all. Host tensors only (the quantising loops run on the host). Costs per round: (per_rank - 1) copies of the
// gradients, a scan, a quantising and a dequantising pass, and two collectives (2·P + 2·P int64 words, max; the
// int64 sums in the plan's buckets). Bitwise identical on every rank, and for every world size dividing V.
template <class T, MemorySpace S, Communicator C>
class ExactReducer {
  static_assert(std::same_as<S, HostSpace>,
                "ExactSum (deterministic mode) reduces host (Eigen) tensors; device models use AverageAllReduce, "
                "whose results are deterministic for a fixed world size only");
  static_assert(std::is_floating_point_v<T>, "ExactSum: parameters must be float or double");

 public:
  // The exact sums travel in their own int64 buffer: the gradient arena reserves nothing (ParameterArena).
  static std::vector<std::int64_t> reserve(BucketPlan const&, std::size_t, int) { return {}; }

  ExactReducer(C& comm, BucketPlan plan, nn::ParameterArena<T, S>& arena, std::int64_t per_rank,
               ReducerOptions opts = {}, NoWireConfig = {})
      : comm_(&comm), plan_(std::move(plan)), arena_(&arena), per_rank_(per_rank), opts_(opts) {
    std::size_t const n = static_cast<std::size_t>(arena.numel()), np = arena.count();
    micro_batches_ = per_rank_ * comm.world_size();
    held_.assign(static_cast<std::size_t>(per_rank_ - 1) * n, T(0));
    sums_.assign(n, 0);
    words_.assign(4 * np, 0);
    ready_.assign(np, 0);
    unready_ = np;
    had_.assign(np, 0);
    // |q| <= 2^bits for each of V terms, so the sum stays within int64: V * 2^bits <= 2^62.
    bits_ = detail::exact_bits(micro_batches_);
    outcome_.missing_somewhere.assign(np, 0);
    outcome_.present_somewhere.assign(np, 0);
    outcome_.non_finite.assign(np, 0);
  }

  BucketPlan const& plan() const noexcept { return plan_; }
  // What this rank sends in a round: the exponent words and the int64 sums (nothing on one rank).
  std::int64_t wire_bytes() const noexcept {
    if (comm_->world_size() == 1) return 0;
    std::int64_t elements = static_cast<std::int64_t>(words_.size());
    for (auto const& b : plan_.buckets) elements += b.numel;
    return elements * static_cast<std::int64_t>(sizeof(std::int64_t));
  }

  // Starts a round: no micro-batch seen yet.
  void begin() {
    std::size_t const np = arena_->count();
    std::fill(words_.begin(), words_.begin() + static_cast<std::ptrdiff_t>(np), kFloorExponent);
    std::fill(words_.begin() + static_cast<std::ptrdiff_t>(np), words_.end(), 0);
    std::fill(ready_.begin(), ready_.end(), 0);
    unready_ = ready_.size();
    std::fill(had_.begin(), had_.end(), 0);
    held_count_ = 0;
  }

  bool is_ready(std::size_t i) const noexcept { return ready_[i] != 0; }
  // The round's outcome as far as finish() has got (a landed bucket's parameters are final).
  ReduceOutcome const& outcome() const noexcept { return outcome_; }
  bool all_ready() const noexcept { return unready_ == 0; }
  bool had_grad(std::size_t i) const noexcept { return had_[i] != 0; }

  // The last micro-batch's gradient of parameter i is final (its own, or zeros the caller wrote).
  void mark_ready(std::size_t i, bool has_grad) {
    if (!ready_[i]) --unready_;
    ready_[i] = 1;
    had_[i] |= has_grad ? 1 : 0;
  }

  // A micro-batch before the round's last ended: its gradients are kept aside and the buffer is cleared for
  // the next one.
  void end_micro_batch() {
    if (held_count_ + 1 >= per_rank_)
      throw ArgumentError(detail::cat("DistributedDataParallel: more than ", per_rank_,
                                      " micro-batches in one round (MicroBatches: world size x micro-batches per rank "
                                      "= ",
                                      micro_batches_, ")"));
    for (std::size_t i = 0; i < arena_->count(); ++i) had_[i] |= arena_->fill_missing_grad(i) ? 1 : 0;
    T const* g = arena_->grads().data();
    std::size_t const n = static_cast<std::size_t>(arena_->numel());
    std::copy(g, g + n, held_.begin() + static_cast<std::ptrdiff_t>(held_count_ * n));
    note_magnitudes(g);
    ++held_count_;
    arena_->zero_grad();
  }

  // Every parameter of the last micro-batch is ready: exponents, exact sums, the mean back in the gradients.
  // `landed(b)` (outcome.hpp) runs once bucket b's mean is back, in plan order, until it returns false; nothing
  // lands when the sums could not be formed (non-finite gradients).
  template <class Landed = NoLanding>
  ReduceOutcome const& finish(Landed&& landed = {}) {
    std::size_t const np = arena_->count();
    std::size_t const n = static_cast<std::size_t>(arena_->numel());
    if (held_count_ + 1 != per_rank_)
      throw ArgumentError(detail::cat("DistributedDataParallel: the round ended after ", held_count_ + 1,
                                      " micro-batches on rank ", comm_->rank(), "; MicroBatches gives each rank ",
                                      per_rank_));
    T* const grads = arena_->grads().data();
    note_magnitudes(grads);
    for (std::size_t p = 0; p < np; ++p) {
      words_[2 * np + p] = had_[p] ? 0 : 1;  // missing here
      words_[3 * np + p] = had_[p] ? 1 : 0;  // present here
    }
    // Shared exponents, non-finite and presence flags: the max over ranks.
    if (comm_->world_size() > 1)
      comm_->all_reduce(std::span<std::int64_t>(words_), ReduceOp::kMax, CollectiveTag{"exact.exponents", -1});
    outcome_.reduced = true;
    for (std::size_t p = 0; p < np; ++p) {
      outcome_.missing_somewhere[p] = words_[2 * np + p] != 0;
      outcome_.present_somewhere[p] = words_[3 * np + p] != 0;
      outcome_.non_finite[p] = words_[np + p] != 0;
      if (outcome_.non_finite[p]) outcome_.reduced = false;
    }
    if (!outcome_.reduced) return outcome_;  // nothing to sum exactly; every rank stops here alike

    bool landing = true;
    // One micro-batch on one rank: quantise and convert back in one pass, nothing to add or exchange.
    if (micro_batches_ == 1) {
      for (std::size_t b = 0; b < plan_.buckets.size(); ++b) {
        for (auto const p : plan_.buckets[b].params) {
          auto const& e = arena_->entries()[p];
          double const scale = std::ldexp(1.0, shift(p)), factor = std::ldexp(1.0, -shift(p));
          T* const g = grads + e.offset;
          for (std::int64_t i = 0; i < e.numel; ++i)
            g[i] = static_cast<T>(static_cast<double>(quantize(g[i], scale)) * factor);
        }
        if (landing) landing = landed(b);
      }
      return outcome_;
    }
    for (std::size_t p = 0; p < np; ++p) {
      auto const& e = arena_->entries()[p];
      // Locals and restrict: an int64 store through acc could otherwise alias e.numel, which keeps the loops
      // scalar (a reload per element).
      std::int64_t const numel = e.numel;
      double const scale = std::ldexp(1.0, shift(p));
      std::int64_t* __restrict const acc = sums_.data() + e.offset;
      T const* __restrict const last = grads + e.offset;
      for (std::int64_t i = 0; i < numel; ++i) acc[i] = quantize(last[i], scale);
      for (std::int64_t j = 0; j + 1 < per_rank_; ++j) {
        T const* __restrict const g =
            held_.data() + static_cast<std::size_t>(j) * n + static_cast<std::size_t>(e.offset);
        for (std::int64_t i = 0; i < numel; ++i) acc[i] += quantize(g[i], scale);
      }
    }
    for (std::size_t b = 0; b < plan_.buckets.size(); ++b) {
      auto const& bucket = plan_.buckets[b];
      if (comm_->world_size() > 1) {
        std::int64_t const lo = arena_->entries()[bucket.params.front()].offset;
        if (opts_.observer) opts_.observer->on_launch(b);
        comm_->all_reduce(std::span<std::int64_t>(sums_.data() + lo, static_cast<std::size_t>(bucket.numel)),
                          ReduceOp::kSum, CollectiveTag{"exact.bucket", static_cast<std::int64_t>(b)});
        if (opts_.observer) opts_.observer->on_complete(b, bucket.numel * std::int64_t{sizeof(std::int64_t)});
      }
      for (auto const p : bucket.params) {
        auto const& e = arena_->entries()[p];
        std::int64_t const numel = e.numel;
        double const factor = std::ldexp(1.0, -shift(p)) / static_cast<double>(micro_batches_);
        std::int64_t const* __restrict const acc = sums_.data() + e.offset;
        T* __restrict const g = grads + e.offset;
        for (std::int64_t i = 0; i < numel; ++i) g[i] = static_cast<T>(static_cast<double>(acc[i]) * factor);
      }
      if (landing) landing = landed(b);
    }
    return outcome_;
  }

  // A round for a rank without data (ddp::join) cannot be shadowed: an exact sum needs every rank's
  // micro-batches (join.hpp rejects this reduction at compile time).
  void abandon() noexcept {}

 private:
  static constexpr std::int64_t kFloorExponent = detail::kExactFloorExponent;

  // Running max of each parameter's exponent (words_[p]) and its non-finite flag (words_[np + p]).
  void note_magnitudes(T const* grads) {
    std::size_t const np = arena_->count();
    for (std::size_t p = 0; p < np; ++p) {
      auto const& e = arena_->entries()[p];
      auto const m = detail::exact_magnitude(grads + e.offset, e.numel);
      words_[p] = std::max(words_[p], m.exponent);
      words_[np + p] = std::max<std::int64_t>(words_[np + p], m.finite ? 0 : 1);
    }
  }

  // Quantum of parameter p: 2^-shift; every |gradient| < 2^e maps to |q| <= 2^bits_.
  int shift(std::size_t p) const noexcept { return bits_ - static_cast<int>(words_[p]); }

  static std::int64_t quantize(T g, double scale) noexcept { return detail::exact_quantize(g, scale); }

  C* comm_;
  BucketPlan plan_;
  nn::ParameterArena<T, S>* arena_;
  std::int64_t per_rank_, micro_batches_ = 1;
  ReducerOptions opts_;
  int bits_ = 62;
  std::int64_t held_count_ = 0;      // micro-batches of this round kept aside
  std::vector<T> held_;              // their gradients
  std::vector<std::int64_t> sums_;   // the exact sums, laid out as the arena
  std::vector<std::int64_t> words_;  // per parameter: exponent, non-finite, missing here, present here
  std::vector<char> ready_, had_;
  std::size_t unready_ = 0;  // parameters not yet marked ready in this round
  ReduceOutcome outcome_;
};

}  // namespace ddp
