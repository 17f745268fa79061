// launch(): runs an example's per-rank body on the threads backend (N threads in this process) or on
// MPI (one rank per process, under mpirun), chosen at run time with --backend.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>

#include "ddp/comm/mpi.hpp"
#include "ddp/ddp.hpp"
#include "examples/common/flags.hpp"

namespace ddp::examples {

enum class Backend { kThreads, kMpi };

inline Backend parse_backend(std::string const& s) {
  if (s == "threads") return Backend::kThreads;
  if (s == "mpi") return Backend::kMpi;
  throw ArgumentError(detail::cat("--backend must be threads or mpi, got '", s, "'"));
}

// What --backend and --world-size chose. world_size 0: the MPI job's size (mpirun -n decides).
struct LaunchChoice {
  Backend backend = Backend::kThreads;
  int world_size = 2;
  // --timeout: each collective's deadline (unset: $DDP_TIMEOUT, else 10 minutes).
  TimeoutOptions timeout{};
  // --mpi-allreduce: how MpiBackend's all_reduce combines the ranks of one node.
  MpiNodeOptions node{};
};

// The one spelling of the launch flags for every example and benchmark: --backend threads|mpi and
// --world-size (ranks on threads; with MPI it must match mpirun -n, and by default is taken from it).
inline Flags& add_launch_flags(Flags& f, int default_world_size = 2) {
  return f
      .add("backend", "threads",
           "threads (ranks are threads of this process) or mpi (one rank per process, under mpirun -n N)")
      .add("world-size", std::to_string(default_world_size),
           "ranks for the threads backend; with mpi it must match mpirun -n (default: take it)")
      .add("timeout", "",
           "seconds a collective waits for the other ranks before the job fails naming them (default: "
           "$DDP_TIMEOUT, else 600); a warning comes at half of it")
      .add("mpi-allreduce", "shm",
           "with mpi: shm (ranks on one node reduce through shared memory; hierarchical across nodes) or mpi "
           "(MPI_Allreduce over all ranks)")
      .add("mpi-grads", "shared",
           "with mpi and shm on one node: shared (DDP's gradients live in a shared window and are reduced in "
           "place) or private (in each rank's memory, copied through the window)");
}
inline LaunchChoice launch_choice(Flags const& f) {
  LaunchChoice c;
  c.backend = parse_backend(f.choice("backend", {"threads", "mpi"}));
  std::int64_t const ws = f.integer("world-size");
  if (ws < 1) throw ArgumentError(detail::cat(f.program(), ": --world-size must be at least 1, got ", ws));
  if (ws > 4096) throw ArgumentError(detail::cat(f.program(), ": --world-size ", ws, " is more than 4096"));
  c.world_size = c.backend == Backend::kMpi && !f.is_set("world-size") ? 0 : static_cast<int>(ws);
  if (f.is_set("timeout")) {
    double const s = f.real("timeout");
    if (!(s > 0) || s > 365.0 * 24 * 3600)
      throw ArgumentError(detail::cat(f.program(), ": --timeout must be a positive number of seconds, got ", s));
    c.timeout.after = std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(s * 1000)));
  }
  c.node.all_reduce =
      f.choice("mpi-allreduce", {"shm", "mpi"}) == "mpi" ? NodeAllReduce::kMpi : NodeAllReduce::kSharedMemory;
  c.node.gradient_storage =
      f.choice("mpi-grads", {"shared", "private"}) == "private" ? GradientStorage::kPrivate : GradientStorage::kShared;
  return c;
}

// fn(comm) runs once per rank with a ThreadsBackend& or an MpiBackend&. Returns the process exit code:
// 0 on success; on failure prints the error (naming the rank) and returns 1 (threads) or aborts the whole
// MPI job so mpirun never hangs. With MPI, `world_size` must be 0 or equal mpirun's -n.
template <class F>
int launch(Backend backend, int world_size, int& argc, char**& argv, F&& fn, TimeoutOptions const& timeout = {},
           MpiNodeOptions const& node = {}) {
  if (backend == Backend::kThreads) {
    if (world_size < 1) throw ArgumentError(detail::cat("--world-size must be at least 1, got ", world_size));
    try {
      spawn(
          world_size, [&](ThreadsBackend& comm) { fn(comm); }, ThreadsOptions{.timeout = timeout});
    } catch (std::exception const& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
    return 0;
  }
  MpiSession session(argc, argv);
  try {
    if (world_size != 0 && world_size != session.world_size())
      throw ArgumentError(detail::cat("--world-size ", world_size, " does not match the MPI job's ",
                                      session.world_size(), " ranks (set it with mpirun -n)"));
    MpiBackend comm(session, MpiOptions{.timeout = timeout, .node = node});
    fn(comm);
  } catch (std::exception const& e) {
    session.abort(e.what());
  }
  return 0;
}

// The same, with what add_launch_flags/launch_choice read.
template <class F>
int launch(LaunchChoice c, int& argc, char**& argv, F&& fn) {
  return launch(c.backend, c.world_size, argc, argv, std::forward<F>(fn), c.timeout, c.node);
}

}  // namespace ddp::examples
