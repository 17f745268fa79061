// ArenaShard: the part of a parameter arena an optimizer updates and keeps state for. Unsharded (the default),
// every element; under ZeRO (parallel/zero_redundancy.hpp) each rank owns one slice of every bucket, and its
// optimizer's state buffers hold those slices only, concatenated: 1/world_size of the unsharded state.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ddp/error.hpp"

namespace ddp::optim {

class ArenaShard {
 public:
  // Arena elements [begin, end).
  struct Range {
    std::int64_t begin = 0, end = 0;
  };

  // Every element of the arena: the unsharded optimizer.
  ArenaShard() = default;
  // `ranges`: ascending, disjoint, each non-empty (an empty list: this rank owns nothing).
  explicit ArenaShard(std::vector<Range> ranges) : ranges_(std::move(ranges)), whole_(false) {
    for (std::size_t k = 0; k < ranges_.size(); ++k) {
      auto const& r = ranges_[k];
      if (r.begin < 0 || r.end <= r.begin || (k > 0 && r.begin < ranges_[k - 1].end))
        throw ArgumentError(ddp::detail::cat("ArenaShard: range ", k, " [", r.begin, ", ", r.end,
                                             ") is empty, negative or not after the previous range"));
    }
  }

  bool whole() const noexcept { return whole_; }
  std::vector<Range> const& ranges() const noexcept { return ranges_; }

  // The shard of an arena of `numel` elements: the ranges, clipped (the whole arena when whole()).
  std::vector<Range> resolve(std::int64_t numel) const {
    if (whole_) return numel > 0 ? std::vector<Range>{{0, numel}} : std::vector<Range>{};
    if (!ranges_.empty() && ranges_.back().end > numel)
      throw ArgumentError(ddp::detail::cat("ArenaShard: range [", ranges_.back().begin, ", ", ranges_.back().end,
                                           ") ends past the arena's ", numel, " elements"));
    return ranges_;
  }

 private:
  std::vector<Range> ranges_;
  bool whole_ = true;
};

namespace detail {
// Elements of `ranges`, in all.
inline std::int64_t shard_numel(std::vector<ArenaShard::Range> const& ranges) noexcept {
  std::int64_t n = 0;
  for (auto const& r : ranges) n += r.end - r.begin;
  return n;
}
}  // namespace detail

}  // namespace ddp::optim
