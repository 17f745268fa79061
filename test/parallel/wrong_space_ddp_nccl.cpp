// Compiled by compile_fail_test.sh: with DDP_WRONG_SPACE a host (Eigen) model goes to DistributedDataParallel over
// NcclBackend, which takes device memory only; it must fail to compile, saying to use device tensors. Without it,
// the same model over device tensors compiles.
#include "ddp/comm/nccl.hpp"
#include "ddp/ddp.hpp"
#include "ddp/tensor/device.hpp"

void ok(ddp::NcclBackend& comm, ddp::Generator& g) {
  ddp::nn::basic_linear<float, ddp::DeviceSpace> model(4, 2, g);
  ddp::DistributedDataParallel ddp(model, comm);
}

#if defined(DDP_WRONG_SPACE)
void host_model_on_nccl(ddp::NcclBackend& comm, ddp::Generator& g) {
  ddp::nn::Linear model(4, 2, g);
  ddp::DistributedDataParallel ddp(model, comm);
}
#endif
