// One strided host GEMM, row-major with leading dimensions: OpenBLAS's SGEMM/DGEMM when the program links
// //:ddp_openblas (DDP_HOST_BLAS_OPENBLAS), Eigen's blocked product otherwise. Kernels<HostSpace>::gemm sends its
// general shapes here, and so does the fused attention kernel, whose per-head products read q, k and v in place
// inside the (B, T, 3C) activation (leading dimension 3C) and are small (T × T × C/H): OpenBLAS runs those about 30%
// faster than Eigen, whose packing dominates at that size (bench/RESULTS.md, "GPT").
#pragma once

#include <Eigen/Core>
#if defined(DDP_HOST_BLAS_OPENBLAS)  // //:ddp_openblas: host GEMMs through OpenBLAS (one thread per calling thread)
#include <cblas.h>
#endif

#include <concepts>
#include <cstdint>

#include "ddp/tensor/kernels.hpp"  // Trans

namespace ddp::detail {

// C(M,N) = alpha · op(A) · op(B) + beta · C, row-major: op(A) is (M,K), op(B) is (K,N); A, B and C have leading
// dimensions lda, ldb and ldc (row strides, in elements). beta == 0 never reads C. K > 0.
template <class T>
void host_gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, T const* A,
               std::int64_t lda, T const* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc) {
#if defined(DDP_HOST_BLAS_OPENBLAS)
  if constexpr (std::same_as<T, float> || std::same_as<T, double>) {
    // OpenBLAS's own thread pool is set to one thread once per process: each rank (a thread of the threads
    // backend, or a process) computes its GEMMs on its own core, as with Eigen.
    [[maybe_unused]] static bool const one_thread = (openblas_set_num_threads(1), true);
    auto const t = [](Trans x) { return x == Trans::kNo ? CblasNoTrans : CblasTrans; };
    if constexpr (std::same_as<T, float>)
      cblas_sgemm(CblasRowMajor, t(ta), t(tb), blasint(M), blasint(N), blasint(K), alpha, A, blasint(lda), B,
                  blasint(ldb), beta, C, blasint(ldc));
    else
      cblas_dgemm(CblasRowMajor, t(ta), t(tb), blasint(M), blasint(N), blasint(K), alpha, A, blasint(lda), B,
                  blasint(ldb), beta, C, blasint(ldc));
    return;
  }
#endif
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using CStr = Eigen::Map<Mat const, 0, Eigen::OuterStride<>>;
  Eigen::Map<Mat, 0, Eigen::OuterStride<>> c(C, M, N, Eigen::OuterStride<>(ldc));
  CStr const a(A, ta == Trans::kNo ? M : K, ta == Trans::kNo ? K : M, Eigen::OuterStride<>(lda));
  CStr const b(B, tb == Trans::kNo ? K : N, tb == Trans::kNo ? N : K, Eigen::OuterStride<>(ldb));
  auto run = [&](auto const& opa, auto const& opb) {
    if (beta == T(0)) {
      if (alpha == T(1))
        c.noalias() = opa * opb;
      else
        c.noalias() = alpha * (opa * opb);
    } else {
      if (beta != T(1)) c *= beta;
      if (alpha == T(1))
        c.noalias() += opa * opb;
      else
        c.noalias() += alpha * (opa * opb);
    }
  };
  if (ta == Trans::kNo && tb == Trans::kNo)
    run(a, b);
  else if (ta == Trans::kNo)
    run(a, b.transpose());
  else if (tb == Trans::kNo)
    run(a.transpose(), b);
  else
    run(a.transpose(), b.transpose());
}

}  // namespace ddp::detail
