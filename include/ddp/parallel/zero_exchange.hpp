// ZeroExchange: how a ZeroRedundancyOptimizer step gets the gradients of this rank's slices and gives every rank the
// updated parameters. ZeroRedundancyOptimizer (zero_redundancy.hpp) shards the optimizer state and drives the step;
// the exchange is the communication around it: ZeroGather (the default, in zero_redundancy.hpp: the DDP's averaged
// gradients are in the arena, every bucket's parameters are all-gathered after the update) or OwnerReduceExchange
// (owner_reduce.hpp: each slice reduced straight from every rank's gradients, the parameters written to every
// replica). Also the buckets as ZeRO cuts them into slices, which both read.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/bucket/plan.hpp"
#include "ddp/error.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/optim/shard.hpp"
#include "ddp/parallel/attachment.hpp"

namespace ddp::detail {

// One bucket as ZeRO cuts it: gradient elements [start, start + numel) of the arena, in world_size slices of
// `chunk` elements (whole 64-byte lines, so a slice starts where the unsharded optimizer's SIMD blocks would);
// the last slices may be short or empty.
struct ZeroBucket {
  std::int64_t start = 0, numel = 0, chunk = 0;
};

template <class T, MemorySpace S>
std::vector<ZeroBucket> zero_buckets(BucketPlan const& plan, nn::ParameterArena<T, S> const& arena, int world) {
  constexpr std::int64_t kLine = 64 / sizeof(T) > 0 ? 64 / sizeof(T) : 1;
  std::vector<ZeroBucket> out;
  for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
    auto const& bucket = plan.buckets[b];
    std::int64_t const start = arena.entries()[bucket.params.front()].offset;
    std::int64_t at = start;
    for (auto const p : bucket.params) {  // a bucket's gradients are one contiguous slice (ParameterArena)
      if (arena.entries()[p].offset != at)
        throw ArgumentError(cat("ZeroRedundancyOptimizer: bucket ", b, "'s parameter '", arena.entries()[p].name,
                                "' is not contiguous with the one before it in the arena"));
      at += arena.entries()[p].numel;
    }
    std::int64_t const per_rank = (bucket.numel + world - 1) / world;
    out.push_back({start, bucket.numel, std::max<std::int64_t>(kLine, (per_rank + kLine - 1) / kLine * kLine)});
  }
  return out;
}

// Rank `rank`'s slice of one bucket: arena elements [begin, end), empty (end <= begin) where the bucket is too
// small to reach it.
inline optim::ArenaShard::Range zero_slice(ZeroBucket const& b, int rank) noexcept {
  std::int64_t const lo = b.start + rank * b.chunk;
  return {lo, std::min(b.start + b.numel, lo + b.chunk)};
}

// The arena elements rank `rank` owns: its slice of every bucket (none of a bucket too small to reach it).
inline std::vector<optim::ArenaShard::Range> zero_ranges(std::vector<ZeroBucket> const& buckets, int rank) {
  std::vector<optim::ArenaShard::Range> ranges;
  for (auto const& b : buckets)
    if (auto const r = zero_slice(b, rank); r.begin < r.end) ranges.push_back(r);
  return ranges;
}

// The communication around a ZeRO step, for the sharded optimizer O (constructed over this rank's slices).
template <class O>
class ZeroExchange {
 public:
  virtual ~ZeroExchange() = default;
  // The whole step of this rank's slices, and every rank's parameters made whole (collective when sharded).
  virtual void step(O& inner) = 0;
  // This rank's slices of the parameters in arena elements `window` (no communication): OverlappedOptimizer's part.
  virtual void update(O& inner, optim::ArenaShard::Range window) = 0;
  // Once every window was updated: every rank's parameters made whole (collective when sharded).
  virtual void complete() = 0;
  // Parameter bytes this rank sends per step.
  virtual std::int64_t sent_bytes() const noexcept = 0;
  // What travels, for ZeroRedundancyOptimizer::describe().
  virtual std::string describe() const = 0;
  // What it adds to the optimizer's capabilities (attachment.hpp).
  virtual Capabilities caps() const noexcept = 0;
};

}  // namespace ddp::detail
