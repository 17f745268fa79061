// BucketWire<T, W, S>: how a gradient bucket travels in BucketReducer. W names the wire format:
//  - W = InPlace: the bucket's gradients are all-reduced in place with kAvg;
//  - W a 16-bit float (bfloat16, float16): the gradients are cast into the lent buffer (below) scaled by 1/world
//    first (so float16's range holds the sum, as PyTorch's fp16 hook does), summed with kSum, and cast back. Half the
//    bytes of a float bucket on the wire;
//  - W = LowRank: PowerSGD (bucket/powersgd.hpp);
//  - StatusOnly: nothing of the gradients travels (OwnerReduce reduces them itself).
// A wire sees gradients only, as a PyTorch communication hook sees its bucket: the library's bookkeeping (the status
// words that carry unused-parameter flags, the bucket fingerprint and the non-finite flags) is appended to a bucket's
// first collective and read back by the reducer (bucket/transport.hpp), whatever the wire.
//
// What a wire provides (the reducer's only view of it; BucketWireFormat checks it, and check_bucket_wire names a
// missing member in a static_assert):
//  - value_type: the element type that travels (T, a ddp half type, ...); config: its options (NoWireConfig where it
//    has none); single_collective: whether unpack() never asks for a second collective;
//  - a constructor from the buckets' layout (WireBucket: where each gradient sits and its matrix shape), the world
//    size and the config;
//  - buffer_numel(b): how many elements of value_type bucket b's first collective needs in a buffer the reducer lends
//    it (0 for a wire that reduces the gradients in place);
//  - pack(b, grads, part, buffer): bucket b's first collective, launched as soon as backward completes the bucket: a
//    piece over `buffer` (its first elements), or over the gradients themselves when value_type is T (in place). Its
//    operation is kAvg or kSum (the status words ride in it);
//  - unpack(b, grads, buffer): called once that collective completed; returns the bucket's next collective (a wire
//    that needs two, like PowerSGD's P and Q) or nothing once `grads` hold the average;
//  - bytes(): what one rank sends of the gradients per round (steady state; the reducer adds the status words);
//  - optionally, state() and load_state(state, WireStateFrom): what it carries from round to round (PowerSGD's
//    counters, Q and error feedback), so that a checkpoint resumes it exactly (WireState).
// A wire's collectives are a pure function of the round on every rank (same count, order and sizes), so ranks
// stay matched.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/bucket/outcome.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/tensor/half.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp {

// One gradient in a bucket's slice: `offset` elements from the slice's start, viewed as a rows x cols row-major
// matrix (PyTorch's view for PowerSGD: rows = the first dimension). A vector, or a gradient whose shape is not
// known, has rows == 1.
struct WireTensor {
  std::int64_t offset = 0, rows = 1, cols = 0;
};

// One bucket as a wire sees it: its `grads` gradient elements, each gradient a WireTensor.
struct WireBucket {
  std::int64_t grads = 0;
  std::vector<WireTensor> tensors;
};

// One collective of a bucket: the span to all-reduce, the operation and the label its tag carries.
template <class V, MemorySpace S>
struct WirePiece {
  SpaceSpan<V, S> span;
  ReduceOp op;
  std::string_view label;
};

// What a wire carries from one round to the next, for checkpoints. `kind` names the wire ("" for one without
// state); `layout` describes how `values` is cut (a load into another layout is refused); `counters` are the same
// on every rank; `values` are this rank's own.
template <class T>
struct WireState {
  std::string kind{};
  std::vector<std::int64_t> layout{};
  std::vector<std::int64_t> counters{};
  std::vector<T> values{};
  friend bool operator==(WireState const&, WireState const&) = default;
};

// Whose values a loaded WireState holds: this rank's own (a resume at the world size that wrote it), or another
// rank's (a resume at another world size: the wire keeps what is the same on every rank and drops the rest).
enum class WireStateFrom { kThisRank, kOtherRank };

// Whether a wire keeps state between rounds (state() and load_state()).
template <class Wire, class T>
concept StatefulWire = requires(Wire& w, Wire const& cw, WireState<T> const& st) {
  { cw.state() } -> std::same_as<WireState<T>>;
  w.load_state(st, WireStateFrom::kThisRank);
};

// The wire format tags. A tag without a BucketWire specialisation is an incomplete type: the reducer refuses it.
template <class T, class W, MemorySpace S>
class BucketWire;

// In place, averaged by the backend (the AverageAllReduce policy).
struct InPlace {
  static constexpr std::string_view policy_name = "AverageAllReduce";
};

template <class T, MemorySpace S>
class BucketWire<T, InPlace, S> {
 public:
  using value_type = T;
  using config = NoWireConfig;
  static constexpr bool single_collective = true;  // unpack() never asks for another

  BucketWire(std::vector<WireBucket> layout, int /*world*/, config = {}) : layout_(std::move(layout)) {}
  std::int64_t buffer_numel(std::size_t /*b*/) const noexcept { return 0; }  // in place
  WirePiece<T, S> pack(std::size_t b, T* grads, Participation /*part*/, SpaceSpan<T, S> /*buffer*/) noexcept {
    return {SpaceSpan<T, S>(grads, static_cast<std::size_t>(layout_[b].grads)), ReduceOp::kAvg, "bucket"};
  }
  // The gradients hold the average.
  std::optional<WirePiece<T, S>> unpack(std::size_t /*b*/, T* /*grads*/, SpaceSpan<T, S> /*buffer*/) noexcept {
    return std::nullopt;
  }
  std::int64_t bytes() const noexcept {
    std::int64_t n = 0;
    for (auto const& b : layout_) n += b.grads;
    return n * static_cast<std::int64_t>(sizeof(T));
  }

 private:
  std::vector<WireBucket> layout_;
};

// Cast to a 16-bit float on the wire.
template <class T, HalfFloat W, MemorySpace S>
class BucketWire<T, W, S> {
 public:
  using value_type = W;
  using config = NoWireConfig;
  static constexpr bool single_collective = true;

  BucketWire(std::vector<WireBucket> layout, int world, config = {})
      : layout_(std::move(layout)), inv_world_(1.0f / static_cast<float>(world)) {}
  std::int64_t buffer_numel(std::size_t b) const noexcept { return layout_[b].grads; }
  // The gradients scaled by 1 / world, in W.
  WirePiece<W, S> pack(std::size_t b, T const* grads, Participation /*part*/, SpaceSpan<W, S> buffer) {
    Kernels<S>::cast(layout_[b].grads, inv_world_, grads, buffer.data());
    return {buffer.first(static_cast<std::size_t>(layout_[b].grads)), ReduceOp::kSum, "bucket"};
  }
  // The summed shares are the average.
  std::optional<WirePiece<W, S>> unpack(std::size_t b, T* grads, SpaceSpan<W, S> buffer) {
    Kernels<S>::cast(layout_[b].grads, 1.0f, buffer.data(), grads);
    return std::nullopt;
  }
  std::int64_t bytes() const noexcept {
    std::int64_t n = 0;
    for (auto const& b : layout_) n += b.grads;
    return n * static_cast<std::int64_t>(sizeof(W));
  }

 private:
  std::vector<WireBucket> layout_;
  float inv_world_;
};

// The wire of the OwnerReduce policy (parallel/policies.hpp): nothing of the gradients travels (the first
// collective is empty, so only the reducer's status words do); the gradients stay where backward wrote them, and
// the ZeroRedundancyOptimizer built from the DDP reduces each rank's slices straight from every rank's
// gradients into its update. `reduces_gradients = false` tells the reducer to leave the gradients alone (no
// micro-batch division: the optimizer does it with the reduction).
struct StatusOnly {
  static constexpr std::string_view policy_name = "OwnerReduce";
};

template <class T, MemorySpace S>
class BucketWire<T, StatusOnly, S> {
 public:
  using value_type = T;
  using config = NoWireConfig;
  static constexpr bool single_collective = true;
  static constexpr bool reduces_gradients = false;

  BucketWire(std::vector<WireBucket> /*layout*/, int /*world*/, config = {}) {}
  std::int64_t buffer_numel(std::size_t /*b*/) const noexcept { return 0; }
  WirePiece<T, S> pack(std::size_t /*b*/, T* /*grads*/, Participation /*part*/, SpaceSpan<T, S> buffer) noexcept {
    return {buffer.first(0), ReduceOp::kAvg, "status"};
  }
  std::optional<WirePiece<T, S>> unpack(std::size_t /*b*/, T* /*grads*/, SpaceSpan<T, S> /*buffer*/) noexcept {
    return std::nullopt;
  }
  std::int64_t bytes() const noexcept { return 0; }
};

// Whether a wire leaves the slice holding the averaged gradients (every wire but StatusOnly).
template <class Wire>
inline constexpr bool wire_reduces_gradients = [] {
  if constexpr (requires { Wire::reduces_gradients; })
    return static_cast<bool>(Wire::reduces_gradients);
  else
    return true;
}();

// What BucketReducer needs of a wire (see the top of this file).
template <class Wire, class T, class S>
concept BucketWireFormat = requires(Wire& w, Wire const& cw, std::vector<WireBucket> layout, T* grads,
                                    typename Wire::config cfg, SpaceSpan<typename Wire::value_type, S> buffer) {
  typename Wire::value_type;
  { Wire::single_collective } -> std::convertible_to<bool>;
  Wire(std::move(layout), 2, cfg);
  { cw.buffer_numel(std::size_t{0}) } -> std::convertible_to<std::int64_t>;
  {
    w.pack(std::size_t{0}, grads, Participation::kActive, buffer)
    } -> std::same_as<WirePiece<typename Wire::value_type, S>>;
  { w.unpack(std::size_t{0}, grads, buffer) } -> std::same_as<std::optional<WirePiece<typename Wire::value_type, S>>>;
  { cw.bytes() } -> std::same_as<std::int64_t>;
};

namespace detail {

// One static_assert per member of BucketWireFormat, so that the compiler names the one a wire lacks. True when Wire
// is a BucketWireFormat.
template <class Wire, class T, class S>
constexpr bool check_bucket_wire_members() {
  constexpr bool typed = requires {
    typename Wire::value_type;
    typename Wire::config;
  };
  static_assert(typed,
                "BucketWireFormat: the wire has no value_type (what travels) or no config (its options; "
                "ddp::NoWireConfig where it has none)");
  if constexpr (typed) {
    using V = typename Wire::value_type;
    static_assert(
        requires {
          { Wire::single_collective } -> std::convertible_to<bool>;
        },
        "BucketWireFormat: the wire has no static constexpr bool single_collective (whether unpack() never asks for a "
        "second collective)");
    static_assert(
        requires(std::vector<WireBucket> layout, typename Wire::config cfg) { Wire(std::move(layout), 2, cfg); },
        "BucketWireFormat: the wire has no constructor (std::vector<ddp::WireBucket> layout, int world, config)");
    static_assert(
        requires(Wire const& w) {
          { w.buffer_numel(std::size_t{0}) } -> std::convertible_to<std::int64_t>;
        },
        "BucketWireFormat: the wire has no buffer_numel(b) const (elements of value_type its first collective of "
        "bucket b needs in the buffer the reducer lends it; 0 in place)");
    static_assert(
        requires(Wire & w, T * grads, SpaceSpan<V, S> buffer) {
          { w.pack(std::size_t{0}, grads, Participation::kActive, buffer) } -> std::same_as<WirePiece<V, S>>;
        },
        "BucketWireFormat: the wire has no pack(b, T* grads, ddp::Participation, SpaceSpan<value_type, S> buffer) "
        "returning WirePiece<value_type, S> (bucket b's first collective)");
    static_assert(
        requires(Wire & w, T * grads, SpaceSpan<V, S> buffer) {
          { w.unpack(std::size_t{0}, grads, buffer) } -> std::same_as<std::optional<WirePiece<V, S>>>;
        },
        "BucketWireFormat: the wire has no unpack(b, T* grads, SpaceSpan<value_type, S> buffer) returning "
        "std::optional<WirePiece<value_type, S>> (what arrived; the next collective, if any)");
    static_assert(
        requires(Wire const& w) {
          { w.bytes() } -> std::same_as<std::int64_t>;
        },
        "BucketWireFormat: the wire has no bytes() const returning std::int64_t (what one rank sends per round)");
  }
  return BucketWireFormat<Wire, T, S>;
}

template <class Wire, class T, class S>
constexpr bool check_bucket_wire() {
  constexpr bool defined = requires { sizeof(Wire); };
  static_assert(defined,
                "BucketWireFormat: there is no BucketWire<T, W, S> specialisation for this wire tag W, gradient type T "
                "and memory space S (bucket/wire.hpp; examples/07_custom_wire.cpp writes one)");
  if constexpr (defined)
    return check_bucket_wire_members<Wire, T, S>();
  else
    return false;
}

}  // namespace detail
}  // namespace ddp
