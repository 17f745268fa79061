// A job whose rank --rank fails at step 3 while the others are in collectives: --mode=throw (an exception
// escapes into mpi_main), --mode=exit (std::exit(3)), --mode=kill (SIGKILL: no code runs, Hydra cleans up),
// --mode=stall (it stops taking part: sleeps far past the collective timeout), --mode=desync (it issues a
// broadcast where the others all-reduce), --mode=count (it all-reduces 64 more elements than the others: on
// one node the shared-memory path compares the calls and every rank raises at once), --mode=place (it
// all-reduces a private buffer where the others all-reduce their MpiBackend::gradient_storage: on one node
// every rank raises at once). --timeout=SECONDS sets MpiOptions::timeout (default: $DDP_TIMEOUT,
// else 10 minutes). Run by expect_failure.sh: the job must end quickly and non-zero, naming the rank (and for
// stall/desync the collective) on every rank that can still speak.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/mpi.hpp"

int main(int argc, char** argv) {
  std::string mode = "throw";
  int bad = 1;
  ddp::MpiOptions opts;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--mode=", 7) == 0) mode = argv[i] + 7;
    if (std::strncmp(argv[i], "--rank=", 7) == 0) bad = std::atoi(argv[i] + 7);
    if (std::strncmp(argv[i], "--timeout=", 10) == 0) {
      opts.timeout.after = std::chrono::milliseconds(static_cast<long>(std::atof(argv[i] + 10) * 1000));
    }
  }
  return ddp::mpi_main(argc, argv, [&](ddp::MpiSession& session) {
    ddp::MpiBackend comm(session, opts);
    std::vector<float> grads(1 << 16, 1.0f);
    if (mode == "place") {  // rank --rank all-reduces a private copy where the others use their shared storage
      auto storage = comm.gradient_storage<float>(1 << 16);
      std::fill(storage.data(), storage.data() + storage.numel(), 1.0f);
      std::span<float> buf = comm.rank() == bad ? std::span<float>(grads) : std::span<float>(storage.data(), 1 << 16);
      comm.all_reduce_async(buf, ddp::ReduceOp::kAvg, {"bucket", 0}).wait();
      return;
    }
    for (int step = 0;; ++step) {
      if (comm.rank() == bad && step == 3) {
        if (mode == "exit") std::exit(3);
        if (mode == "kill") std::raise(SIGKILL);
        if (mode == "stall") std::this_thread::sleep_for(std::chrono::minutes(5));
        if (mode == "desync") {
          comm.broadcast(grads, 0, {"params", step});
          continue;
        }
        if (mode == "throw") throw std::runtime_error("injected failure at step 3");
        if (mode == "count") {
          std::vector<float> longer(grads.size() + 64, 1.0f);
          comm.all_reduce_async(longer, ddp::ReduceOp::kAvg, {"bucket", step}).wait();
          comm.barrier();
          continue;
        }
      }
      auto w = comm.all_reduce_async(grads, ddp::ReduceOp::kAvg, {"bucket", step});
      w.wait();
      comm.barrier();
    }
  });
}
