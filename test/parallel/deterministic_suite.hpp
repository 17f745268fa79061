// Deterministic mode over a backend whose ranks are processes: every run of det_cases::all_runs() must give, on
// every rank, the very bytes a single process gives (rank 0 trains the reference on a one-rank threads group), a
// checkpoint written by a two-rank threads run must resume bit for bit, and each misuse is refused alike on
// every rank. deterministic_mpi_main.cpp (mpirun) and gloo_main.cpp (no MPI) call it; throws on a mismatch.
#pragma once

#include <cstdio>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "test/parallel/deterministic_cases.hpp"

namespace det_cases {

template <class C>
void deterministic_suite(C& comm) {
  int failures = 0;
  // Rank 0's reference bytes go to every rank, which compares its own final weights with them byte for byte.
  auto compare = [&](std::string const& what, std::vector<std::uint8_t> const& got, auto&& reference) {
    std::vector<std::uint8_t> ref = comm.rank() == 0 ? reference() : std::vector<std::uint8_t>();
    std::int64_t size = static_cast<std::int64_t>(ref.size());
    comm.broadcast(std::span(&size, 1), 0);
    std::vector<std::int64_t> words((static_cast<std::size_t>(size) + 7) / 8, 0);
    if (comm.rank() == 0) std::memcpy(words.data(), ref.data(), ref.size());
    comm.broadcast(std::span(words), 0);
    ref.resize(static_cast<std::size_t>(size));
    std::memcpy(ref.data(), words.data(), ref.size());
    std::int64_t worst[2] = {got == ref ? 0 : 1, 0};
    comm.all_reduce(std::span(worst, 2), ddp::ReduceOp::kMax);
    if (comm.rank() == 0)
      std::printf("%-40s world size %d: %s\n", what.c_str(), comm.world_size(),
                  worst[0] == 0 ? "the same bytes as one process, on every rank" : "DIFFERENT");
    failures += worst[0] != 0;
  };
  for (Run const& run : all_runs()) {
    compare(describe(run), train(comm, run), [&] {
      std::vector<std::uint8_t> ref;
      ddp::spawn(1, [&](ddp::ThreadsBackend& c) { ref = train(c, run); });
      return ref;
    });
  }
  // Resume: a checkpoint after 3 of 6 steps, written by 2 thread ranks on every process alike.
  // The same with ZeRO-1 on both sides: the sharded state re-cut for this world size.
  for (auto model : {ModelKind::kMlp, ModelKind::kCnn})
    for (int zero : {0, 1}) {
      Run const run{.model = model, .optimizer = OptKind::kAdamW, .steps = 6, .zero = zero};
      CheckpointData<float> midway;
      ddp::spawn(2, [&](ddp::ThreadsBackend& c) { train(c, run, nullptr, 3, c.rank() == 0 ? &midway : nullptr); });
      compare("resume(ws2 -> this) " + describe(run), train(comm, run, &midway), [&] {
        std::vector<std::uint8_t> ref;
        ddp::spawn(1, [&](ddp::ThreadsBackend& c) {
          ref = train(c, Run{.model = model, .optimizer = run.optimizer, .steps = 6});
        });
        return ref;
      });
    }
  // Misuse: the same clear error on every rank, or made harmless.
  unequal_rows(comm);
  if (comm.world_size() > 1) mismatched_step(comm);
  per_rank_dropout_seeds(comm);
  batch_norm_in_training(comm);
  if (comm.rank() == 0) std::printf("misuse (unequal rows, steps, per-rank dropout seeds, BatchNorm): refused\n");
  if (failures != 0) throw std::runtime_error(ddp::detail::cat(failures, " deterministic runs differ"));
}

}  // namespace det_cases
