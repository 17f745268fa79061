// The NCCL backend's public header: NcclBackend, collectives on CUDA device buffers, bootstrapped over MPI.
// Its room is include/ddp/comm/nccl/. Depend on //:ddp_nccl (nvcc).
#pragma once

#include "ddp/comm/nccl/backend.hpp"
