// OverlappedOptimizer (parallel/overlapped_update.hpp) written once over any Communicator: run inside doctest on
// the threads backend and under mpirun (ddp_mpi_main.cpp). Each throws std::runtime_error on failure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "test/parallel/zero_cases.hpp"

namespace ddp::test {

// Trains the MLP 8-48-4 for `steps` steps under reduction R, twice in lockstep on this rank: with the optimizer
// stepping after backward, and with OverlappedOptimizer over it (over ZeroRedundancyOptimizer at `zero_stage` when
// it is >= 0), both from the same start on the same rows. Checks, on every rank, after every step:
//  - the overlapped run updated its parameters inside backward (they moved before step(); on one bucket plan or
//    another, at every world size);
//  - after step(), its weights are bitwise the stepping run's, and at the end so is its optimizer state.
template <AsyncCommunicator C, ReductionPolicy R = AverageAllReduce>
void overlapped_matches_step(C& comm, ZeroOpt which, BucketConfig buckets, int steps = 4, R reduction = {},
                             int zero_stage = -1) {
  int const n = comm.world_size(), r = comm.rank();
  std::int64_t const local = 4;
  auto data = make_data(local * n * steps, 8, 4, 37);
  auto plain_model = make_mlp(8, 48, 4, 5);
  auto ov_model = make_mlp(8, 48, 4, 5);
  DistributedDataParallel<Mlp, C, SizeCapped, R> plain_ddp(plain_model, comm, {},
                                                           {.bucketer = SizeCapped{buckets}, .reduction = reduction});
  DistributedDataParallel<Mlp, C, SizeCapped, R> ov_ddp(ov_model, comm, {},
                                                        {.bucketer = SizeCapped{buckets}, .reduction = reduction});
  auto run = [&]<class O, class W>(std::type_identity<O>, std::type_identity<W>, typename W::options_type const& o,
                                   typename O::options_type const& po) {
    O plain(plain_ddp.parameters(), po);
    OverlappedOptimizer<W> ov(ov_ddp, {.optimizer = o});
    expect(ov.updates_in_backward(), detail::cat("rank ", r, ": not attached: ", ov.waits_for()));
    for (int s = 0; s < steps; ++s) {
      Tensor<float> const x = rows(data.x, (s * n + r) * local, local);
      Tensor<float> const y = rows(data.y, (s * n + r) * local, local);
      plain.zero_grad();
      backward(mse_loss(plain_ddp(Var(x)), y));
      plain.step();
      ov.zero_grad();
      auto const before = weights(ov_ddp.parameters());
      backward(mse_loss(ov_ddp(Var(x)), y));
      expect(weights(ov_ddp.parameters()) != before,
             detail::cat("rank ", r, ": step ", s, ": the parameters did not move during backward"));
      ov.step();
      expect(weights(ov_ddp.parameters()) == weights(plain_ddp.parameters()),
             detail::cat("rank ", r, ": after step ", s,
                         " the weights updated bucket by bucket differ from the optimizer's step()"));
    }
    if constexpr (requires { ov.consolidated_state(); })
      expect(ov.consolidated_state() == plain.state(),
             detail::cat("rank ", r, ": the overlapped optimizer's state differs from the stepping one's"));
    else
      expect(ov.state() == plain.state(),
             detail::cat("rank ", r, ": the overlapped optimizer's state differs from the stepping one's"));
  };
  auto both = [&]<class O>(std::type_identity<O>, typename O::options_type const& o) {
    if (zero_stage < 0) {
      run(std::type_identity<O>{}, std::type_identity<O>{}, o, o);
    } else {
      using Z = ZeroRedundancyOptimizer<O, C>;
      run(std::type_identity<O>{}, std::type_identity<Z>{}, {.optimizer = o, .zero = {.stage = zero_stage}}, o);
    }
  };
  if (which == ZeroOpt::kSgdMomentum)
    both(std::type_identity<optim::SGD>{}, {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
  else
    both(std::type_identity<optim::AdamW>{}, {.lr = 1e-2, .weight_decay = 0.01});
}

}  // namespace ddp::test
