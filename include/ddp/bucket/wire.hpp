// BucketWire<T, W, S>: how a gradient bucket travels in BucketReducer. A bucket's slice of the arena is its
// gradients (T) followed by its status words (bucket/reducer.hpp). W names the wire format:
//  - W == T: the slice itself is all-reduced in place with kAvg;
//  - W a 16-bit float (bfloat16, float16): the slice is cast into a wire buffer of W, gradients scaled by 1/world
//    first (so float16's range holds the sum, as PyTorch's fp16 hook does), summed with kSum, and cast back; the
//    status words travel the same way, scaled by 1/world on the way back, so the reducer reads them exactly as
//    after kAvg. Half the bytes of a float bucket on the wire;
//  - W = LowRank: PowerSGD (bucket/powersgd.hpp).
//
// What a wire provides (the reducer's only view of it; BucketWireFormat checks it):
//  - value_type: the element type that travels; config: its options (NoWireConfig where it has none);
//    single_collective: whether unpack() never asks for a second collective;
//  - a constructor from the buckets' layout (WireBucket: where each gradient sits and its matrix shape), the
//    world size and the config;
//  - pack(b, slice, part): the first collective of bucket b (span and operation), launched as soon as backward
//    completes the bucket;
//  - unpack(b, slice): called once that collective completed; returns the bucket's next collective (a wire that
//    needs two, like PowerSGD's P and Q) or nothing once the slice holds the average;
//  - bytes(): what one rank sends per round (steady state);
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

// One bucket as a wire sees it: its gradients, then `status` status words.
struct WireBucket {
  std::int64_t grads = 0, status = 0;
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

// In place, averaged by the backend.
template <class T, class W, MemorySpace S>
class BucketWire {
 public:
  using value_type = T;
  using config = NoWireConfig;
  static constexpr bool single_collective = true;  // unpack() never asks for another
  // Status-word bucket ids are stored modulo this: every id in range is exact in the wire type.
  static constexpr std::int64_t id_modulus = std::int64_t{1} << 20;

  BucketWire(std::vector<WireBucket> layout, int /*world*/, config = {}) : layout_(std::move(layout)) {}
  WirePiece<T, S> pack(std::size_t b, T* slice, Participation /*part*/) noexcept {
    return {SpaceSpan<T, S>(slice, static_cast<std::size_t>(numel(b))), ReduceOp::kAvg, "bucket"};
  }
  // The slice holds the average.
  std::optional<WirePiece<T, S>> unpack(std::size_t /*b*/, T* /*slice*/) noexcept { return std::nullopt; }
  std::int64_t bytes() const noexcept {
    std::int64_t n = 0;
    for (std::size_t b = 0; b < layout_.size(); ++b) n += numel(b);
    return n * static_cast<std::int64_t>(sizeof(T));
  }

 private:
  std::int64_t numel(std::size_t b) const noexcept { return layout_[b].grads + layout_[b].status; }
  std::vector<WireBucket> layout_;
};

// Cast to a 16-bit float on the wire.
template <class T, HalfFloat W, MemorySpace S>
class BucketWire<T, W, S> {
 public:
  using value_type = W;
  using config = NoWireConfig;
  static constexpr bool single_collective = true;
  static constexpr std::int64_t id_modulus = W::exact_integers;

  BucketWire(std::vector<WireBucket> layout, int world, config = {})
      : layout_(std::move(layout)), inv_world_(1.0f / static_cast<float>(world)) {
    std::int64_t total = 0;
    for (auto const& b : layout_) offsets_.push_back(total), total += b.grads + b.status;
    owner_ = SpaceAllocator<S>::template allocate<W>(static_cast<std::size_t>(total));
  }
  // Gradients scaled by 1 / world, status words as they are (small integers, exact in W).
  WirePiece<W, S> pack(std::size_t b, T const* slice, Participation /*part*/) {
    W* const w = owner_.get() + offsets_[b];
    std::int64_t const grads = layout_[b].grads, n = grads + layout_[b].status;
    Kernels<S>::cast(grads, inv_world_, slice, w);
    Kernels<S>::cast(n - grads, 1.0f, slice + grads, w + grads);
    return {SpaceSpan<W, S>(w, static_cast<std::size_t>(n)), ReduceOp::kSum, "bucket"};
  }
  // The summed gradients are the average; the status words' sums scaled by 1 / world read as kAvg's.
  std::optional<WirePiece<W, S>> unpack(std::size_t b, T* slice) {
    W const* const w = owner_.get() + offsets_[b];
    std::int64_t const grads = layout_[b].grads, n = grads + layout_[b].status;
    Kernels<S>::cast(grads, 1.0f, w, slice);
    Kernels<S>::cast(n - grads, inv_world_, w + grads, slice + grads);
    return std::nullopt;
  }
  std::int64_t bytes() const noexcept {
    std::int64_t n = 0;
    for (auto const& b : layout_) n += b.grads + b.status;
    return n * static_cast<std::int64_t>(sizeof(W));
  }

 private:
  std::vector<WireBucket> layout_;
  float inv_world_;
  std::vector<std::int64_t> offsets_;
  std::shared_ptr<W[]> owner_;  // every bucket's wire slice, in plan order
};

// The wire of the OwnerReduce policy (parallel/policies.hpp): only the status words travel (averaged, as with
// the float wire, so the reducer reads them as after kAvg); the gradients stay where backward wrote them, and
// the ZeroRedundancyOptimizer built from the DDP reduces each rank's slices straight from every rank's
// gradients into its update. `reduces_gradients = false` tells the reducer to leave the gradients alone (no
// micro-batch division: the optimizer does it with the reduction).
struct StatusOnly {};

template <class T, MemorySpace S>
class BucketWire<T, StatusOnly, S> {
 public:
  using value_type = T;
  using config = NoWireConfig;
  static constexpr bool single_collective = true;
  static constexpr bool reduces_gradients = false;
  static constexpr std::int64_t id_modulus = std::int64_t{1} << 20;

  BucketWire(std::vector<WireBucket> layout, int /*world*/, config = {}) : layout_(std::move(layout)) {}
  WirePiece<T, S> pack(std::size_t b, T* slice, Participation /*part*/) noexcept {
    return {SpaceSpan<T, S>(slice + layout_[b].grads, static_cast<std::size_t>(layout_[b].status)), ReduceOp::kAvg,
            "status"};
  }
  std::optional<WirePiece<T, S>> unpack(std::size_t /*b*/, T* /*slice*/) noexcept { return std::nullopt; }
  std::int64_t bytes() const noexcept {
    std::int64_t n = 0;
    for (auto const& b : layout_) n += b.status;
    return n * static_cast<std::int64_t>(sizeof(T));
  }

 private:
  std::vector<WireBucket> layout_;
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
concept BucketWireFormat = requires(Wire& w, Wire const& cw, std::vector<WireBucket> layout, T* slice,
                                    typename Wire::config cfg) {
  typename Wire::value_type;
  { Wire::id_modulus } -> std::convertible_to<std::int64_t>;
  { Wire::single_collective } -> std::convertible_to<bool>;
  Wire(std::move(layout), 2, cfg);
  { w.pack(std::size_t{0}, slice, Participation::kActive) } -> std::same_as<WirePiece<typename Wire::value_type, S>>;
  { w.unpack(std::size_t{0}, slice) } -> std::same_as<std::optional<WirePiece<typename Wire::value_type, S>>>;
  { cw.bytes() } -> std::same_as<std::int64_t>;
};

}  // namespace ddp
