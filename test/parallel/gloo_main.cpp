// DDP, Join, SyncBatchNorm and deterministic mode over GlooBackend, one rank per process, launched without MPI
// (test/tools/gloo_launch.sh): the scenarios the MPI programs run, through the same suites. Exits 0 when every
// scenario passes on this rank; a failing rank prints its error and exits 1 (its peers then fail naming it).
#include <cstdio>
#include <exception>

#include "ddp/comm/gloo.hpp"
#include "test/nn/sync_batch_norm_suite.hpp"
#include "test/parallel/ddp_suite.hpp"
#include "test/parallel/deterministic_suite.hpp"
#include "test/parallel/join_suite.hpp"

int main() {
  int rank = -1;
  try {
    ddp::Rendezvous rv = ddp::rendezvous();
    rank = rv.launch.rank;
    ddp::GlooBackend comm(std::move(rv));
    ddp::test::ddp_suite(comm, ddp::test::HalfSum::kPairwise);  // Gloo adds 16-bit floats pairwise
    ddp::test::join_suite(comm);
    ddp::test::sbn::sync_batch_norm_suite(comm);
    det_cases::deterministic_suite(comm);
    return 0;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: rank %d: %s\n", rank, e.what());
    return 1;
  }
}
