// The host-only communication headers (no MPI or CUDA): concepts, ThreadsBackend + spawn, launch_env,
// tracing, the Recording wrapper, host collectives for metadata and the HostStaging adapter. The MPI and NCCL
// backends are included explicitly (ddp/comm/mpi.hpp, ddp/comm/nccl.hpp) with their Bazel targets (//:ddp_mpi,
// //:ddp_nccl). Layout: one folder per backend (mpi/, threads/, nccl/), what they share in detail/ (the async
// front end and progress thread, the reduction kernels, waits), the concepts and wrappers here. comm/ includes
// only tensor/ and error.hpp: it knows nothing of autograd, models or DDP (//test/tools:layering_test).
#pragma once

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/env.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/comm/host_staging.hpp"
#include "ddp/comm/recording.hpp"
#include "ddp/comm/threads.hpp"
#include "ddp/comm/trace.hpp"
#include "ddp/comm/work.hpp"
