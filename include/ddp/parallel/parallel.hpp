// The parallel layer: DistributedDataParallel and its policies, its cross-rank checks, deterministic mode, and
// join for uneven inputs, ZeRO and the update overlapped with communication.
#pragma once

#include "ddp/bucket/plan.hpp"
#include "ddp/parallel/deterministic.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "ddp/parallel/join.hpp"
#include "ddp/parallel/local_sgd.hpp"
#include "ddp/parallel/overlapped_update.hpp"
#include "ddp/parallel/policies.hpp"
#include "ddp/parallel/zero_redundancy.hpp"
