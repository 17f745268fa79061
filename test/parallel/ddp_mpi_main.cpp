// The DDP scenarios (ddp_suite.hpp) under mpirun (MpiBackend): run by mpi_test with -n 2 and -n 4.
// Exits 0 when every scenario passes on every rank; a failing rank aborts the job with its message.
#include <cstdio>

#include "ddp/comm/mpi.hpp"
#include "test/parallel/ddp_suite.hpp"

int main(int argc, char** argv) {
  ddp::MpiSession session(argc, argv);
  try {
    ddp::MpiBackend comm(session);
    // Buckets compressed to 16-bit floats: on one node MPI's shared-memory all-reduce adds in float and rounds
    // once, as the threads backend does; across nodes (the namespace cluster) MPI_Allreduce adds pairwise.
    ddp::test::ddp_suite(comm, comm.ranks_on_node() == comm.world_size() ? ddp::test::HalfSum::kFloatOnce
                                                                         : ddp::test::HalfSum::kPairwise);
  } catch (std::exception const& e) {
    session.abort(e.what());
  }
  return 0;
}
