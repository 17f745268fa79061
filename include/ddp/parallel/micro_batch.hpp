// MicroBatch: one forward/backward's share of a rank's batch, as DistributedDataParallel::micro_batches() cuts
// it: views of the inputs and targets (no copy), and the global identity of its first sample. With it, the checks of a
// micro-batch's place in its round and DDP's record of the round in progress (detail::OpenRound).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/autograd/sample_key.hpp"
#include "ddp/error.hpp"
#include "ddp/parallel/attachment.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp {

// Which step a batch belongs to: the training step, the same on every rank (deterministic mode keys dropout
// masks by it and checks that every rank passes the same one).
struct BatchStep {
  std::uint64_t step = 0;
};

template <class X, class Y>
struct MicroBatch {
  X x;                 // its inputs: rows of the rank's batch
  Y y;                 // its targets: the same rows
  SampleKey key;       // the step, and the first row's index in the global batch
  std::int64_t index;  // which of this rank's micro-batches of the step (0-based), in order
  std::int64_t count;  // how many there are
  std::int64_t size() const noexcept { return x.shape().rank() == 0 ? 0 : x.shape()[0]; }
};

namespace detail {
// Counts the scopes open on a counter (DistributedDataParallel's no_sync depth).
class ScopedDepth {
 public:
  explicit ScopedDepth(int& depth) noexcept : depth_(&depth) { ++*depth_; }
  ~ScopedDepth() { --*depth_; }
  ScopedDepth(ScopedDepth const&) = delete;
  ScopedDepth& operator=(ScopedDepth const&) = delete;

 private:
  int* depth_;
};

// Rows [lo, lo + count) of a tensor whose first dimension indexes samples: a view, no copy.
template <class U, MemorySpace S>
Tensor<U, S> rows_of(Tensor<U, S> const& t, std::int64_t lo, std::int64_t count) {
  std::vector<std::int64_t> dims;
  for (int d = 0; d < t.shape().rank(); ++d) dims.push_back(d == 0 ? count : t.shape()[d]);
  std::int64_t const per_row = t.shape().numel_from(1);
  return Tensor<U, S>::view(t.owner(), const_cast<U*>(t.data()) + lo * per_row,
                            Shape::from_range(dims.begin(), dims.end()));
}

// `pieces` micro-batches of rows/pieces rows each; the first's first sample is `first` within the global batch.
// The caller has checked that pieces divides the rows.
template <class X, class Y>
std::vector<MicroBatch<X, Y>> split_rows(X const& x, Y const& y, std::int64_t pieces, std::uint64_t step,
                                         std::int64_t first) {
  std::int64_t const rows = x.shape().rank() == 0 ? 0 : x.shape()[0];
  std::int64_t const m = rows / pieces;
  std::vector<MicroBatch<X, Y>> out;
  out.reserve(static_cast<std::size_t>(pieces));
  for (std::int64_t j = 0; j < pieces; ++j)
    out.push_back({.x = pieces == 1 ? x : rows_of(x, j * m, m),
                   .y = pieces == 1 ? y : rows_of(y, j * m, m),
                   .key = {.step = step, .first_sample = first + j * m},
                   .index = j,
                   .count = pieces});
  return out;
}

// ArgumentError unless `mb` is one of the `per_rank` micro-batches a round of `batching` (its name) cuts.
template <class Mb>
void check_micro_batch(Mb const& mb, std::int64_t per_rank, std::string const& batching) {
  if (mb.count != per_rank || mb.index < 0 || mb.index >= mb.count)
    throw ArgumentError(cat("DistributedDataParallel: micro-batch ", mb.index, " of ", mb.count, " under ", batching,
                            ", which gives each rank ", per_rank,
                            "; forward the micro-batches micro_batches() returns, in order"));
}

// Micro-batch `index` forwarded while `due` is: ArgumentError.
[[noreturn]] inline void refuse_out_of_order(std::int64_t index, std::int64_t due) {
  throw ArgumentError(cat("DistributedDataParallel: micro-batch ", index, " forwarded while micro-batch ", due,
                          " is due; forward and backward each micro-batch in order"));
}

// Rank `rank`'s batch (x, y) cut into `pieces` micro-batches of step `step`: ShapeError when y's rows are not x's
// or, unless `checked` (the caller checked the ranks agree), when `pieces` does not divide them.
template <class X, class Y>
std::vector<MicroBatch<X, Y>> rank_micro_batches(X const& x, Y const& y, std::int64_t pieces, std::uint64_t step,
                                                 int rank, bool checked) {
  std::int64_t const rows = x.shape().rank() == 0 ? 0 : x.shape()[0];
  if (y.shape().rank() == 0 || y.shape()[0] != rows)
    throw ShapeError(cat("DistributedDataParallel: targets of shape ", y.shape(), " for ", rows, " input rows"));
  if (!checked && rows % pieces != 0)
    throw ShapeError(cat("DistributedDataParallel: rank ", rank, "'s batch has ", rows, " rows (shape ", x.shape(),
                         "), which is not ", pieces, " equal micro-batches"));
  return split_rows(x, y, pieces, step, rank * rows);
}
// DistributedDataParallel's synchronised round in progress: which micro-batch's backward is due, what the round was
// agreed to be.
struct OpenRound {
  std::int64_t micro_batch = 0;
  std::int64_t step = -1;
  JoinRound join{};
  std::uint64_t queued_epoch = 0;  // the backward (Node::visit_epoch) that queued end_backward
  std::uint64_t buffers = 0;       // world-size-invariant reductions: the buffers' fingerprint at the start
};

}  // namespace detail

}  // namespace ddp
