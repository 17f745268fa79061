// Deterministic mode: DistributedDataParallel composed with ExactSum and MicroBatches, whose gradients, and so
// whose weights after any number of steps, are bitwise identical for every world size that divides the
// micro-batch count, for any bucket plan, on every host backend (threads, MPI). Guarantee, costs and what it
// refuses (per-rank dropout seeds, unequal shares, BatchNorm in training mode): docs/deterministic.md.
//
//   DeterministicDataParallel<Model, Comm> ddp(model, comm, {}, {.batching = {.count = 8}});
//   for (auto const& mb : ddp.micro_batches(x, y, {.step = global_step})) backward(loss(ddp(mb), mb.y));
//
// Each rank's x is its contiguous share of the global batch (GlobalBatchSampler gives that split).
#pragma once

#include "ddp/parallel/distributed_data_parallel.hpp"

namespace ddp {

template <nn::Model M, AsyncCommunicator C, GradientBucketer B = SizeCapped>
using DeterministicDataParallel = DistributedDataParallel<M, C, B, ExactSum, MicroBatches>;

}  // namespace ddp
