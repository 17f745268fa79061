// Kernels<HostSpace>::gemm on every path (tiny, skinny rows, outer product, streaming stores, Eigen's
// blocked GEMM) against a direct double-precision reference; beta = 0 must ignore C's old contents.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ddp/ddp.hpp"

using namespace ddp;

namespace {
template <class T>
double max_err(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, T beta) {
  Generator g(static_cast<std::uint64_t>(M * 131 + N * 17 + K));
  std::vector<T> A(M * K), B(K * N), C(M * N), C0(M * N);
  for (auto& v : A) v = g.uniform<T>(-1, 1);
  for (auto& v : B) v = g.uniform<T>(-1, 1);
  for (auto& v : C0) v = beta == T(0) ? std::numeric_limits<T>::quiet_NaN() : g.uniform<T>(-1, 1);
  C = C0;
  Kernels<HostSpace>::gemm(ta, tb, M, N, K, alpha, A.data(), B.data(), beta, C.data());
  double worst = 0;
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        double a = ta == Trans::kNo ? A[i * K + k] : A[k * M + i];
        double b = tb == Trans::kNo ? B[k * N + j] : B[j * K + k];
        acc += a * b;
      }
      double const ref = double(alpha) * acc + (beta == T(0) ? 0.0 : double(beta) * C0[i * N + j]);
      double const e = std::abs(ref - double(C[i * N + j])) / std::max(1.0, std::abs(ref));
      if (!(e <= worst)) worst = std::isnan(e) ? 1e9 : e;
    }
  return worst;
}
}  // namespace

TEST_CASE("gemm: every path, every transpose, beta 0 (C holds NaN) and 1, alpha != 1") {
  struct Case {
    std::int64_t M, N, K;
  };
  // tiny (coefficient-based), skinny rows (M <= 4), outer products (K <= 4), regular blocked GEMM, transposed A·Bᵀ
  for (Case c :
       {Case{3, 4, 5}, Case{2, 300, 200}, Case{1, 70, 90}, Case{4, 65, 300}, Case{200, 150, 2}, Case{120, 80, 3},
        Case{64, 96, 128}, Case{33, 17, 65}, Case{9, 40, 1100}}) {  // the last: A·Bᵀ computed as (B·Aᵀ)ᵀ
    for (Trans ta : {Trans::kNo, Trans::kYes})
      for (Trans tb : {Trans::kNo, Trans::kYes})
        for (float beta : {0.0f, 1.0f}) {
          CAPTURE(c.M);
          CAPTURE(c.N);
          CAPTURE(c.K);
          CAPTURE(int(ta));
          CAPTURE(int(tb));
          CAPTURE(beta);
          CHECK(max_err<float>(ta, tb, c.M, c.N, c.K, 0.5f, beta) < 1e-5);
          CHECK(max_err<double>(ta, tb, c.M, c.N, c.K, 0.5, double(beta)) < 1e-12);
        }
  }
}

TEST_CASE("gemm: the streaming-store outer product (result >= 64 MiB) is exact, unaligned rows included") {
  // (4099 x 4097) floats = 64 MiB + change; odd N so most rows start unaligned.
  for (Trans ta : {Trans::kNo, Trans::kYes}) {
    CAPTURE(int(ta));
    std::int64_t const M = 4099, N = 4097, K = 2;
    Generator g(3);
    std::vector<float> A(M * K), B(K * N), C(M * N, std::numeric_limits<float>::quiet_NaN());
    for (auto& v : A) v = g.uniform(-1.0f, 1.0f);
    for (auto& v : B) v = g.uniform(-1.0f, 1.0f);
    Kernels<HostSpace>::gemm(ta, Trans::kNo, M, N, K, 1.0f, A.data(), B.data(), 0.0f, C.data());
    double worst = 0;
    for (std::int64_t i = 0; i < M; i += 7)
      for (std::int64_t j = 0; j < N; ++j) {
        double a0 = ta == Trans::kNo ? A[i * K] : A[i], a1 = ta == Trans::kNo ? A[i * K + 1] : A[M + i];
        double ref = a0 * B[j] + a1 * B[N + j];
        worst = std::max(worst, std::abs(ref - double(C[i * N + j])));
      }
    CHECK(worst < 1e-6);
  }
}

TEST_CASE("sum_rows: column sums against double, any row count (blocks of 32 and a remainder), beta 0, 1 and 0.5") {
  for (std::int64_t rows : {0, 1, 5, 32, 33, 768, 1001})
    for (std::int64_t cols : {1, 7, 16, 130}) {
      CAPTURE(rows);
      CAPTURE(cols);
      Generator g(static_cast<std::uint64_t>(rows * 17 + cols));
      std::vector<float> x(static_cast<std::size_t>(rows * cols));
      for (auto& v : x) v = g.uniform<float>(-1, 1);
      for (float beta : {0.0f, 1.0f, 0.5f}) {
        std::vector<float> out(static_cast<std::size_t>(cols),
                               beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : 2.0f);
        Kernels<HostSpace>::sum_rows(rows, cols, x.data(), beta, out.data());
        double worst = 0;
        for (std::int64_t c = 0; c < cols; ++c) {
          double ref = beta == 0.0f ? 0.0 : 2.0 * beta;
          for (std::int64_t r = 0; r < rows; ++r) ref += x[static_cast<std::size_t>(r * cols + c)];
          double const e = std::abs(ref - double(out[static_cast<std::size_t>(c)]));
          if (!(e <= worst)) worst = std::isnan(e) ? 1e9 : e;
        }
        CHECK(worst < 2e-5);
      }
    }
}
