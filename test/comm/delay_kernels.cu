// Device kernels for the NCCL stream-ordering test: a fill that starts only after a long spin.
#include "test/comm/delay_kernels.h"

namespace {
__global__ void delayed_fill_kernel(float* p, long long n, float value, long long spin_cycles) {
  long long const start = clock64();
  while (clock64() - start < spin_cycles) {}
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    p[i] = value;
}
}  // namespace

extern "C" cudaError_t ddp_test_delayed_fill(float* p, long long n, float value, long long spin_cycles,
                                             cudaStream_t stream) {
  delayed_fill_kernel<<<128, 256, 0, stream>>>(p, n, value, spin_cycles);
  return cudaGetLastError();
}
