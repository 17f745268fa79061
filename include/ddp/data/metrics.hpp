// Evaluation counts (correct, total, loss sum), argmax accuracy, and their exact all-reduce over any Communicator.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"
#include "ddp/tensor/space_span.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp {

// Running evaluation totals of one rank, or of all ranks after all_reduce_counts. With an EvalSampler every
// sample is counted exactly once over the ranks, so the reduced accuracy equals single-process accuracy
// exactly (integer sums). loss_sum is a sum of per-sample losses (a batch's mean loss times its size).
struct Counts {
  std::int64_t correct = 0;
  std::int64_t total = 0;
  double loss_sum = 0;

  // Adds one batch: `correct` right predictions among `batch_size` samples whose mean loss was `mean_loss`.
  void add_batch(std::int64_t batch_correct, std::int64_t batch_size, double mean_loss = 0) {
    correct += batch_correct;
    total += batch_size;
    loss_sum += mean_loss * static_cast<double>(batch_size);
  }
  Counts& operator+=(Counts const& o) noexcept {
    correct += o.correct;
    total += o.total;
    loss_sum += o.loss_sum;
    return *this;
  }
  // correct / total (0 when nothing was counted).
  double accuracy() const noexcept { return total ? static_cast<double>(correct) / static_cast<double>(total) : 0.0; }
  // loss_sum / total (0 when nothing was counted).
  double mean_loss() const noexcept { return total ? loss_sum / static_cast<double>(total) : 0.0; }
  friend bool operator==(Counts const&, Counts const&) = default;
};

// One rank's share of an epoch's train loss so far: what basic_trainer's loss meter (train/loss_meter.hpp) has
// added up, and what a checkpoint taken mid-epoch carries so that the resumed run reports the whole epoch's loss.
struct EpochLoss {
  Counts train{};                // per-sample losses (loss_sum, total; correct stays 0)
  double exact_total = 0;        // world-size-invariant reductions: every rank's micro-batch losses so far, added in
  std::int64_t exact_count = 0;  // the global batch's order (the same on every rank), and how many
  friend bool operator==(EpochLoss const&, EpochLoss const&) = default;
};

// Sums every rank's Counts; returns the same totals on every rank. Two blocking all-reduces (int64[2] and
// double[1]), so like any collective it must be called by all ranks in the same order. correct and total
// are exact; loss_sum is summed in the backend's order (deterministic for ThreadsBackend and MPI; it may
// differ from a single-process sum in the last bits).
template <Communicator C>
Counts all_reduce_counts(C& comm, Counts const& local) {
  std::array<std::int64_t, 2> n{local.correct, local.total};
  std::array<double, 1> loss{local.loss_sum};
  host_all_reduce(comm, std::span<std::int64_t>(n), ReduceOp::kSum);
  host_all_reduce(comm, std::span<double>(loss), ReduceOp::kSum);
  return {.correct = n[0], .total = n[1], .loss_sum = loss[0]};
}

// Row-wise argmax of host logits (B, C) as int32 class ids (B). Ties go to the lowest class; a NaN counts as
// larger than any number (as torch.argmax), so a row with a NaN predicts its first NaN. O(B · C).
inline Tensor<std::int32_t> argmax_rows(Tensor<float> const& logits) {
  if (logits.rank() != 2 || logits.size(1) < 1)
    throw ShapeError(detail::cat("argmax_rows: logits must have shape (B, C) with C >= 1, got ", logits.shape()));
  std::int64_t const b = logits.size(0), c = logits.size(1);
  Tensor<std::int32_t> out(Shape{b});
  for (std::int64_t i = 0; i < b; ++i) {
    float const* row = logits.data() + i * c;
    std::int64_t best = 0;
    for (std::int64_t j = 1; j < c && !std::isnan(row[best]); ++j)
      if (row[j] > row[best] || std::isnan(row[j])) best = j;
    out[i] = static_cast<std::int32_t>(best);
  }
  return out;
}

// Number of rows of logits (B, C) whose argmax (as argmax_rows) equals the target class (B). Throws
// ShapeError for mismatched shapes and ArgumentError for a target outside [0, C). O(B · C).
inline std::int64_t argmax_correct(Tensor<float> const& logits, Tensor<std::int32_t> const& targets) {
  if (logits.rank() != 2 || targets.rank() != 1 || logits.size(0) != targets.size(0))
    throw ShapeError(detail::cat("argmax_correct: logits ", logits.shape(), " and targets ", targets.shape(),
                                 " must have shapes (B, C) and (B)"));
  auto const pred = argmax_rows(logits);
  std::int64_t const c = logits.size(1);
  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < targets.numel(); ++i) {
    if (targets[i] < 0 || targets[i] >= c)
      throw ArgumentError(detail::cat("argmax_correct: target ", targets[i], " at row ", i, " is outside [0, ", c,
                                      ") for logits of shape ", logits.shape()));
    correct += pred[i] == targets[i];
  }
  return correct;
}

}  // namespace ddp
