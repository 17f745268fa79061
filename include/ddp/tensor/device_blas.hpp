// Device GEMM: cuBLAS on Thrust's CUDA system; on the CPU device systems (host-accessible memory) the host
// kernel itself (Eigen), so the device path computes exactly what the host path does. Within an autocast scope
// (precision.hpp) a float GEMM takes its operands in tf32, bf16 or fp16: on CUDA on tensor cores, elsewhere by
// rounding them and running the float kernel.
#pragma once

#include <concepts>
#include <cstdint>

#include "ddp/tensor/device_allocator.hpp"
#include "ddp/tensor/device_launch.hpp"
#include "ddp/tensor/device_system.hpp"
#include "ddp/tensor/host_kernels.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/tensor/precision.hpp"

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#include <cublas_v2.h>

#include "ddp/tensor/device_buffer.hpp"  // CudaError
#include "ddp/tensor/device_elementwise.hpp"
#endif

namespace ddp {

namespace detail {
namespace dev {
template <class To>
struct RoundInto {  // y[i] = x[i] rounded to p, stored as To (float, or the 16-bit type itself)
  Precision p;
  float const* x;
  To* y;
  DDP_HOST_DEVICE void operator()(i64 i) const {
    if constexpr (std::same_as<To, float>)
      y[i] = round_to(p, x[i]);
    else
      y[i] = To(x[i]);
  }
};
}  // namespace dev

// A device copy of x's n floats rounded to p (scratch: from the block cache, so free after the first step).
inline DeviceScratch<float> rounded_copy(Precision p, i64 n, float const* x) {
  DeviceScratch<float> out(n);
  device_for(n, dev::RoundInto<float>{p, x, out.data()});
  return out;
}
}  // namespace detail

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
    if constexpr (std::same_as<T, float>) {
      if (Precision const p = matmul_precision(); p != Precision::kFp32 && M != 0 && N != 0 && K != 0) {
        gemm_reduced(p, ta, tb, M, N, K, alpha, A, B, beta, C);
        return;
      }
    }
    gemm_in_float(ta, tb, M, N, K, alpha, A, B, beta, C);
  }

 private:
  // The operands in precision p, accumulated in float. CUDA: TF32 math mode, or 16-bit copies of the operands
  // into cublasGemmEx (tensor cores, float accumulation and output). Elsewhere: rounded float copies into the
  // float GEMM (the same products, exact in float, and float sums).
  static void gemm_reduced(Precision p, Trans ta, Trans tb, i64 M, i64 N, i64 K, float alpha, float const* A,
                           float const* B, float beta, float* C) {
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
    cublasHandle_t const h = detail::cublas_handle();
    cublasOperation_t const opa = ta == Trans::kNo ? CUBLAS_OP_N : CUBLAS_OP_T;
    cublasOperation_t const opb = tb == Trans::kNo ? CUBLAS_OP_N : CUBLAS_OP_T;
    int const lda = static_cast<int>(ta == Trans::kNo ? K : M), ldb = static_cast<int>(tb == Trans::kNo ? N : K);
    int const m = static_cast<int>(N), n = static_cast<int>(M), k = static_cast<int>(K);
    if (p == Precision::kTf32) {
      detail::cublas_check(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH), "cublasSetMathMode(TF32)");
      cublasStatus_t const rc = cublasSgemm(h, opb, opa, m, n, k, &alpha, B, ldb, A, lda, &beta, C, m);
      cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
      detail::cublas_check(rc, "cublasSgemm (TF32)");
      return;
    }
    auto gemm16 = [&]<class H>(cudaDataType_t type) {
      detail::DeviceScratch<H> a16(M * K), b16(K * N);
      detail::device_for(M * K, detail::dev::RoundInto<H>{p, A, a16.data()});
      detail::device_for(K * N, detail::dev::RoundInto<H>{p, B, b16.data()});
      detail::cublas_check(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode(default)");
      cublasStatus_t const rc = cublasGemmEx(h, opb, opa, m, n, k, &alpha, b16.data(), type, ldb, a16.data(), type, lda,
                                             &beta, C, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
      detail::cublas_check(rc, "cublasGemmEx (16-bit operands, float accumulation)");
    };
    if (p == Precision::kBf16)
      gemm16.template operator()<bfloat16>(CUDA_R_16BF);
    else
      gemm16.template operator()<float16>(CUDA_R_16F);
#else
    auto const a = detail::rounded_copy(p, M * K, A);
    auto const b = detail::rounded_copy(p, K * N, B);
    gemm_in_float(ta, tb, M, N, K, alpha, a.data(), b.data(), beta, C);
#endif
  }

  template <class T>
  static void gemm_in_float(Trans ta, Trans tb, i64 M, i64 N, i64 K, T alpha, T const* A, T const* B, T beta, T* C) {
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
