// Deterministic mode under mpirun -n N: every run of det_cases::all_runs() trained over MPI must give, on every
// rank, the very bytes a single process gives (rank 0 trains the reference on a one-rank threads group), and a
// checkpoint written by a two-rank threads run must resume here bit for bit. Exits non-zero on a mismatch.
#include <cstdio>
#include <cstring>

#include "ddp/comm/mpi.hpp"
#include "test/parallel/deterministic_cases.hpp"

using namespace det_cases;

int main(int argc, char** argv) {
  return ddp::mpi_main(argc, argv, [](ddp::MpiSession& session) {
    ddp::MpiBackend comm(session);
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
  });
}
