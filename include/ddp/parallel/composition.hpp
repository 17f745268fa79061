// What composes with what on one DistributedDataParallel, in one place. A composition is the DDP's reduction policy
// and options plus the hooks attached to it (attachment.hpp), each with its declared capabilities. composition_refusal()
// says whether it holds and, where not, writes the refusal every rank raises (ArgumentError); DDP asks it when it is
// built, when a hook attaches and when a round opens, and the trainer and GradScaler ask it for their gradient
// readers. kCompositionRules lists the rules it applies; the README's "What composes" table is tested against it
// (//test/parallel:composition_test). Where a composition is not refused but degrades (the overlapped update waits
// for every bucket), update_waits_for() says why.
// Compositions the type system refuses are static_asserts, each with a compile-fail test: the model's memory against
// the backend's and the reduction stage's contract (types_compose, below, for DistributedDataParallel); an exact
// reduction under ddp::join (join.hpp), OwnerReduce across processes (zero_redundancy.hpp) and a 16-bit wire on a
// backend that cannot move it (bucket/reducer.hpp), where those types meet.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "ddp/bucket/outcome.hpp"
#include "ddp/bucket/stage.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/error.hpp"
#include "ddp/parallel/attachment.hpp"
#include "ddp/tensor/memory_space.hpp"

namespace ddp {

// The DDP side of a composition.
struct CompositionView {
  std::string reduction;          // the reduction policy's name
  bool reduces_gradients = true;  // false: the policy leaves them local for an optimizer (OwnerReduce)
  NonFinite non_finite = NonFinite::kIgnore;
  int world = 1;
  bool world_size_invariant = false;  // deterministic mode (ExactSum)
};

// A composition at one of the moments it is checked: the DDP, the hooks attached, and the one attaching (if any).
// `opening_round`: a round is about to start, so whatever the policy needs attached must be.
struct Composition {
  CompositionView ddp{};
  std::span<HookTraits const> attached{};
  HookTraits const* attaching = nullptr;
  bool opening_round = false;
};

// One rule: an identifier, when it is checked, and what it refuses (the README's table rows).
struct CompositionRule {
  std::string_view id, when, refuses;
};

inline constexpr CompositionRule kCompositionRules[] = {
    {"one-join", "attach", "a second ddp::join on a DDP already inside one"},
    {"join-sharded", "attach",
     "ddp::join with an optimizer whose state is sharded (ZeRO stage 1 or 2, more than one rank)"},
    {"one-owner", "attach", "a second optimizer that reduces the gradients of an OwnerReduce DDP"},
    {"owner-unsharded", "attach", "ZeRO stage 0 as the reducing optimizer of an OwnerReduce DDP"},
    {"owner-non-finite", "construction", "DdpOptions::non_finite with OwnerReduce (no reduced gradients to check)"},
    {"owner-missing", "round start", "an OwnerReduce DDP stepped without an optimizer that reduces its gradients"},
    {"whole-overlapped", "attach",
     "clipping or loss scaling with an optimizer that updates each bucket in backward (OverlappedOptimizer)"},
    {"whole-owner", "attach", "clipping or loss scaling under OwnerReduce (the gradients are never whole)"},
    {"local-alone", "attach",
     "local rounds (LocalSgd, DiLoCo) with ddp::join, ZeRO, OwnerReduce, an update in backward, loss scaling or other "
     "local rounds"},
    {"local-exact", "attach",
     "local rounds in deterministic mode without virtual replicas, or virtual replicas outside deterministic mode"},
};

namespace detail {
inline HookTraits const* find_cap(std::span<HookTraits const> hooks, Capability c) noexcept {
  for (auto const& h : hooks)
    if (h.caps.has(c)) return &h;
  return nullptr;
}
inline HookTraits const* find_any(std::span<HookTraits const> hooks, Capabilities set) noexcept {
  for (auto const& h : hooks)
    if (h.caps.has_any(set)) return &h;
  return nullptr;
}
}  // namespace detail

// The refusal of `c` (the message every rank raises), or nothing when it composes. Every refusal named in
// kCompositionRules is written here and nowhere else.
inline std::optional<std::string> composition_refusal(Composition const& c) {
  using detail::cat;
  CompositionView const& d = c.ddp;
  if (!d.reduces_gradients && d.non_finite != NonFinite::kIgnore)  // owner-non-finite
    return cat("DistributedDataParallel: ", d.reduction,
               " leaves the gradients unreduced until the optimizer's step, so there are no reduced gradients to check "
               "for NaN/Inf: use NonFinite::kIgnore with it, or AverageAllReduce with ZeroRedundancyOptimizer for the "
               "checks");
  if (c.opening_round && !d.reduces_gradients && !detail::find_cap(c.attached, Capability::kReducesGradients))
    return cat(
        "DistributedDataParallel: ", d.reduction,  // owner-missing
        " leaves each rank's gradients local for the optimizer to reduce, and no optimizer reduces them: build a "
        "ZeroRedundancyOptimizer (stage 1 or 2) from this DistributedDataParallel before the first step");
  if (!c.attaching) return std::nullopt;
  HookTraits const& h = *c.attaching;
  auto const other = [&](Capability cap) { return detail::find_cap(c.attached, cap); };
  if (h.caps.has(Capability::kAgreesOnRounds) && other(Capability::kAgreesOnRounds))  // one-join
    return std::string("ddp::join: this DistributedDataParallel is already inside a join (one at a time)");
  bool const joining_sharded = h.caps.has(Capability::kAgreesOnRounds) && other(Capability::kShardsState);
  bool const sharding_joined = h.caps.has(Capability::kShardsState) && other(Capability::kAgreesOnRounds);
  if (d.world > 1 && (joining_sharded || sharding_joined))  // join-sharded
    return std::string(
        "ddp::join: the optimizer's state is sharded (ZeroRedundancyOptimizer stage 1 or 2), and a sharded optimizer "
        "cannot step inside ddp::join: a rank that ran out of data would have to keep updating its slice, with the "
        "others' learning rate. Give every rank the same number of batches (EpochSplit::kPad, GlobalBatchSampler) or "
        "use ZeRO stage 0 there");
  Capabilities const round_takers = Capability::kAgreesOnRounds | Capability::kUpdatesInBackward |
                                    Capability::kReducesGradients | Capability::kShardsState | Capability::kLocalRounds;
  HookTraits const* const local = h.caps.has(Capability::kLocalRounds) ? &h : other(Capability::kLocalRounds);
  if (local) {
    // The other side: an attached hook that takes rounds or reads whole averaged gradients (the local one attaching),
    // or the hook attaching. Clipping goes through the local rounds instead (before_inner_step: basic_trainer).
    Capabilities const clashing = round_takers | Capability::kNeedsWholeGradients;
    HookTraits const* const clash = local == &h                ? detail::find_any(c.attached, clashing)
                                    : h.caps.has_any(clashing) ? &h
                                                               : nullptr;
    if (clash || !d.reduces_gradients)  // local-alone
      return cat(local->name,
                 " runs local steps in which nothing is reduced, so it takes the DDP's rounds alone; it "
                 "does not compose with ",
                 clash ? clash->name : d.reduction,
                 " (ddp::join, ZeroRedundancyOptimizer, OwnerReduce, an update in backward, loss scaling or a second "
                 "local-round hook). Build it over a plain optimizer and an averaging reduction");
    bool const virtual_replicas = local->caps.has(Capability::kVirtualReplicas);
    if (d.world_size_invariant && !virtual_replicas)  // local-exact
      return cat(local->name, ": deterministic mode (", d.reduction,
                 ") keeps a step's result the same at every world size, but one replica per rank depends on each "
                 "rank's share; declare virtual replicas (replicas = R, a multiple of the world size), or use "
                 "AverageAllReduce");
    if (!d.world_size_invariant && virtual_replicas)  // local-exact
      return cat(local->name,
                 ": virtual replicas are exact through deterministic mode's micro-batches and exact sums, "
                 "and this DDP reduces with ",
                 d.reduction,
                 ": build it with ExactSum and MicroBatches (DeterministicDataParallel), or drop replicas");
  }
  if (h.caps.has(Capability::kReducesGradients)) {
    if (other(Capability::kReducesGradients))  // one-owner
      return cat(h.name, ": this DistributedDataParallel (", d.reduction,
                 ") already has an optimizer that reduces its gradients; a second would update the parameters again. "
                 "Build one optimizer per DDP");
    if (!h.caps.has(Capability::kShardsState))  // owner-unsharded
      return cat(h.name, ": under ", d.reduction,
                 " each rank reduces and updates the slices it owns, which needs stage 1 or 2; stage 0 (every rank "
                 "updating everything) would have no reduced gradients");
  }
  HookTraits const* const reader = h.caps.has(Capability::kNeedsWholeGradients) ? &h
                                   : h.caps.has(Capability::kUpdatesInBackward)
                                       ? other(Capability::kNeedsWholeGradients)
                                       : nullptr;
  if (reader) {
    if (HookTraits const* upd = reader == &h ? other(Capability::kUpdatesInBackward) : &h)  // whole-overlapped
      return cat(reader->name, " needs every gradient before any parameter moves, but ", upd->name,
                 " updates each bucket as its reduction lands. Construct it with .overlap = {.update_at = "
                 "UpdateAt::kStep}, or train without ",
                 reader->name);
    if (!d.reduces_gradients)  // whole-owner
      return cat(reader->name, " reads the averaged gradients before the step, but under ", d.reduction,
                 " the optimizer averages them inside its step and they are never whole on any rank. Use "
                 "AverageAllReduce with ZeroRedundancyOptimizer, or train without ",
                 reader->name);
  }
  return std::nullopt;
}

namespace detail {
// DistributedDataParallel's types: parameters of type T in memory S, communicator C, the reduction's stage St. True
// when they compose; otherwise the static_assert that fails says what to change.
template <class T, MemorySpace S, class C, class St>
constexpr bool types_compose() {
  constexpr bool takes_memory = C::accepted_spaces::template contains<S>;
  static_assert(takes_memory || !std::same_as<S, HostSpace>,
                "DistributedDataParallel: the model's tensors are host (Eigen) tensors, but this communicator takes "
                "device memory only (e.g. NcclBackend). Build the model over device tensors (Variable<T, "
                "DeviceSpace>, <ddp/tensor/device.hpp>), or use ThreadsBackend / MpiBackend for host models.");
  static_assert(takes_memory || std::same_as<S, HostSpace>,
                "DistributedDataParallel: the model's tensors are device tensors, but this communicator takes host "
                "memory only (e.g. MpiBackend). Name a host-staging adapter: HostStaging<MpiBackend> staged(mpi) "
                "from <ddp/comm/host_staging.hpp> copies each bucket through host memory; or use NcclBackend.");
  static_assert(CommElement<T>, "DistributedDataParallel: parameters must be float or double");
  // The reduction's stage keeps the round contract (bucket/stage.hpp); a missing member is named there. After the
  // checks above: a stage over the wrong memory would only repeat their error.
  static_assert(reduction_stage_checked<St, takes_memory>);
  return true;
}
}  // namespace detail

// Throws composition_refusal(c) as an ArgumentError, if there is one.
inline void check_composition(Composition const& c) {
  if (auto r = composition_refusal(c)) throw ArgumentError(std::move(*r));
}

// Why an optimizer that asks to update each bucket as it lands (Capability::kUpdatesInBackward) must wait for every
// bucket instead, or nothing. Not a refusal: it updates in step().
inline std::optional<std::string> update_waits_for(CompositionView const& d) {
  if (d.non_finite != NonFinite::kIgnore)
    return std::string("DdpOptions::non_finite checks every bucket before any update");
  return std::nullopt;
}

}  // namespace ddp
