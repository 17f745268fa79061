// DataLoader: cuts a sampler's index list into batches and collates each through the Dataset; and the
// per-epoch check that every rank has as many batches (require_even_batches).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/data/dataset.hpp"
#include "ddp/data/sampler.hpp"
#include "ddp/error.hpp"

namespace ddp {

struct LoaderOptions {
  std::int64_t batch_size = 1;  // samples per batch (per rank, under a DistributedSampler)
  bool drop_last = false;       // drop the final batch when it has fewer than batch_size samples (PyTorch's)
};

// torch.utils.data.DataLoader without worker processes: batch i holds indices[i·B, min((i+1)·B, n)) of the
// index list it was built from (a copy, so the sampler may move to its next epoch meanwhile), collated by
// the dataset. Batches are made on demand: batch(i) and iteration allocate one x and one y tensor each,
// cost O(B · sample size), and are deterministic. The loader keeps a reference to the dataset, which must
// outlive it. batch(i) is const and may be called from several threads at once when the dataset's collate
// may (TensorDataset's can).
//
//   sampler.set_epoch(epoch);
//   for (auto const& b : DataLoader(dataset, sampler, {.batch_size = 32, .drop_last = true})) step(b.x, b.y);
template <Dataset D>
class DataLoader {
 public:
  using batch_type = batch_t<D>;

  DataLoader(D const& dataset, std::span<std::int64_t const> indices, LoaderOptions const& opts)
      : dataset_(&dataset), indices_(indices.begin(), indices.end()), opts_(opts) {
    if (opts_.batch_size < 1)
      throw ArgumentError(detail::cat("DataLoader: batch_size = ", opts_.batch_size, " must be at least 1"));
    std::int64_t const n = static_cast<std::int64_t>(indices_.size());
    std::int64_t const size = static_cast<std::int64_t>(dataset.size());
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t const k = indices_[static_cast<std::size_t>(i)];
      if (k < 0 || k >= size)
        throw ArgumentError(detail::cat("DataLoader: index ", k, " at position ", i,
                                        " of the index list is outside the dataset's [0, ", size, ")"));
    }
    num_batches_ = opts_.drop_last ? n / opts_.batch_size : (n + opts_.batch_size - 1) / opts_.batch_size;
  }

  template <Sampler S>
  DataLoader(D const& dataset, S const& sampler, LoaderOptions const& opts)
      : DataLoader(dataset, std::span<std::int64_t const>(sampler.indices()), opts) {}

  std::int64_t num_batches() const noexcept { return num_batches_; }
  std::int64_t batch_size() const noexcept { return opts_.batch_size; }
  // Number of samples the batches cover (the index list, less a dropped tail).
  std::int64_t num_samples() const noexcept {
    return num_batches_ == 0
               ? 0
               : std::min<std::int64_t>(static_cast<std::int64_t>(indices_.size()), num_batches_ * opts_.batch_size);
  }

  // The dataset indices of batch i.
  std::span<std::int64_t const> batch_indices(std::int64_t i) const {
    if (i < 0 || i >= num_batches_)
      throw ArgumentError(detail::cat("DataLoader: batch ", i, " is outside [0, ", num_batches_, ")"));
    std::size_t const first = static_cast<std::size_t>(i * opts_.batch_size);
    std::size_t const count = std::min(static_cast<std::size_t>(opts_.batch_size), indices_.size() - first);
    return std::span<std::int64_t const>(indices_).subspan(first, count);
  }

  batch_type batch(std::int64_t i) const { return dataset_->collate(batch_indices(i)); }

  // Input iterator over the batches; dereferencing collates (returns the batch by value).
  class iterator {
   public:
    using value_type = batch_type;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;

    iterator() = default;
    iterator(DataLoader const* loader, std::int64_t i) : loader_(loader), i_(i) {}
    batch_type operator*() const { return loader_->batch(i_); }
    iterator& operator++() {
      ++i_;
      return *this;
    }
    void operator++(int) { ++i_; }
    friend bool operator==(iterator const& a, iterator const& b) noexcept { return a.i_ == b.i_; }
    std::int64_t index() const noexcept { return i_; }

   private:
    DataLoader const* loader_ = nullptr;
    std::int64_t i_ = 0;
  };

  iterator begin() const { return {this, 0}; }
  iterator end() const { return {this, num_batches_}; }

  // Batches [first, last) of one epoch: what from() returns. A plain range (begin, end, size, empty) rather
  // than std::ranges::subrange, which Clang before 16 cannot instantiate with libstdc++ 12's <ranges>.
  class batch_range {
   public:
    batch_range(iterator first, iterator last) : first_(first), last_(last) {}
    iterator begin() const { return first_; }
    iterator end() const { return last_; }
    std::int64_t size() const noexcept { return last_.index() - first_.index(); }
    bool empty() const noexcept { return size() == 0; }

   private:
    iterator first_, last_;
  };

  // Batches first_batch, ..., num_batches() - 1: resuming an epoch part-way (e.g. after a checkpoint saved
  // mid-epoch) visits exactly the batches an uninterrupted run would have.
  batch_range from(std::int64_t first_batch) const {
    if (first_batch < 0 || first_batch > num_batches_)
      throw ArgumentError(detail::cat("DataLoader::from: batch ", first_batch, " is outside [0, ", num_batches_, "]"));
    return {iterator(this, first_batch), end()};
  }

 private:
  D const* dataset_;
  std::vector<std::int64_t> indices_;
  LoaderOptions opts_;
  std::int64_t num_batches_ = 0;
};

// Every rank's number of batches for the coming epoch, in rank order (collective: each rank passes its own).
template <Communicator C>
std::vector<std::int64_t> gather_batch_counts(C& comm, std::int64_t batches) {
  std::vector<std::int64_t> const mine{batches};
  std::vector<std::int64_t> all(static_cast<std::size_t>(comm.world_size()));
  host_all_gather(comm, std::span<std::int64_t const>(mine), std::span<std::int64_t>(all),
                  CollectiveTag{"data.batch_counts"});
  return all;
}

namespace detail {
// Throws the uneven-inputs DdpError when `counts` (every rank's, as gather_batch_counts returns them) differ.
// Built from the counts alone, so every rank raises the same message.
inline void check_even_batches(std::span<std::int64_t const> counts) {
  if (counts.empty() || std::all_of(counts.begin(), counts.end(), [&](std::int64_t c) { return c == counts[0]; }))
    return;
  std::int64_t const fewest = *std::min_element(counts.begin(), counts.end());
  std::string list, short_ranks;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    list += cat(r ? ", " : "", "rank ", r, ": ", counts[r]);
    if (counts[r] == fewest) short_ranks += cat(short_ranks.empty() ? "" : ", ", r);
  }
  throw DdpError(cat("uneven inputs: the ranks have different numbers of batches this epoch (", list, "); rank(s) ",
                     short_ranks, " would run out after ", fewest,
                     " steps while the others wait for them in the next step's all-reduce. Every rank raises this "
                     "error. Give every rank as many batches (the same dataset size; DistributedSampler pads to equal "
                     "shares), or train inside ddp::join (<ddp/parallel/join.hpp>; with basic_trainer: "
                     "TrainerOptions{.split = EpochSplit::kJoin}), where ranks that run out shadow the others."));
}
}  // namespace detail

// Collective, at the start of an epoch of a hand-written loop: raises the same DdpError on every rank, naming
// each rank's count and the ranks that would run out first, when ranks have different numbers of batches,
// instead of leaving the others waiting at the step where the first runs out. One all-gather of one word per
// rank. basic_trainer calls it every epoch; ddp::join makes uneven counts legal instead.
template <Communicator C>
void require_even_batches(C& comm, std::int64_t batches) {
  detail::check_even_batches(gather_batch_counts(comm, batches));
}

}  // namespace ddp
