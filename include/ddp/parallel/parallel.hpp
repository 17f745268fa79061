// The parallel layer: DistributedDataParallel and its cross-rank checks.
#pragma once

#include "ddp/bucket/plan.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
