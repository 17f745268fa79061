// Compiled by compile_fail_test.sh: with DDP_WRONG_SPACE a host vector goes to the device-only NcclBackend,
// which must fail to compile, saying to use a DeviceBuffer or a host backend.
#include <vector>

#include "ddp/comm/nccl.hpp"

void ok(ddp::NcclBackend& comm, ddp::DeviceBuffer<float>& buf) { comm.all_reduce(buf.span(), ddp::ReduceOp::kSum); }

#if defined(DDP_WRONG_SPACE)
void wrong_space(ddp::NcclBackend& comm, std::vector<float>& host) { comm.all_reduce(host, ddp::ReduceOp::kAvg); }
#endif
