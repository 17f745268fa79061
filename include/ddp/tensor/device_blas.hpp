// Device GEMM: cuBLAS on Thrust's CUDA system; on the CPU device systems (host-accessible memory) the host
// kernel itself (Eigen), so the device path computes exactly what the host path does.
#pragma once

#include <cstdint>

#include "ddp/tensor/device_system.hpp"
#include "ddp/tensor/host_kernels.hpp"
#include "ddp/tensor/kernels.hpp"

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#include <cublas_v2.h>

#include "ddp/tensor/device_buffer.hpp"  // CudaError
#include "ddp/tensor/device_elementwise.hpp"
#endif

namespace ddp {

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
namespace detail {
inline void cublas_check(cublasStatus_t rc, char const* call) {
  if (rc != CUBLAS_STATUS_SUCCESS)
    throw CudaError(cat("cuBLAS: ", call, " failed: ", cublasGetStatusName(rc), " (", cublasGetStatusString(rc), ")"));
}
// One cuBLAS handle per host thread (each rank drives its own device from its own thread), on the legacy
// default stream like every other device kernel. Pedantic math: no TF32, so float products round as float.
inline cublasHandle_t cublas_handle() {
  struct Handle {
    cublasHandle_t h = nullptr;
    Handle() {
      cublas_check(cublasCreate(&h), "cublasCreate");
      cublas_check(cublasSetStream(h, cudaStream_t{}), "cublasSetStream");
      cublas_check(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
    }
    ~Handle() {
      if (h) cublasDestroy(h);
    }
  };
  thread_local Handle handle;
  return handle.h;
}
}  // namespace detail
#endif

// Part of Kernels<DeviceSpace>: C(M,N) = alpha op(A) op(B) + beta C, row-major, as Kernels<HostSpace>::gemm.
struct DeviceBlasKernels {
  using i64 = std::int64_t;

  template <class T>
  static void gemm(Trans ta, Trans tb, i64 M, i64 N, i64 K, T alpha, T const* A, T const* B, T beta, T* C) {
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
    if (M == 0 || N == 0) return;
    if (K == 0) {  // C = beta C; beta == 0 never reads C
      if (beta == T(0))
        DeviceElementwiseKernels::fill(M * N, T(0), C);
      else if (beta != T(1))
        DeviceElementwiseKernels::axpby(M * N, beta, C, T(0), C);
      return;
    }
    // Row-major C = op(A) op(B) is column-major Cᵀ = op(B)ᵀ op(A)ᵀ: swap the operands, keep the flags.
    cublasOperation_t const opa = ta == Trans::kNo ? CUBLAS_OP_N : CUBLAS_OP_T;
    cublasOperation_t const opb = tb == Trans::kNo ? CUBLAS_OP_N : CUBLAS_OP_T;
    int const lda = static_cast<int>(ta == Trans::kNo ? K : M), ldb = static_cast<int>(tb == Trans::kNo ? N : K);
    int const m = static_cast<int>(N), n = static_cast<int>(M), k = static_cast<int>(K);
    if constexpr (sizeof(T) == 4)
      detail::cublas_check(cublasSgemm(detail::cublas_handle(), opb, opa, m, n, k, &alpha, B, ldb, A, lda, &beta, C, m),
                           "cublasSgemm");
    else
      detail::cublas_check(cublasDgemm(detail::cublas_handle(), opb, opa, m, n, k, &alpha, B, ldb, A, lda, &beta, C, m),
                           "cublasDgemm");
#else
    static_assert(DeviceSystem::host_accessible);
    Kernels<HostSpace>::gemm(ta, tb, M, N, K, alpha, A, B, beta, C);
#endif
  }
};

}  // namespace ddp
