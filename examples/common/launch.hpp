// launch(): runs an example's per-rank body on the threads backend (N threads in this process), on MPI (one
// rank per process, under mpirun) or on Gloo (one rank per process, launched by torchrun, srun or by hand),
// chosen at run time with --backend.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>

#include "ddp/comm/gloo.hpp"
#include "ddp/comm/mpi.hpp"
#include "ddp/ddp.hpp"
#include "examples/common/flags.hpp"

namespace ddp::examples {

enum class Backend { kThreads, kMpi, kGloo };

inline Backend parse_backend(std::string const& s) {
  if (s == "threads") return Backend::kThreads;
  if (s == "mpi") return Backend::kMpi;
  if (s == "gloo") return Backend::kGloo;
  throw ArgumentError(detail::cat("--backend must be threads, mpi or gloo, got '", s, "'"));
}

// What --backend and --world-size chose. world_size 0: the launcher's size (mpirun -n, torchrun's WORLD_SIZE).
struct LaunchChoice {
  Backend backend = Backend::kThreads;
  int world_size = 2;
  // --timeout: each collective's deadline (unset: $DDP_TIMEOUT, else 10 minutes).
  TimeoutOptions timeout{};
  // --mpi-allreduce: how MpiBackend's all_reduce combines the ranks of one node.
  MpiNodeOptions node{};
};

// The one spelling of the launch flags for every example and benchmark: --backend threads|mpi|gloo and
// --world-size (ranks on threads; with MPI or Gloo it must match the launcher's, and by default is taken from it).
inline Flags& add_launch_flags(Flags& f, int default_world_size = 2) {
  return f
      .add("backend", "threads",
           "threads (ranks are threads of this process), mpi (one rank per process, under mpirun -n N) or gloo "
           "(one rank per process over TCP: torchrun --nproc_per_node N --no_python, srun with DDP_STORE_FILE, or "
           "RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT by hand)")
      .add("world-size", std::to_string(default_world_size),
           "ranks for the threads backend; with mpi or gloo it must match the launcher's (default: take it)")
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
  c.backend = parse_backend(f.choice("backend", {"threads", "mpi", "gloo"}));
  std::int64_t const ws = f.integer("world-size");
  if (ws < 1) throw ArgumentError(detail::cat(f.program(), ": --world-size must be at least 1, got ", ws));
  if (ws > 4096) throw ArgumentError(detail::cat(f.program(), ": --world-size ", ws, " is more than 4096"));
  c.world_size = c.backend != Backend::kThreads && !f.is_set("world-size") ? 0 : static_cast<int>(ws);
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

// fn(comm) runs once per rank with a ThreadsBackend&, an MpiBackend& or a GlooBackend&. Returns the process exit
// code: 0 on success; on failure prints the error (naming the rank) and returns 1 (threads, Gloo: the peers'
// collectives then fail naming this rank, so they end too) or aborts the whole MPI job so mpirun never hangs.
// With MPI or Gloo, `world_size` must be 0 or equal the launcher's.
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
  if (backend == Backend::kGloo) {
    int rank = -1;
    try {
      Rendezvous rv = rendezvous({.timeout = timeout.after});
      rank = rv.launch.rank;
      if (world_size != 0 && world_size != rv.launch.world_size)
        throw ArgumentError(detail::cat("--world-size ", world_size, " does not match the launcher's ",
                                        rv.launch.world_size, " ranks (WORLD_SIZE)"));
      GlooBackend comm(std::move(rv), GlooOptions{.timeout = timeout});
      fn(comm);
    } catch (std::exception const& e) {
      std::fprintf(stderr, "error: %s%s\n", rank >= 0 ? detail::cat("rank ", rank, ": ").c_str() : "", e.what());
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
