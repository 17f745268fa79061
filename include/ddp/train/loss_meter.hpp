// The train loss of one epoch as basic_trainer accounts it: each micro-batch's loss is read on the host at once, or,
// every read_every-th step, all the losses since the last read in one copy (on a device the host then waits once per
// read_every steps, not every step). A step that did not step (skipped for non-finite gradients) is not counted. The
// epoch's figures over all ranks come from finish(), collectively; snapshot() is what a mid-epoch checkpoint keeps
// (EpochLoss), and a meter started from it ends with the uninterrupted epoch's figures: bitwise at the same world
// size, exactly for world-size-invariant reductions at any, to rounding otherwise.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "ddp/autograd/variable.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/data/metrics.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

struct LossMeterOptions {
  std::int64_t read_every = 1;  // TrainerOptions::loss_every
  // World-size-invariant reductions: keep every micro-batch loss, for the epoch mean in the global batch's order.
  std::int64_t micro_batches_per_rank = 0;  // 0: not kept
};

template <class T, MemorySpace S>
class basic_loss_meter {
 public:
  // `prior`: this rank's share of the epoch before this meter (a checkpoint's; empty for a fresh epoch).
  basic_loss_meter(LossMeterOptions opts, EpochLoss const& prior) : opts_(opts), sum_(prior) {}

  // One micro-batch's loss (a scalar), in order.
  void add(Variable<T, S> const& loss) {
    if (opts_.read_every <= 1) {
      items_.push_back(loss.item());
      return;
    }
    if (capacity_ < count_ + 1) {  // room for read_every steps of micro-batches, doubled when outgrown
      std::int64_t const capacity =
          std::max<std::int64_t>(2 * capacity_, opts_.read_every * std::max<std::int64_t>(1, step_parts_ + 1));
      Tensor<T, S> grown(Shape{capacity});
      if (count_ > 0) Kernels<S>::copy(count_, unread_.data(), grown.data());
      unread_ = std::move(grown);
      capacity_ = capacity;
    }
    Kernels<S>::copy(std::int64_t{1}, loss.value().data(), unread_.data() + count_);
    ++count_;
    ++step_parts_;
  }

  // Closes a step of `batch_size` samples: counted when `stepped`; read now when `read_now` (or when every step is).
  void end_step(std::int64_t batch_size, bool stepped, bool read_now) {
    if (opts_.read_every <= 1) {
      last_ = account(batch_size, stepped, items_.data(), static_cast<std::int64_t>(items_.size()));
      items_.clear();
      return;
    }
    pending_.push_back({batch_size, step_parts_, stepped});
    step_parts_ = 0;
    if (read_now) read();
  }

  // Reads every loss not yet read, in one copy.
  void read() {
    if (count_ == 0) return;
    host_.resize(static_cast<std::size_t>(count_));
    Kernels<S>::to_host(count_, unread_.data(), host_.data());
    items_.assign(host_.begin(), host_.end());
    std::int64_t at = 0;
    for (auto const& p : pending_) {
      last_ = account(p.batch_size, p.stepped, items_.data() + at, p.parts);
      at += p.parts;
    }
    items_.clear();
    pending_.clear();
    count_ = 0;
  }

  // The mean loss of the latest step read (what an after-step hook sees between reads).
  double last() const noexcept { return last_; }

  // This rank's share so far, with (for world-size-invariant reductions) every rank's micro-batch losses added in
  // the global batch's order: collective (one all-gather). Reads what is unread first.
  template <Communicator C>
  EpochLoss snapshot(C& comm) {
    read();
    EpochLoss s = sum_;
    if (opts_.micro_batches_per_rank > 0) add_in_global_order(comm, s);
    return s;
  }

  // The epoch's per-sample counts over all ranks (Counts::mean_loss() is the epoch's train loss): collective
  // (all-reduces; an all-gather for world-size-invariant reductions, whose loss sum is then the exact mean of every
  // micro-batch's loss, added in the global batch's order, times the sample count: the same bits at every world size).
  template <Communicator C>
  Counts finish(C& comm) {
    read();
    Counts train = all_reduce_counts(comm, sum_.train);
    if (opts_.micro_batches_per_rank > 0) {
      EpochLoss all = sum_;
      add_in_global_order(comm, all);
      if (all.exact_count > 0)
        train.loss_sum = all.exact_total / static_cast<double>(all.exact_count) * static_cast<double>(train.total);
    }
    return train;
  }

 private:
  struct Pending {
    std::int64_t batch_size, parts;
    bool stepped;
  };

  double account(std::int64_t batch_size, bool stepped, double const* items, std::int64_t parts) {
    double lv = 0;
    for (std::int64_t i = 0; i < parts; ++i) {
      lv += items[i];
      if (opts_.micro_batches_per_rank > 0) micro_.push_back(items[i]);
    }
    lv /= static_cast<double>(parts);
    if (stepped) sum_.train.add_batch(0, batch_size, lv);  // not a skipped step's (it may be the Inf that caused it)
    return lv;
  }

  // Adds every rank's micro-batch losses of this meter to s.exact_total in the global batch's order (step, then
  // rank, then micro-batch): the same bits for every world size. One all-gather.
  template <Communicator C>
  void add_in_global_order(C& comm, EpochLoss& s) const {
    int const n = comm.world_size();
    std::vector<double> all(micro_.size() * static_cast<std::size_t>(n));
    host_all_gather(comm, std::span<double const>(micro_), std::span<double>(all));
    std::size_t const per = static_cast<std::size_t>(opts_.micro_batches_per_rank);
    std::size_t const steps = micro_.size() / per;
    for (std::size_t st = 0; st < steps; ++st)
      for (int rk = 0; rk < n; ++rk)
        for (std::size_t j = 0; j < per; ++j)
          s.exact_total += all[static_cast<std::size_t>(rk) * micro_.size() + st * per + j];
    s.exact_count += static_cast<std::int64_t>(steps * per * static_cast<std::size_t>(n));
  }

  LossMeterOptions opts_;
  EpochLoss sum_;                 // this rank's share: the prior's, plus what this meter counted
  std::vector<double> micro_;     // this meter's micro-batch losses (world-size-invariant reductions)
  std::vector<double> items_;     // the losses being accounted (reused)
  std::vector<T> host_;           // the losses read at once (reused)
  std::vector<Pending> pending_;  // steps whose losses are not read yet
  Tensor<T, S> unread_;           // their losses, on the device
  std::int64_t count_ = 0, capacity_ = 0, step_parts_ = 0;
  double last_ = 0;
};

}  // namespace ddp
