// Deterministic mode under mpirun -n N: every run of det_cases::all_runs() trained over MPI must give, on every
// rank, the very bytes a single process gives (rank 0 trains the reference on a one-rank threads group), and a
// checkpoint written by a two-rank threads run must resume here bit for bit. Exits non-zero on a mismatch.
#include <cstdio>

#include "ddp/comm/mpi.hpp"
#include "test/parallel/deterministic_suite.hpp"

int main(int argc, char** argv) {
  return ddp::mpi_main(argc, argv, [](ddp::MpiSession& session) {
    ddp::MpiBackend comm(session);
    det_cases::deterministic_suite(comm);
  });
}
