// GlobalBatchSampler: the sampler of deterministic training. The epoch's order depends only on the seed and
// the epoch, and each global batch is split into contiguous per-rank shares, so the samples of global batch b
// (and of each of its micro-batches) are the same for every world size.
#pragma once

#include <cstdint>
#include <ostream>
#include <span>
#include <vector>

#include "ddp/data/sampler.hpp"
#include "ddp/error.hpp"

namespace ddp {

// The epoch's order (0..n-1, or the shuffle of Generator(seed + epoch), as DistributedSampler) cut into
// global batches of `global_batch` samples; a tail that fills no whole global batch is dropped. Rank r of R
// takes positions [r·B/R, (r+1)·B/R) of every global batch, so its indices(), read B/R at a time, are its
// shares of global batches 0, 1, 2, ... R must divide B. Every rank gets the same number of batches.
class GlobalBatchSampler {
 public:
  GlobalBatchSampler(std::int64_t dataset_size, std::int64_t global_batch, int num_replicas, int rank,
                     SamplerOptions const& opts = {})
      : n_(dataset_size), batch_(global_batch), replicas_(num_replicas), rank_(rank), opts_(opts) {
    detail::check_dataset_size(n_, "GlobalBatchSampler");
    detail::check_replicas(num_replicas, rank, "GlobalBatchSampler");
    if (batch_ < 1 || batch_ % replicas_ != 0)
      throw ArgumentError(detail::cat("GlobalBatchSampler: global_batch ", batch_,
                                      " must be a positive multiple of num_replicas ", replicas_));
    rebuild();
  }
  template <detail::RankedGroup C>
  GlobalBatchSampler(std::int64_t dataset_size, std::int64_t global_batch, C const& comm,
                     SamplerOptions const& opts = {})
      : GlobalBatchSampler(dataset_size, global_batch, comm.world_size(), comm.rank(), opts) {}

  void set_epoch(std::int64_t epoch) {
    if (epoch < 0) throw ArgumentError(detail::cat("GlobalBatchSampler::set_epoch: epoch ", epoch, " is negative"));
    epoch_ = epoch;
    rebuild();
  }
  std::span<std::int64_t const> indices() const noexcept { return indices_; }
  std::int64_t size() const noexcept { return static_cast<std::int64_t>(indices_.size()); }
  // Global batches per epoch, and this rank's samples of each.
  std::int64_t batches() const noexcept { return n_ / batch_; }
  std::int64_t local_batch() const noexcept { return batch_ / replicas_; }
  std::int64_t epoch() const noexcept { return epoch_; }

  friend std::ostream& operator<<(std::ostream& os, GlobalBatchSampler const& s) {
    return os << "GlobalBatchSampler{n=" << s.n_ << ", global_batch=" << s.batch_ << ", num_replicas=" << s.replicas_
              << ", rank=" << s.rank_ << ", shuffle=" << (s.opts_.shuffle ? "true" : "false")
              << ", seed=" << s.opts_.seed << ", epoch=" << s.epoch_ << "}";
  }

 private:
  void rebuild() {
    auto const order = detail::epoch_order(
        n_, {.shuffle = opts_.shuffle, .seed = opts_.seed, .epoch = static_cast<std::uint64_t>(epoch_)},
        "GlobalBatchSampler");
    std::int64_t const share = batch_ / replicas_;
    indices_.clear();
    indices_.reserve(static_cast<std::size_t>(batches() * share));
    for (std::int64_t b = 0; b < batches(); ++b)
      for (std::int64_t i = 0; i < share; ++i)
        indices_.push_back(order[static_cast<std::size_t>(b * batch_ + rank_ * share + i)]);
  }

  std::int64_t n_;
  std::int64_t batch_;
  int replicas_;
  int rank_;
  SamplerOptions opts_;
  std::int64_t epoch_ = 0;
  std::vector<std::int64_t> indices_;
};

}  // namespace ddp
