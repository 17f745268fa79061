// The scenarios of join_cases.hpp (join_suite.hpp) under mpirun (MpiBackend): run by mpi_test with -n 2 and -n 4.
// Exits 0 when every scenario passes on every rank; a failing rank aborts the job with its message.
#include <cstdio>

#include "ddp/comm/mpi.hpp"
#include "test/parallel/join_suite.hpp"

int main(int argc, char** argv) {
  ddp::MpiSession session(argc, argv);
  try {
    ddp::MpiBackend comm(session);
    ddp::test::join_suite(comm);
  } catch (std::exception const& e) {
    session.abort(e.what());
  }
  return 0;
}
