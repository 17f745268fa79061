// Winograd F(4×4, 3×3) arithmetic (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR
// 2016): the 1-D transforms Bᵀ, Aᵀ and their adjoints B, A applied lane-wise to rows of values, and the kernel
// transform G⊗G with its adjoint. Pure arithmetic, no layout: host_winograd.hpp arranges the data.
//
//   Bᵀ = | 4  0 -5  0  1  0 |    G = | 1/4     0     0 |    Aᵀ = | 1  1  1  1  1  0 |
//        | 0 -4 -4  1  1  0 |        | -1/6 -1/6  -1/6 |         | 0  1 -1  2 -2  0 |
//        | 0  4 -4 -1  1  0 |        | -1/6  1/6  -1/6 |         | 0  1  1  4  4  0 |
//        | 0 -2 -1  2  1  0 |        | 1/24 1/12   1/6 |         | 0  1 -1  8 -8  1 |
//        | 0  2 -1 -2  1  0 |        | 1/24 -1/12  1/6 |
//        | 0  4  0 -5  0  1 |        | 0       0     1 |
#pragma once

#include <Eigen/Core>
#include <cstdint>

#include "ddp/config.hpp"

namespace ddp::detail::winograd {

using i64 = std::int64_t;
inline constexpr int kTile = 4;   // output tile side (m)
inline constexpr int kAlpha = 6;  // transformed tile side (m + r - 1)
inline constexpr int kPos = 36;   // transformed positions ξ per tile

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// ---- the three 1-D transforms, lane-wise over n lanes: out[·][l] from in[·][l] ----

// out = Bᵀ·in (6 → 6)
template <class T>
DDP_ALWAYS_INLINE void bt6(T const* const (&d)[6], T* const (&o)[6], i64 n) {
  T const *d0 = d[0], *d1 = d[1], *d2 = d[2], *d3 = d[3], *d4 = d[4], *d5 = d[5];
  T *o0 = o[0], *o1 = o[1], *o2 = o[2], *o3 = o[3], *o4 = o[4], *o5 = o[5];
  DDP_IVDEP
  for (i64 l = 0; l < n; ++l) {
    T const a = d4[l] - T(4) * d2[l], b = d3[l] - T(4) * d1[l];  // rows 1, 2 share these
    T const c = d4[l] - d2[l], e = T(2) * (d3[l] - d1[l]);       // rows 3, 4 share these
    o0[l] = T(4) * d0[l] - T(5) * d2[l] + d4[l];
    o1[l] = a + b;
    o2[l] = a - b;
    o3[l] = c + e;
    o4[l] = c - e;
    o5[l] = T(4) * d1[l] - T(5) * d3[l] + d5[l];
  }
}
// out = Aᵀ·in (6 → 4)
template <class T>
DDP_ALWAYS_INLINE void at6(T const* const (&m)[6], T* const (&o)[4], i64 n) {
  T const *m0 = m[0], *m1 = m[1], *m2 = m[2], *m3 = m[3], *m4 = m[4], *m5 = m[5];
  T *o0 = o[0], *o1 = o[1], *o2 = o[2], *o3 = o[3];
  DDP_IVDEP
  for (i64 l = 0; l < n; ++l) {
    T const p12 = m1[l] + m2[l], d12 = m1[l] - m2[l], p34 = m3[l] + m4[l], d34 = m3[l] - m4[l];
    o0[l] = m0[l] + p12 + p34;
    o1[l] = d12 + T(2) * d34;
    o2[l] = p12 + T(4) * p34;
    o3[l] = d12 + T(8) * d34 + m5[l];
  }
}
// out = A·in (4 → 6), the adjoint of at6
template <class T>
DDP_ALWAYS_INLINE void a4(T const* const (&g)[4], T* const (&o)[6], i64 n) {
  T const *g0 = g[0], *g1 = g[1], *g2 = g[2], *g3 = g[3];
  T *o0 = o[0], *o1 = o[1], *o2 = o[2], *o3 = o[3], *o4 = o[4], *o5 = o[5];
  DDP_IVDEP
  for (i64 l = 0; l < n; ++l) {
    T const e = g0[l] + g2[l], od = g1[l] + g3[l];
    T const e4 = g0[l] + T(4) * g2[l], o4v = T(2) * g1[l] + T(8) * g3[l];
    o0[l] = g0[l];
    o1[l] = e + od;
    o2[l] = e - od;
    o3[l] = e4 + o4v;
    o4[l] = e4 - o4v;
    o5[l] = g3[l];
  }
}

// out = B·in (6 → 6), the adjoint of bt6
template <class T>
DDP_ALWAYS_INLINE void b6(T const* const (&d)[6], T* const (&o)[6], i64 n) {
  T const *d0 = d[0], *d1 = d[1], *d2 = d[2], *d3 = d[3], *d4 = d[4], *d5 = d[5];
  T *o0 = o[0], *o1 = o[1], *o2 = o[2], *o3 = o[3], *o4 = o[4], *o5 = o[5];
  DDP_IVDEP
  for (i64 l = 0; l < n; ++l) {
    T const p12 = d1[l] + d2[l], m12 = d2[l] - d1[l], p34 = d3[l] + d4[l], m34 = d3[l] - d4[l];
    o0[l] = T(4) * d0[l];
    o1[l] = T(4) * (m12 + d5[l]) + T(2) * (d4[l] - d3[l]);
    o2[l] = T(-5) * d0[l] - T(4) * p12 - p34;
    o3[l] = -m12 + T(2) * m34 - T(5) * d5[l];
    o4[l] = d0[l] + p12 + p34;
    o5[l] = d5[l];
  }
}

// ---- kernel transforms ----

// G ⊗ G as a 36 × 9 matrix: (G k Gᵀ)[ξ = 6i + j] = Σ_{p,q} G[i][p]·G[j][q]·k[3p + q].
template <class T>
Eigen::Matrix<T, kPos, 9, Eigen::RowMajor> const& kron_g() {
  static Eigen::Matrix<T, kPos, 9, Eigen::RowMajor> const m = [] {
    constexpr double G[6][3] = {{1.0 / 4, 0, 0},
                                {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                {0, 0, 1}};
    Eigen::Matrix<T, kPos, 9, Eigen::RowMajor> k;
    for (int i = 0; i < 6; ++i)
      for (int j = 0; j < 6; ++j)
        for (int p = 0; p < 3; ++p)
          for (int q = 0; q < 3; ++q) k(i * 6 + j, p * 3 + q) = T(G[i][p] * G[j][q]);
    return k;
  }();
  return m;
}

// U[ξ][o][c] = (G w_oc Gᵀ)[ξ] for the kernels w (O, C, 3, 3): one product (36 × 9)·(9 × O·C).
template <class T>
void weight_transform(i64 O, i64 C, T const* w, T* U) {
  Eigen::Map<RowMat<T>>(U, kPos, O * C).noalias() = kron_g<T>() * Eigen::Map<RowMat<T> const>(w, O * C, 9).transpose();
}

// gw (O, C, 3, 3) = beta·gw + Gᵀ dU[·][o][c] G, the weight gradient from its transformed accumulation:
// one product (O·C × 36)·(36 × 9).
template <class T>
void weight_transform_adjoint(i64 O, i64 C, T const* dU, T beta, T* gw) {
  Eigen::Map<RowMat<T>> out(gw, O * C, 9);
  auto const prod = Eigen::Map<RowMat<T> const>(dU, kPos, O * C).transpose() * kron_g<T>();
  if (beta == T(0))
    out.noalias() = prod;
  else
    out.noalias() += prod;
}

}  // namespace ddp::detail::winograd
