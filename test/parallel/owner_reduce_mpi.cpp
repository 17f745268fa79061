// Compiled by compile_fail_test.sh: with DDP_OWNER_ON_MPI a ZeroRedundancyOptimizer is built from a DDP under
// OwnerReduce over MpiBackend, whose ranks are processes that do not share memory; it must fail to compile, naming
// the address-space requirement and what to use instead. Without it, ZeRO over AverageAllReduce on MPI compiles.
#include "ddp/comm/mpi.hpp"
#include "ddp/ddp.hpp"

using Model = ddp::nn::Linear;

void ok(ddp::MpiBackend& mpi, ddp::Generator& g) {
  Model model(4, 2, g);
  ddp::DistributedDataParallel ddp(model, mpi);
  ddp::ZeroRedundancyOptimizer<ddp::optim::SGD, ddp::MpiBackend> opt(ddp, {});
}

#if defined(DDP_OWNER_ON_MPI)
void owner_reduce_on_mpi(ddp::MpiBackend& mpi, ddp::Generator& g) {
  Model model(4, 2, g);
  ddp::DistributedDataParallel<Model, ddp::MpiBackend, ddp::SizeCapped, ddp::OwnerReduce> ddp(model, mpi);
  ddp::ZeroRedundancyOptimizer<ddp::optim::SGD, ddp::MpiBackend> opt(ddp, {});
}
#endif
