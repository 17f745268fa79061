// detail::AttentionTiles, the register tiles of the host's fused attention, against double-precision references:
// every tile width and height the shapes reach (whatever the instruction set's packet), strided operands whose
// padding must stay untouched, beta 0 over NaN (never read) and beta 0.5, in float and double.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "ddp/ddp.hpp"

using namespace ddp;

namespace {
using i64 = std::int64_t;

template <class T>
std::vector<T> uniform(Generator& g, i64 n) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = g.uniform<T>(-1, 1);
  return v;
}

// A lower-triangular (Tn, Tn) L: uniform on and below the diagonal, exactly 0 past it (as attention's P and dS).
template <class T>
std::vector<T> lower(Generator& g, i64 Tn) {
  auto L = uniform<T>(g, Tn * Tn);
  for (i64 i = 0; i < Tn; ++i)
    for (i64 j = i + 1; j < Tn; ++j) L[i * Tn + j] = T(0);
  return L;
}

template <class T>
double tol() {
  return sizeof(T) == 4 ? 1e-5 : 1e-12;
}

template <class T>
void check_shape(i64 Tn, i64 D) {
  using Tiles = detail::AttentionTiles<T>;
  REQUIRE(Tiles::fits(Tn, D));
  Generator g(static_cast<std::uint64_t>(Tn * 1000 + D));
  i64 const lda = D + 3, ldo = D + 5;  // rows wider than D: the padding must not be written
  auto const A = uniform<T>(g, Tn * lda), B = uniform<T>(g, Tn * lda);

  // pack_t: exactly Bᵀ
  std::vector<T> Bt(static_cast<std::size_t>(D * Tn));
  Tiles::pack_t(Tn, D, B.data(), lda, Bt.data());
  i64 wrong = 0;
  for (i64 d = 0; d < D; ++d)
    for (i64 j = 0; j < Tn; ++j) wrong += Bt[d * Tn + j] != B[j * lda + d];
  CHECK(wrong == 0);

  // scores: every entry a query can see (j <= i), A·Bᵀ
  std::vector<T> S(static_cast<std::size_t>(Tn * Tn), std::numeric_limits<T>::quiet_NaN());
  Tiles::scores(Tn, D, A.data(), lda, Bt.data(), S.data());
  double worst = 0;
  for (i64 i = 0; i < Tn; ++i)
    for (i64 j = 0; j <= i; ++j) {
      double ref = 0;
      for (i64 d = 0; d < D; ++d) ref += double(A[i * lda + d]) * double(B[j * lda + d]);
      double const e = std::abs(double(S[i * Tn + j]) - ref) / std::max(1.0, std::abs(ref));
      worst = std::isnan(e) ? 1e9 : std::max(worst, e);
    }
  CHECK(worst < tol<T>());

  // lower_times (L·B) and lower_t_times (Lᵀ·B), beta 0 over NaN and beta 0.5 over values
  auto const L = lower<T>(g, Tn);
  for (int transposed = 0; transposed < 2; ++transposed)
    for (T beta : {T(0), T(0.5)}) {
      CAPTURE(transposed);
      CAPTURE(beta);
      std::vector<T> O0(static_cast<std::size_t>(Tn * ldo));
      for (i64 i = 0; i < Tn; ++i)
        for (i64 d = 0; d < ldo; ++d)
          O0[i * ldo + d] = d >= D ? T(7) : beta == T(0) ? std::numeric_limits<T>::quiet_NaN() : g.uniform<T>(-1, 1);
      std::vector<T> O(O0);
      if (transposed)
        Tiles::lower_t_times(Tn, D, L.data(), B.data(), lda, beta, O.data(), ldo);
      else
        Tiles::lower_times(Tn, D, L.data(), B.data(), lda, beta, O.data(), ldo);
      double err = 0;
      i64 padding = 0;
      for (i64 i = 0; i < Tn; ++i)
        for (i64 d = 0; d < ldo; ++d) {
          if (d >= D) {
            padding += O[i * ldo + d] != T(7);
            continue;
          }
          double ref = beta == T(0) ? 0.0 : double(beta) * double(O0[i * ldo + d]);
          for (i64 k = 0; k < Tn; ++k)
            ref += double(transposed ? L[k * Tn + i] : L[i * Tn + k]) * double(B[k * lda + d]);
          double const e = std::abs(double(O[i * ldo + d]) - ref) / std::max(1.0, std::abs(ref));
          err = std::isnan(e) ? 1e9 : std::max(err, e);
        }
      CHECK(err < tol<T>());
      CHECK(padding == 0);
    }
}
}  // namespace

TEST_CASE("AttentionTiles: pack_t, scores, L·B and Lᵀ·B against double references, every tile shape") {
  using F = detail::AttentionTiles<float>;
  using Dd = detail::AttentionTiles<double>;
  // Shapes in whole packets of this build's width W (16 floats with AVX-512, 8 with AVX, 4 with SSE): D of 1 to 5
  // packets (tiles 1 to 4 packets wide, and a wide D in two chunks), Tn of 1 to 9 packets (row tiles of 16, 8 and 4;
  // causal blocks whose keys pass one chunk of columns), in
  // whole tiles of 4 rows.
  for (i64 dp : {1, 2, 3, 4, 5})
    for (i64 tp : {1, 2, 3, 9}) {
      CAPTURE(dp);
      CAPTURE(tp);
      check_shape<float>(tp * std::lcm(F::W, i64{4}), dp * F::W);  // rows in whole tiles of 4 at least
      check_shape<double>(tp * std::lcm(Dd::W, i64{4}), dp * Dd::W);
    }
  // What does not fit: keys or D not in whole packets (the BLAS runs those heads)
  if (F::W > 1) {
    CHECK_FALSE(F::fits(F::W + 1, F::W));
    CHECK_FALSE(F::fits(F::W, F::W + 1));
  }
  CHECK_FALSE(F::fits(0, F::W));
}
