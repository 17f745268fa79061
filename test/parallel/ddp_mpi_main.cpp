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
    // Hierarchical local SGD with nodes of 2 ranks (MpiNodeOptions::ranks_per_node, whose groups must share memory):
    // node averages on their own communicator, averages over all ranks on the whole one.
    if (comm.world_size() % 2 == 0 && comm.ranks_on_node() % 2 == 0) {
      ddp::MpiBackend pairs(session, {.node = {.ranks_per_node = 2}});
      ddp::test::local_sgd_hierarchical(pairs);
    }
  } catch (std::exception const& e) {
    session.abort(e.what());
  }
  return 0;
}
