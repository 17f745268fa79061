// Compiled by compile_fail_test.sh: with DDP_WRONG_SPACE a device model goes to DistributedDataParallel over
// MpiBackend, which takes host memory only; it must fail to compile, naming the host-staging adapter. Without
// it, the same model through HostStaging<MpiBackend> compiles.
#include "ddp/comm/mpi.hpp"
#include "ddp/ddp.hpp"
#include "ddp/tensor/device.hpp"

void ok(ddp::MpiBackend& mpi, ddp::Generator& g) {
  ddp::nn::basic_linear<float, ddp::DeviceSpace> model(4, 2, g);
  ddp::HostStaging<ddp::MpiBackend> staged(mpi);
  ddp::DistributedDataParallel ddp(model, staged);
}

#if defined(DDP_WRONG_SPACE)
void device_model_on_mpi(ddp::MpiBackend& mpi, ddp::Generator& g) {
  ddp::nn::basic_linear<float, ddp::DeviceSpace> model(4, 2, g);
  ddp::DistributedDataParallel ddp(model, mpi);
}
#endif
