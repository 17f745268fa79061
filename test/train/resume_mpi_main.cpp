// The resume scenarios of resume_cases.hpp under mpirun (MpiBackend): run by mpi_test with -n 2 and -n 4.
// Besides the shared scenarios, a checkpoint written by all ranks is resumed by the first half of them (a
// communicator split off the world) and the other way round. Exits 0 when every check passes on every
// rank; a failing rank aborts the job with its message.
#include <mpi.h>

#include <cstdio>

#include "ddp/comm/mpi.hpp"
#include "test/train/resume_cases.hpp"

using namespace ddp::test::resume;

int main(int argc, char** argv) {
  ddp::MpiSession session(argc, argv);
  try {
    ddp::MpiBackend comm(session);
    int const n = comm.world_size(), r = comm.rank();
    auto const dir = shared_temp_dir(comm, "resume_mpi");

    // Bitwise: MPICH's sums are deterministic for a given world size and message size, and this model's
    // buckets are all small enough for one reduction algorithm (with more than two ranks, a plan whose buckets
    // straddle MPICH's short/long message threshold could group the ranks' sums differently).
    double const buckets = resume_with_other_buckets(comm, dir);
    expect(buckets == 0.0,
           "resume with another bucket plan differs from the uninterrupted run by " + std::to_string(buckets));
    double const one = resume_with_one_process(comm, dir);
    expect(one <= 1e-6,
           "resume between " + std::to_string(n) + " ranks and one process differs by " + std::to_string(one));

    // n ranks <-> the first n/2 ranks.
    MPI_Comm half_comm;
    MPI_Comm_split(MPI_COMM_WORLD, r < n / 2 ? 0 : MPI_UNDEFINED, r, &half_comm);
    auto const full = plain_leg<ddp::optim::AdamW>({}, make_mlp, kMlpInput, 4);
    double worst = 0;
    auto const a = dir / "all_to_half.ckpt", b = dir / "half_to_all.ckpt";
    ddp_leg<ddp::optim::AdamW>(comm, {.to = kStop, .save = a, .buckets = kOneBucket}, make_mlp, kMlpInput, 4);
    if (half_comm != MPI_COMM_NULL) {
      ddp::MpiBackend half(session, {.comm = half_comm});
      auto const resumed = ddp_leg<ddp::optim::AdamW>(
          half, {.from = kStop, .load = a, .buckets = kSmallBuckets, .seed = 7}, make_mlp, kMlpInput, 4);
      worst = std::max(worst, relative_diff(resumed, full));
      ddp_leg<ddp::optim::AdamW>(half, {.to = kStop, .save = b, .buckets = kPerParameter}, make_mlp, kMlpInput, 4);
    }
    comm.barrier();
    auto const resumed =
        ddp_leg<ddp::optim::AdamW>(comm, {.from = kStop, .load = b, .seed = 7}, make_mlp, kMlpInput, 4);
    worst = std::max(worst, relative_diff(resumed, full));
    expect(worst <= 1e-6, "resume between " + std::to_string(n) + " and " + std::to_string(n / 2) +
                              " ranks differs by " + std::to_string(worst));
    if (half_comm != MPI_COMM_NULL) MPI_Comm_free(&half_comm);
    comm.barrier();
    if (r == 0) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
      std::printf(
          "resume mpi tests passed on %d ranks (other bucket plans %.3g; one process %.3g; %d <-> %d ranks %.3g)\n", n,
          buckets, one, n, n / 2, worst);
    }
  } catch (std::exception const& e) {
    session.abort(e.what());
  }
  return 0;
}
