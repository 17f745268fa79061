// Compiled by compile_fail_test.sh: with DDP_WRONG_SPACE a device span goes to the host-only ThreadsBackend,
// with DDP_WRONG_DTYPE a std::int16_t buffer goes to a collective; both must fail to compile, explaining why.
#include <cstdint>
#include <vector>

#include "ddp/comm/threads.hpp"

void ok(ddp::ThreadsBackend& comm, std::vector<float>& host) { comm.all_reduce(host, ddp::ReduceOp::kSum); }

#if defined(DDP_WRONG_SPACE)
void wrong_space(ddp::ThreadsBackend& comm, float* device_ptr) {
  comm.all_reduce(ddp::device_span(device_ptr, 16), ddp::ReduceOp::kSum);
}
#endif

#if defined(DDP_WRONG_DTYPE)
void wrong_dtype(ddp::ThreadsBackend& comm, std::vector<std::int16_t>& v) { comm.all_reduce(v, ddp::ReduceOp::kSum); }
#endif
