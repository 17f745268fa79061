// The host-only communication headers (no MPI or CUDA): concepts, ThreadsBackend + spawn, launch_env,
// tracing, the Recording wrapper, host collectives for metadata and the HostStaging adapter. MPI and NCCL backends are included explicitly (ddp/comm/mpi.hpp,
// ddp/comm/nccl.hpp) with their Bazel targets (//:ddp_mpi, //:ddp_nccl).
#pragma once

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/env.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/comm/host_staging.hpp"
#include "ddp/comm/recording.hpp"
#include "ddp/comm/threads.hpp"
#include "ddp/comm/trace.hpp"
#include "ddp/comm/work.hpp"
