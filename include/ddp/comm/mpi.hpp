// The MPI backend's public header: MpiBackend and MpiSession (MPICH). Its room, include/ddp/comm/mpi/, holds the
// backend (backend.hpp), the session that starts and ends MPI (session.hpp), the shared-memory node all-reduce
// (node.hpp), the watched waits (watch.hpp) and the PMI-1 and store helpers. Depend on //:ddp_mpi.
#pragma once

#include "ddp/comm/mpi/backend.hpp"
#include "ddp/comm/mpi/session.hpp"
