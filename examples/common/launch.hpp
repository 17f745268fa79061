// launch(): runs an example's per-rank body on the threads backend (N threads in this process) or on
// MPI (one rank per process, under mpirun), chosen at run time with --backend.
#pragma once

#include <cstdio>
#include <exception>
#include <string>

#include "ddp/comm/mpi.hpp"
#include "ddp/ddp.hpp"

namespace ddp::examples {

enum class Backend { kThreads, kMpi };

inline Backend parse_backend(std::string const& s) {
  if (s == "threads") return Backend::kThreads;
  if (s == "mpi") return Backend::kMpi;
  throw ArgumentError(detail::cat("--backend must be threads or mpi, got '", s, "'"));
}

// fn(comm) runs once per rank with a ThreadsBackend& or an MpiBackend&. Returns the process exit code:
// 0 on success; on failure prints the error (naming the rank) and returns 1 (threads) or aborts the whole
// MPI job so mpirun never hangs. With MPI, `world_size` must be 0 or equal mpirun's -n.
template <class F>
int launch(Backend backend, int world_size, int& argc, char**& argv, F&& fn) {
  if (backend == Backend::kThreads) {
    if (world_size < 1) throw ArgumentError(detail::cat("--world-size must be at least 1, got ", world_size));
    try {
      spawn(world_size, [&](ThreadsBackend& comm) { fn(comm); });
    } catch (std::exception const& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
    return 0;
  }
  MpiSession session(argc, argv);
  try {
    if (world_size != 0 && world_size != session.world_size())
      throw ArgumentError(detail::cat("--world-size ", world_size, " does not match the MPI job's ", session.world_size(),
                                      " ranks (set it with mpirun -n)"));
    MpiBackend comm(session);
    fn(comm);
  } catch (std::exception const& e) {
    session.abort(e.what());
  }
  return 0;
}

}  // namespace ddp::examples
