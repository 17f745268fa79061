// DeviceSystem: which Thrust device system DeviceSpace runs on (CUDA, or a CPU system: CPP, OMP, TBB), whether
// the host can touch its memory, and the execution policy every device kernel launches with.
#pragma once

#include <thrust/execution_policy.h>
#include <thrust/version.h>

#include <string_view>

#include "ddp/config.hpp"
#include "ddp/tensor/memory_space.hpp"

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#if !defined(__CUDACC__)
#error \
    "ddp device tensors on Thrust's CUDA system must be compiled by nvcc (cuda_library in tools/cuda.bzl); to run them on the CPU, build with THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP (the //:ddp_device_cpu target)"
#endif
#include <cuda_runtime.h>
#include <thrust/system/cuda/execution_policy.h>
#endif

namespace ddp {

// The device system DeviceSpace was compiled for: chosen by THRUST_DEVICE_SYSTEM (Thrust's own switch, set on the
// Bazel target), one per program. Kernels<DeviceSpace> is written once over it; where the system's memory is
// host-accessible (the CPU systems), GEMM and convolution delegate to the host kernels (Eigen, Winograd/im2col),
// and on CUDA they go through cuBLAS and cuDNN.
struct DeviceSystem {
  static constexpr int id = THRUST_DEVICE_SYSTEM;
  static constexpr bool is_cuda = THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA;
  // Host threads may read and write device memory directly (memcpy, Eigen maps): every system but CUDA.
  static constexpr bool host_accessible = !is_cuda;
  static constexpr std::string_view name = THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA  ? "cuda"
                                           : THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_OMP ? "omp"
                                           : THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_TBB ? "tbb"
                                                                                              : "cpp";
};

template <>
struct HostAccessible<DeviceSpace> : std::bool_constant<DeviceSystem::host_accessible> {};

namespace detail {
// Every device kernel runs with this policy. CUDA: the legacy default stream without a synchronisation after
// each algorithm (cuBLAS, cuDNN, the stream-ordered allocator and NcclBackend's default compute stream all use
// that stream, so their work is ordered; reading a result on the host (to_host, a reduction) synchronises).
// CPU systems: Thrust's device policy (sequential for CPP, OpenMP threads for OMP).
inline auto device_policy() {
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
  return thrust::cuda::par_nosync.on(cudaStream_t{});
#else
  return thrust::device;
#endif
}
}  // namespace detail

}  // namespace ddp
