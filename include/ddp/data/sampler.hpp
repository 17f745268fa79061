// Samplers: which sample indices a rank visits, in which order (Distributed, Eval, Sequential, Random).
#pragma once

#include <concepts>
#include <cstdint>
#include <limits>
#include <numeric>
#include <ostream>
#include <span>
#include <string_view>
#include <vector>

#include "ddp/error.hpp"
#include "ddp/tensor/random.hpp"

namespace ddp {

// A sampler: the list of sample indices one rank visits this epoch, in order.
//   s.indices()   contiguous int64 indices into the dataset (valid until the sampler changes, e.g. set_epoch)
//   s.size()      indices().size()
template <class S>
concept Sampler = requires(S const& s) {
  { s.indices() } -> std::convertible_to<std::span<std::int64_t const>>;
  { s.size() } -> std::convertible_to<std::int64_t>;
};

namespace detail {

// What samplers need of a communicator: its rank and world size.
template <class C>
concept RankedGroup = requires(C const& c) {
  { c.rank() } -> std::convertible_to<int>;
  { c.world_size() } -> std::convertible_to<int>;
};

inline void check_dataset_size(std::int64_t n, std::string_view who) {
  if (n < 0) throw ArgumentError(detail::cat(who, ": dataset size ", n, " is negative"));
}

inline void check_replicas(int num_replicas, int rank, std::string_view who) {
  if (num_replicas < 1) throw ArgumentError(detail::cat(who, ": num_replicas = ", num_replicas, " must be at least 1"));
  if (rank < 0 || rank >= num_replicas)
    throw ArgumentError(
        detail::cat(who, ": rank ", rank, " is outside [0, ", num_replicas, ") (num_replicas = ", num_replicas, ")"));
}

// Which order an epoch visits 0..n-1 in: as is, or Fisher-Yates shuffled with Generator(seed + epoch).
struct EpochOrder {
  bool shuffle = false;
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;
};

// 0..n-1 in the order `o` says (see DistributedSampler); `who` names the sampler in errors.
inline std::vector<std::int64_t> epoch_order(std::int64_t n, EpochOrder const& o, std::string_view who) {
  if (o.shuffle && n > std::int64_t{std::numeric_limits<std::uint32_t>::max()})
    throw ArgumentError(detail::cat(who, ": cannot shuffle ", n, " samples; at most 2^32 - 1 are supported"));
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  if (o.shuffle) Generator(o.seed + o.epoch).shuffle(order.begin(), order.end());
  return order;
}

}  // namespace detail

// Options of DistributedSampler and RandomSampler (PyTorch's defaults).
struct SamplerOptions {
  bool shuffle = true;     // permute every epoch (with Generator(seed + epoch))
  std::uint64_t seed = 0;  // must be the same on every rank
  bool drop_last = false;  // drop the tail so every rank gets floor(n / R) samples, instead of padding up
  // Without drop_last: pad the tail by repeating samples so every rank gets ceil(n / R) (PyTorch's). false:
  // no padding; every sample is visited exactly once and ranks' sizes differ by at most one (uneven inputs:
  // train under ddp::join). Ignored with drop_last.
  bool pad = true;
};

// torch.utils.data.DistributedSampler, with the same index lists:
//   total_size = drop_last ? floor(n / R) * R : ceil(n / R) * R
//   the epoch's order (0..n-1, or a permutation when shuffling) is cut to total_size, or padded up to it by
//   repeating from its head (cyclically, as many times as needed when n < R);
//   rank r takes positions r, r + R, r + 2R, ... of that list, so size() == total_size / R on every rank.
// With pad = false (and no drop_last) the list is not padded: total_size = n, rank r takes positions
// r, r + R, ... < n, so the first n mod R ranks hold one sample more (uneven inputs: see ddp::join).
// Without shuffle the lists equal PyTorch's exactly. With shuffle the permutation is a Fisher-Yates shuffle
// driven by ddp::Generator(seed + epoch) (PCG32): deterministic and bitwise identical on every rank, compiler
// and platform, but NOT torch.randperm's permutation. Ranks must use the same seed and epoch; their lists are
// then disjoint and (without drop_last) cover every sample, padding aside.
// Cost: O(n) time and O(n) temporary memory per set_epoch; indices() is O(1). Not thread-safe to mutate.
class DistributedSampler {
 public:
  DistributedSampler(std::int64_t dataset_size, int num_replicas, int rank, SamplerOptions const& opts = {})
      : n_(dataset_size), replicas_(num_replicas), rank_(rank), opts_(opts) {
    detail::check_dataset_size(n_, "DistributedSampler");
    detail::check_replicas(num_replicas, rank, "DistributedSampler");
    std::int64_t const r = replicas_;
    num_samples_ = opts_.drop_last ? n_ / r : (n_ + r - 1) / r;
    total_size_ = num_samples_ * r;
    if (!opts_.drop_last && !opts_.pad) {
      total_size_ = n_;
      num_samples_ = n_ > rank_ ? (n_ - rank_ + r - 1) / r : 0;
    }
    rebuild();
  }

  // Takes num_replicas and rank from a communicator (anything with rank() and world_size()).
  template <detail::RankedGroup C>
  DistributedSampler(std::int64_t dataset_size, C const& comm, SamplerOptions const& opts = {})
      : DistributedSampler(dataset_size, comm.world_size(), comm.rank(), opts) {}

  // Selects the epoch's permutation (only matters with shuffle); call it with the same value on every rank
  // before each epoch, as with PyTorch.
  void set_epoch(std::int64_t epoch) {
    if (epoch < 0) throw ArgumentError(detail::cat("DistributedSampler::set_epoch: epoch ", epoch, " is negative"));
    epoch_ = epoch;
    rebuild();
  }

  std::span<std::int64_t const> indices() const noexcept { return indices_; }
  std::int64_t size() const noexcept { return num_samples_; }
  // Samples over all ranks this epoch (padding included).
  std::int64_t total_size() const noexcept { return total_size_; }
  std::int64_t dataset_size() const noexcept { return n_; }
  std::int64_t epoch() const noexcept { return epoch_; }
  int num_replicas() const noexcept { return replicas_; }
  int rank() const noexcept { return rank_; }
  SamplerOptions const& options() const noexcept { return opts_; }

  // For logs: what was composed, e.g. DistributedSampler{n=100, num_replicas=2, rank=0, shuffle=true, ...}.
  friend std::ostream& operator<<(std::ostream& os, DistributedSampler const& s) {
    return os << "DistributedSampler{n=" << s.n_ << ", num_replicas=" << s.replicas_ << ", rank=" << s.rank_
              << ", shuffle=" << (s.opts_.shuffle ? "true" : "false") << ", seed=" << s.opts_.seed
              << ", drop_last=" << (s.opts_.drop_last ? "true" : "false") << (s.opts_.pad ? "" : ", pad=false")
              << ", epoch=" << s.epoch_ << "}";
  }

 private:
  void rebuild() {
    auto const order = detail::epoch_order(
        n_, {.shuffle = opts_.shuffle, .seed = opts_.seed, .epoch = static_cast<std::uint64_t>(epoch_)},
        "DistributedSampler");
    indices_.resize(static_cast<std::size_t>(num_samples_));
    // Position p of the padded list is order[p mod n] (padding repeats from the head); n == 0 gives no samples.
    for (std::int64_t i = 0; i < num_samples_; ++i) {
      std::int64_t const p = rank_ + i * replicas_;
      indices_[static_cast<std::size_t>(i)] = order[static_cast<std::size_t>(p % n_)];
    }
  }

  std::int64_t n_;
  int replicas_;
  int rank_;
  SamplerOptions opts_;
  std::int64_t num_samples_ = 0;
  std::int64_t total_size_ = 0;
  std::int64_t epoch_ = 0;
  std::vector<std::int64_t> indices_;
};

// For distributed evaluation: rank r takes r, r + R, r + 2R, ... < n, no padding and no shuffle, so across
// ranks every sample is visited exactly once (sizes differ by at most one between ranks). Pair it with
// all_reduce_counts (metrics.hpp) for exact accuracy. O(n / R) time and memory.
class EvalSampler {
 public:
  EvalSampler(std::int64_t dataset_size, int num_replicas, int rank)
      : n_(dataset_size), replicas_(num_replicas), rank_(rank) {
    detail::check_dataset_size(n_, "EvalSampler");
    detail::check_replicas(num_replicas, rank, "EvalSampler");
    for (std::int64_t i = rank; i < n_; i += num_replicas) indices_.push_back(i);
  }
  template <detail::RankedGroup C>
  EvalSampler(std::int64_t dataset_size, C const& comm) : EvalSampler(dataset_size, comm.world_size(), comm.rank()) {}

  std::span<std::int64_t const> indices() const noexcept { return indices_; }
  std::int64_t size() const noexcept { return static_cast<std::int64_t>(indices_.size()); }
  std::int64_t dataset_size() const noexcept { return n_; }

  friend std::ostream& operator<<(std::ostream& os, EvalSampler const& s) {
    return os << "EvalSampler{n=" << s.n_ << ", num_replicas=" << s.replicas_ << ", rank=" << s.rank_ << "}";
  }

 private:
  std::int64_t n_;
  int replicas_;
  int rank_;
  std::vector<std::int64_t> indices_;
};

// 0, 1, ..., n-1 (torch's SequentialSampler). O(n) memory.
class SequentialSampler {
 public:
  explicit SequentialSampler(std::int64_t dataset_size) {
    detail::check_dataset_size(dataset_size, "SequentialSampler");
    indices_ = detail::epoch_order(dataset_size, {}, "SequentialSampler");
  }
  std::span<std::int64_t const> indices() const noexcept { return indices_; }
  std::int64_t size() const noexcept { return static_cast<std::int64_t>(indices_.size()); }

 private:
  std::vector<std::int64_t> indices_;
};

struct RandomSamplerOptions {
  std::uint64_t seed = 0;
};

// A permutation of 0..n-1 per epoch, single process: the same portable Fisher-Yates with
// Generator(seed + epoch) as DistributedSampler (so it equals DistributedSampler with one replica and
// shuffle on). Not torch's RandomSampler permutation. O(n) per set_epoch.
class RandomSampler {
 public:
  explicit RandomSampler(std::int64_t dataset_size, RandomSamplerOptions const& opts = {})
      : sampler_(dataset_size, 1, 0, {.shuffle = true, .seed = opts.seed, .drop_last = false}) {}
  void set_epoch(std::int64_t epoch) { sampler_.set_epoch(epoch); }
  std::span<std::int64_t const> indices() const noexcept { return sampler_.indices(); }
  std::int64_t size() const noexcept { return sampler_.size(); }
  std::int64_t epoch() const noexcept { return sampler_.epoch(); }

 private:
  DistributedSampler sampler_;
};

static_assert(Sampler<DistributedSampler>);
static_assert(Sampler<EvalSampler>);
static_assert(Sampler<SequentialSampler>);
static_assert(Sampler<RandomSampler>);

}  // namespace ddp
