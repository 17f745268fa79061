// The SyncBatchNorm scenarios of sync_batch_norm_cases.hpp as one run over a backend whose ranks are processes:
// sync_batch_norm_mpi_main.cpp (mpirun) and test/parallel/gloo_main.cpp (no MPI) call it. Throws (via expect) on
// the first scenario that fails on this rank.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>

#include "test/nn/sync_batch_norm_cases.hpp"

namespace ddp::test::sbn {

template <class C>
void sync_batch_norm_suite(C& comm) {
  double worst_float = 0, worst_double = 0, worst_ddp = 0;
  for (BatchSplit split : {BatchSplit::kRankPlusOne, BatchSplit::kTwoRankPlusOne, BatchSplit::kNoneOnRankOne}) {
    LayerDiffs const f = layer_equivalence<float>(comm, split);
    expect(f.max() <= 2e-6, "float layer vs reference (" + name(split) + "): " + f.str());
    LayerDiffs const d = layer_equivalence<double>(comm, split);
    expect(d.max() <= 1e-12, "double layer vs reference (" + name(split) + "): " + d.str());
    worst_float = std::max(worst_float, f.max());
    worst_double = std::max(worst_double, d.max());
    if (comm.rank() == 0)
      std::printf("split %s: float %s; double max %.3g\n", name(split).c_str(), f.str().c_str(), d.max());
  }
  LayerDiffs const far = layer_equivalence<double>(comm, BatchSplit::kTwoRankPlusOne, 2, 1e6);
  expect(far.max() <= 1e-9, "double layer, values around 1e6: " + far.str());
  for (BatchSplit split : {BatchSplit::kRankPlusOne, BatchSplit::kTwoRankPlusOne})
    for (bool broadcast : {true, false}) {
      DdpDiffs const d = ddp_equivalence(comm, split, {.broadcast_buffers = broadcast});
      expect(d.max() <= 2e-6, "DDP vs one process (" + name(split) + "): " + d.str());
      worst_ddp = std::max(worst_ddp, d.max());
      if (comm.rank() == 0)
        std::printf("DDP split %s, broadcast_buffers %d: %s\n", name(split).c_str(), int(broadcast), d.str().c_str());
    }
  channel_mismatch(comm);
  too_few_values(comm);
  bad_input_shapes(comm);
  if (comm.rank() == 0)
    std::printf(
        "sync batch norm %s tests passed on %d ranks (max relative differences: float %.3g, double %.3g, "
        "DDP %.3g)\n",
        std::string(C::backend_name).c_str(), comm.world_size(), worst_float, worst_double, worst_ddp);
}

}  // namespace ddp::test::sbn
