// A deliberately slow device fill for stream-ordering tests (compiled by nvcc, see delay_kernels.cu).
#pragma once

#include <cuda_runtime.h>

// Spins about `spin_cycles` GPU clock cycles, then writes `value` to p[0..n) — all on `stream`. A collective
// that does not wait for the stream's prior work reads the old contents.
extern "C" cudaError_t ddp_test_delayed_fill(float* p, long long n, float value, long long spin_cycles,
                                             cudaStream_t stream);
