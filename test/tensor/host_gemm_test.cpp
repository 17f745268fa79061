// detail::host_gemm (strided, row-major) and the fused attention kernels built on it, against direct double-precision
// references. Built twice: in //test/tensor:tensor_tests (Eigen's product) and as host_gemm_openblas_test (the same
// file with //:ddp_openblas, so the GPT job's OpenBLAS path, small-matrix kernels included, is tested in CI).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ddp/ddp.hpp"

using namespace ddp;

namespace {
using i64 = std::int64_t;

// C (ldc) = alpha op(A) (lda) op(B) (ldb) + beta C, every matrix inside a wider row; the padding must stay untouched.
template <class T>
double strided_err(Trans ta, Trans tb, i64 M, i64 N, i64 K, T alpha, T beta) {
  Generator g(static_cast<std::uint64_t>(M * 7 + N * 131 + K * 3));
  i64 const ar = ta == Trans::kNo ? M : K, ac = ta == Trans::kNo ? K : M;
  i64 const br = tb == Trans::kNo ? K : N, bc = tb == Trans::kNo ? N : K;
  i64 const lda = ac + 3, ldb = bc + 5, ldc = N + 2;
  std::vector<T> A(ar * lda), B(br * ldb), C(M * ldc), C0(M * ldc);
  for (auto& v : A) v = g.uniform<T>(-1, 1);
  for (auto& v : B) v = g.uniform<T>(-1, 1);
  for (i64 i = 0; i < M; ++i)
    for (i64 j = 0; j < ldc; ++j)
      C0[i * ldc + j] = j >= N ? T(7) : beta == T(0) ? std::numeric_limits<T>::quiet_NaN() : g.uniform<T>(-1, 1);
  C = C0;
  detail::host_gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  double worst = 0;
  for (i64 i = 0; i < M; ++i) {
    for (i64 j = N; j < ldc; ++j)
      if (C[i * ldc + j] != T(7)) worst = 1e9;  // wrote past N
    for (i64 j = 0; j < N; ++j) {
      double acc = 0;
      for (i64 k = 0; k < K; ++k) {
        double const a = ta == Trans::kNo ? A[i * lda + k] : A[k * lda + i];
        double const b = tb == Trans::kNo ? B[k * ldb + j] : B[j * ldb + k];
        acc += a * b;
      }
      double const ref = double(alpha) * acc + (beta == T(0) ? 0.0 : double(beta) * C0[i * ldc + j]);
      double const e = std::abs(ref - double(C[i * ldc + j])) / std::max(1.0, std::abs(ref));
      if (!(e <= worst)) worst = std::isnan(e) ? 1e9 : e;
    }
  }
  return worst;
}

// Causal attention in double, straight from its definition: y = softmax(scale·q·kᵀ, masked)·v per (b, h), and the
// gradient of Σ gy∘y with respect to q, k and v.
struct AttentionRef {
  std::vector<double> y, gqkv;
};
AttentionRef attention_ref(i64 B, i64 T, i64 H, i64 D, double scale, std::vector<float> const& qkv,
                           std::vector<float> const& gy) {
  i64 const C = H * D;
  AttentionRef r{std::vector<double>(B * T * C, 0.0), std::vector<double>(B * T * 3 * C, 0.0)};
  auto at = [&](i64 b, i64 t, i64 part, i64 h, i64 d) { return (b * T + t) * 3 * C + part * C + h * D + d; };
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < H; ++h)
      for (i64 i = 0; i < T; ++i) {
        std::vector<double> p(i + 1), dp(i + 1);
        double m = -1e300, sum = 0;
        for (i64 j = 0; j <= i; ++j) {
          double s = 0;
          for (i64 d = 0; d < D; ++d) s += double(qkv[at(b, i, 0, h, d)]) * qkv[at(b, j, 1, h, d)];
          p[j] = scale * s;
          m = std::max(m, p[j]);
        }
        for (i64 j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - m));
        for (auto& v : p) v /= sum;
        double dot = 0;
        for (i64 j = 0; j <= i; ++j) {
          double g = 0;
          for (i64 d = 0; d < D; ++d) {
            double const gyv = gy[(b * T + i) * C + h * D + d];
            r.y[(b * T + i) * C + h * D + d] += p[j] * qkv[at(b, j, 2, h, d)];
            r.gqkv[at(b, j, 2, h, d)] += p[j] * gyv;  // dv
            g += gyv * qkv[at(b, j, 2, h, d)];
          }
          dp[j] = g;
          dot += p[j] * g;
        }
        for (i64 j = 0; j <= i; ++j) {
          double const ds = scale * p[j] * (dp[j] - dot);
          for (i64 d = 0; d < D; ++d) {
            r.gqkv[at(b, i, 0, h, d)] += ds * qkv[at(b, j, 1, h, d)];  // dq
            r.gqkv[at(b, j, 1, h, d)] += ds * qkv[at(b, i, 0, h, d)];  // dk
          }
        }
      }
  return r;
}

template <class V, class R>
double max_rel(V const& got, R const& want) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    double const e = std::abs(double(got[i]) - double(want[i])) / std::max(1.0, std::abs(double(want[i])));
    if (!(e <= worst)) worst = std::isnan(e) ? 1e9 : e;
  }
  return worst;
}
}  // namespace

TEST_CASE("host_gemm: every transpose, leading dimensions past the columns, beta 0 (C holds NaN), 1 and 0.5") {
  struct Case {
    i64 M, N, K;
  };
  // attention's per-head shapes (64 × 64 × 32, 64 × 32 × 64: OpenBLAS's small-matrix kernels), odd sizes, and
  // a product large enough for the packed kernels
  for (Case c :
       {Case{64, 64, 32}, Case{64, 32, 64}, Case{7, 5, 3}, Case{33, 17, 65}, Case{1, 40, 9}, Case{150, 96, 130}})
    for (Trans ta : {Trans::kNo, Trans::kYes})
      for (Trans tb : {Trans::kNo, Trans::kYes})
        for (double beta : {0.0, 1.0, 0.5}) {
          CAPTURE(c.M);
          CAPTURE(c.N);
          CAPTURE(c.K);
          CAPTURE(int(ta));
          CAPTURE(int(tb));
          CAPTURE(beta);
          CHECK(strided_err<float>(ta, tb, c.M, c.N, c.K, 0.5f, float(beta)) < 1e-5);
          CHECK(strided_err<double>(ta, tb, c.M, c.N, c.K, 0.5, beta) < 1e-12);
        }
}

TEST_CASE(
    "attention_fwd/bwd: the fused kernel against the definition, the GPT's head shape and odd ones, beta 0 and 1") {
  struct Case {
    i64 B, T, H, D;
  };
  // The GPT's heads (64 × 32) and more shapes that fit detail::AttentionTiles (every tile width: D of 1 to 5
  // AVX-512 packets; rows in tiles of 16, 8 and 4; keys past one chunk of columns), and odd ones that take the BLAS.
  using Tiles = detail::AttentionTiles<float>;
  CHECK(Tiles::fits(64, 32));  // the tiles run here, whatever the instruction set
  CHECK_FALSE(Tiles::fits(17, 7));
  for (Case c : {Case{2, 64, 4, 32}, Case{1, 16, 3, 16}, Case{1, 48, 2, 48}, Case{1, 32, 1, 80}, Case{1, 128, 1, 16},
                 Case{1, 20, 2, 16}, Case{1, 5, 3, 2}, Case{3, 17, 2, 7}, Case{1, 1, 1, 1}}) {
    CAPTURE(c.T);
    CAPTURE(c.D);
    CAPTURE(Tiles::fits(c.T, c.D));
    i64 const C = c.H * c.D;
    Generator g(static_cast<std::uint64_t>(c.T * 31 + c.D));
    std::vector<float> qkv(c.B * c.T * 3 * C), gy(c.B * c.T * C), y(c.B * c.T * C),
        p(c.B * c.H * c.T * c.T, std::numeric_limits<float>::quiet_NaN());
    for (auto& v : qkv) v = g.uniform<float>(-1, 1);
    for (auto& v : gy) v = g.uniform<float>(-1, 1);
    double const scale = 1.0 / std::sqrt(double(c.D));
    AttentionRef const ref = attention_ref(c.B, c.T, c.H, c.D, scale, qkv, gy);
    Kernels<HostSpace>::attention_fwd(c.B, c.T, c.H, c.D, float(scale), qkv.data(), p.data(), y.data());
    CHECK(max_rel(y, ref.y) < 1e-5);
    i64 masked_nonzero = 0;  // P is kept for the backward: its masked part (key j > query i) exactly 0, never skipped
    for (i64 bh = 0; bh < c.B * c.H; ++bh)
      for (i64 i = 0; i < c.T; ++i)
        for (i64 j = i + 1; j < c.T; ++j) masked_nonzero += p[(bh * c.T + i) * c.T + j] != 0.0f;
    CHECK(masked_nonzero == 0);
    std::vector<float> gqkv(qkv.size(), std::numeric_limits<float>::quiet_NaN());  // beta 0 never reads it
    Kernels<HostSpace>::attention_bwd(c.B, c.T, c.H, c.D, float(scale), qkv.data(), p.data(), gy.data(), 0.0f,
                                      gqkv.data());
    CHECK(max_rel(gqkv, ref.gqkv) < 1e-5);
    std::vector<float> acc(qkv.size(), 1.0f);  // beta 1 adds onto it
    Kernels<HostSpace>::attention_bwd(c.B, c.T, c.H, c.D, float(scale), qkv.data(), p.data(), gy.data(), 1.0f,
                                      acc.data());
    std::vector<double> ref1(ref.gqkv);
    for (auto& v : ref1) v += 1.0;
    CHECK(max_rel(acc, ref1) < 1e-5);
  }
}
