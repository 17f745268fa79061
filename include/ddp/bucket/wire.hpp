// BucketWire<T, W, S>: how a gradient bucket travels in BucketReducer. A bucket's slice of the arena is its
// gradients (T) followed by its status words (bucket/reducer.hpp). With W == T the slice itself is all-reduced
// in place with kAvg. With W a 16-bit float (bfloat16, float16) the slice is cast into a wire buffer of W,
// gradients scaled by 1/world first (so float16's range holds the sum, as PyTorch's fp16 hook does), summed
// with kSum, and cast back; the status words travel the same way, scaled by 1/world on the way back, so the
// reducer reads them exactly as after kAvg. Half the bytes of a float bucket on the wire.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/tensor/half.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp {

// In place, averaged by the backend.
template <class T, class W, MemorySpace S>
class BucketWire {
 public:
  // Status-word bucket ids are stored modulo this: every id in range is exact in W.
  static constexpr std::int64_t id_modulus = std::int64_t{1} << 20;

  BucketWire(std::vector<std::int64_t> const& /*slice_numels*/, int /*world*/) {}
  // The span to all-reduce for bucket b whose slice starts at `slice`, and the operation.
  SpaceSpan<T, S> pack(std::size_t /*b*/, T* slice, std::int64_t /*grads*/, std::int64_t n) noexcept {
    return SpaceSpan<T, S>(slice, static_cast<std::size_t>(n));
  }
  static constexpr ReduceOp op = ReduceOp::kAvg;
  // After the all-reduce completed: the slice holds the average.
  void unpack(std::size_t /*b*/, T* /*slice*/, std::int64_t /*grads*/, std::int64_t /*n*/) noexcept {}
};

// Cast to a 16-bit float on the wire.
template <class T, HalfFloat W, MemorySpace S>
class BucketWire<T, W, S> {
 public:
  static constexpr std::int64_t id_modulus = W::exact_integers;

  BucketWire(std::vector<std::int64_t> const& slice_numels, int world) : inv_world_(1.0f / static_cast<float>(world)) {
    std::int64_t total = 0;
    for (auto const n : slice_numels) offsets_.push_back(total), total += n;
    owner_ = SpaceAllocator<S>::template allocate<W>(static_cast<std::size_t>(total));
  }
  // Gradients scaled by 1 / world, status words as they are (small integers, exact in W).
  SpaceSpan<W, S> pack(std::size_t b, T const* slice, std::int64_t grads, std::int64_t n) {
    W* const w = owner_.get() + offsets_[b];
    Kernels<S>::cast(grads, inv_world_, slice, w);
    Kernels<S>::cast(n - grads, 1.0f, slice + grads, w + grads);
    return SpaceSpan<W, S>(w, static_cast<std::size_t>(n));
  }
  static constexpr ReduceOp op = ReduceOp::kSum;
  // The summed gradients are the average; the status words' sums scaled by 1 / world read as kAvg's.
  void unpack(std::size_t b, T* slice, std::int64_t grads, std::int64_t n) {
    W const* const w = owner_.get() + offsets_[b];
    Kernels<S>::cast(grads, 1.0f, w, slice);
    Kernels<S>::cast(n - grads, inv_world_, w + grads, slice + grads);
  }

 private:
  float inv_world_;
  std::vector<std::int64_t> offsets_;
  std::shared_ptr<W[]> owner_;  // every bucket's wire slice, in plan order
};

}  // namespace ddp
