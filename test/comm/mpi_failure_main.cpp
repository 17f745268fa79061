// A job whose rank --rank fails at step 3 while the others are in collectives: --mode=throw (an exception
// escapes into mpi_main), --mode=exit (std::exit(3)), --mode=kill (SIGKILL: no code runs, Hydra cleans up).
// Run by expect_failure.sh: the job must end quickly and non-zero, naming the rank where the rank can speak.
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/comm/mpi.hpp"

int main(int argc, char** argv) {
  std::string mode = "throw";
  int bad = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--mode=", 7) == 0) mode = argv[i] + 7;
    if (std::strncmp(argv[i], "--rank=", 7) == 0) bad = std::atoi(argv[i] + 7);
  }
  return ddp::mpi_main(argc, argv, [&](ddp::MpiSession& session) {
    ddp::MpiBackend comm(session);
    std::vector<float> grads(1 << 16, 1.0f);
    for (int step = 0;; ++step) {
      if (comm.rank() == bad && step == 3) {
        if (mode == "exit") std::exit(3);
        if (mode == "kill") std::raise(SIGKILL);
        throw std::runtime_error("injected failure at step 3");
      }
      auto w = comm.all_reduce_async(grads, ddp::ReduceOp::kAvg, {"bucket", step});
      w.wait();
      comm.barrier();
    }
  });
}
