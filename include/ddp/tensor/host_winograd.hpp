// Winograd F(4×4, 3×3) convolution on the host (Lavin & Gray, "Fast Algorithms for Convolutional Neural
// Networks", CVPR 2016) for 3×3, stride-1 layers. Each 4×4 output tile is computed from a 6×6 input tile
// with 36 multiplies per (input, output) channel pair instead of 144: the work becomes 36 independent
// GEMMs over transformed tiles, 4× fewer multiply-adds than im2col + GEMM.
//
//   forward        Y  = Aᵀ [ (G w Gᵀ) ⊙ (Bᵀ d B) ] A        per tile; the ⊙ summed over input channels is
//                                                          a GEMM per transformed position ξ (36 of them)
//   data gradient  the same forward, of dY padded by 2 - pad with the flipped, channel-swapped kernel
//   weight grad.   dw = Gᵀ [ Σ_tiles (A g Aᵀ) ⊙ (Bᵀ d B) ] G  (again one GEMM per ξ)
//
// Tiles are processed a few images at a time, so the transformed data stays in L2 between the transforms
// and the GEMMs; the transforms work on whole rows of tiles as vectors (loops the compiler vectorises).
// Everything is sequential and deterministic. Rounding differs from im2col (the transforms add and scale),
// by a few ulps of the summed magnitudes; select ConvAlgorithm::kIm2col for the plain product.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ddp/tensor/host_allocator.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp::detail::winograd {

using i64 = std::int64_t;
inline constexpr int kTile = 4;     // output tile side (m)
inline constexpr int kAlpha = 6;    // transformed tile side (m + r - 1)
inline constexpr int kPos = 36;     // transformed positions ξ per tile
inline constexpr i64 kL2Budget = i64{3} << 19;  // bytes of V + M per chunk (1.5 MiB)

// The kernels' preconditions (the automatic choice in HostConvKernels also wants enough channels for the
// GEMMs to pay for the transforms).
constexpr bool supports(ConvGeometry const& g) noexcept { return g.k == 3 && g.stride == 1; }
// The data gradient runs as a forward convolution with padding 2 - pad, so pad must be at most 2.
constexpr bool supports_data_grad(ConvGeometry const& g) noexcept { return supports(g) && g.pad <= 2; }

// Output tiling of a geometry; tiles are processed a few whole images at a time (a chunk), sized so the
// chunk's transformed input and product (V and M) stay in L2 between the transforms and the GEMMs.
struct Tiling {
  i64 TH, TW, per_image, images_per_chunk, RW;
  Tiling(ConvGeometry const& g, i64 elem_bytes)
      : TH((g.OH() + kTile - 1) / kTile), TW((g.OW() + kTile - 1) / kTile), per_image(TH * TW) {
    i64 const per_tile = kPos * (g.C + g.O) * elem_bytes;
    images_per_chunk = std::clamp<i64>(kL2Budget / (per_tile * per_image), 1, std::max<i64>(g.N, 1));
    RW = (TW + 1 + 7) / 8 * 8;  // lanes of one row of tiles (+1 for the 2-pixel overlap), padded to 8
  }
  i64 chunk_tiles() const noexcept { return images_per_chunk * per_image; }
};

// ---- the three 1-D transforms, over n lanes (n a multiple of 8): out[·][b] from in[·][b] ----

// out = Bᵀ·in (6 → 6)
template <class T>
DDP_ALWAYS_INLINE void bt6(T const* const (&d)[6], T* const (&o)[6], i64 n) {
  T const *d0 = d[0], *d1 = d[1], *d2 = d[2], *d3 = d[3], *d4 = d[4], *d5 = d[5];
  T *o0 = o[0], *o1 = o[1], *o2 = o[2], *o3 = o[3], *o4 = o[4], *o5 = o[5];
#pragma GCC ivdep
  for (i64 l = 0; l < n; ++l) {
    T const a = d4[l] - T(4) * d2[l], b = d3[l] - T(4) * d1[l];  // rows 1, 2 share these
    T const c = d4[l] - d2[l], e = T(2) * (d3[l] - d1[l]);        // rows 3, 4 share these
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
#pragma GCC ivdep
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
#pragma GCC ivdep
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

// ---- kernel transforms ----

// U[ξ][a][b] = (G k_ab Gᵀ)[ξ] for the A×B kernels k_ab. Forward: k_ab = w[a][b] (a: output channel).
// Data gradient (flip): k_ab = w[b][a] rotated by 180° (a: input channel of the forward).
template <class T>
void weight_transform(i64 A, i64 B, T const* w, bool flip, T* U) {
  static constexpr double G[6][3] = {{1.0 / 4, 0, 0},           {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                     {-1.0 / 6, 1.0 / 6, -1.0 / 6}, {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                     {1.0 / 24, -1.0 / 12, 1.0 / 6}, {0, 0, 1}};
  i64 const plane = A * B;
  for (i64 a = 0; a < A; ++a)
    for (i64 b = 0; b < B; ++b) {
      T const* k = flip ? w + (b * A + a) * 9 : w + (a * B + b) * 9;
      T kk[3][3];
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) kk[i][j] = flip ? k[(2 - i) * 3 + (2 - j)] : k[i * 3 + j];
      T gk[6][3];  // G·k
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 3; ++j) gk[i][j] = T(G[i][0]) * kk[0][j] + T(G[i][1]) * kk[1][j] + T(G[i][2]) * kk[2][j];
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 6; ++j)
          U[(i * 6 + j) * plane + a * B + b] = gk[i][0] * T(G[j][0]) + gk[i][1] * T(G[j][1]) + gk[i][2] * T(G[j][2]);
    }
}

// w[o][c] = beta·w[o][c] + (Gᵀ dU[·][o][c] G), the weight gradient from its transformed accumulation.
template <class T>
void weight_transform_adjoint(i64 O, i64 C, T const* dU, T beta, T* gw) {
  static constexpr double G[6][3] = {{1.0 / 4, 0, 0},           {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                     {-1.0 / 6, 1.0 / 6, -1.0 / 6}, {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                     {1.0 / 24, -1.0 / 12, 1.0 / 6}, {0, 0, 1}};
  i64 const plane = O * C;
  for (i64 oc = 0; oc < plane; ++oc) {
    T u[6][6];
    for (int xi = 0; xi < kPos; ++xi) u[xi / 6][xi % 6] = dU[xi * plane + oc];
    T ug[6][3];  // u·G
    for (int i = 0; i < 6; ++i)
      for (int j = 0; j < 3; ++j) {
        T s = 0;
        for (int q = 0; q < 6; ++q) s += u[i][q] * T(G[q][j]);
        ug[i][j] = s;
      }
    T* out = gw + oc * 9;
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) {
        T s = 0;
        for (int q = 0; q < 6; ++q) s += T(G[q][i]) * ug[q][j];
        out[i * 3 + j] = beta == T(0) ? s : out[i * 3 + j] + s;
      }
  }
}

// ---- data transforms, one image plane at a time ----
// A plane's tiles are numbered j = th·TW + tw; in V / M / dM, position ξ, channel c, tile j of the chunk's
// image i sits at [ξ·plane + c·tc + i·per_image + j] (tc: the chunk's tile count).
// No tile window is ever gathered. Along x, a row of the image is split into its 4 phases (x mod 4) and
// the 1-D transform of every tile column is a lane-wise sum of shifted phase rows (RW lanes). Along y,
// the partial results are laid out so that the second 1-D transform runs over all TH·TW tiles of the plane
// as one contiguous vector, reading or writing V / M / dM directly.

template <class T>
struct PlaneScratch {
  i64 RW, LR;        // lanes of a phase row; length of a plane-wide row (TH·TW + spill)
  HostBuffer<T> big;    // 36 plane-wide rows
  HostBuffer<T> small;  // padded image row + 6 phase rows
  explicit PlaneScratch(Tiling const& tl)
      : RW(tl.RW),
        LR(tl.per_image + tl.RW + 8),
        big(static_cast<std::size_t>(kPos * (tl.per_image + tl.RW + 8))),
        small(static_cast<std::size_t>(4 * (tl.RW + 2) + 6 * (tl.RW + 8))) {
    std::memset(big.data(), 0, big.size() * sizeof(T));
    std::memset(small.data(), 0, small.size() * sizeof(T));
  }
  T* row() noexcept { return small.data(); }                                    // 4·(RW + 2) values
  T* phase(int r) noexcept { return small.data() + 4 * (RW + 2) + r * (RW + 8); }  // RW + 8 values
  T* wide(int r) noexcept { return big.data() + r * LR; }
};

// Loads padded row yy (zero outside the image: rows/cols shifted by pad) into s.row() and splits it into
// its 4 phases: phase(r)[b] = row[4b + r], b <= RW.
template <class T>
DDP_ALWAYS_INLINE void load_phases(T const* plane, i64 H, i64 W, i64 pad, i64 yy, PlaneScratch<T>& s) {
  T* row = s.row();
  i64 const len = 4 * (s.RW + 1), iy = yy - pad;
  if (iy < 0 || iy >= H) {
    std::fill(row, row + len, T(0));
  } else {
    i64 const lo = std::min(pad, len), n = std::clamp<i64>(len - pad, 0, W);
    std::fill(row, row + lo, T(0));
    std::memcpy(row + lo, plane + iy * W, sizeof(T) * n);
    std::fill(row + lo + n, row + len, T(0));
  }
  T *p0 = s.phase(0), *p1 = s.phase(1), *p2 = s.phase(2), *p3 = s.phase(3);
  for (i64 b = 0; b <= s.RW; ++b) {
    p0[b] = row[4 * b];
    p1[b] = row[4 * b + 1];
    p2[b] = row[4 * b + 2];
    p3[b] = row[4 * b + 3];
  }
}

// V[ξ][·][j] = (Bᵀ d B)[ξ] for each tile's 6×6 input window d (zero-padded) of plane x (H×W).
template <class T>
void input_transform_plane(ConvGeometry const& g, Tiling const& tl, T const* x, T* V, i64 plane, PlaneScratch<T>& s) {
  i64 const RW = tl.RW, TW = tl.TW, TH = tl.TH, Hp = 4 * TH + 2;
  alignas(64) T tmp[6][64 + 8];
  for (i64 yy = 0; yy < Hp; ++yy) {
    load_phases(x, g.H, g.W, g.pad, yy, s);
    i64 const th = yy / 4, k = yy % 4;
    for (i64 b0 = 0; b0 < RW; b0 += 64) {
      i64 const n = std::min<i64>(64, RW - b0);
      T const* const d[6] = {s.phase(0) + b0, s.phase(1) + b0,     s.phase(2) + b0,
                             s.phase(3) + b0, s.phase(0) + b0 + 1, s.phase(1) + b0 + 1};
      T* const o[6] = {tmp[0], tmp[1], tmp[2], tmp[3], tmp[4], tmp[5]};
      bt6<T>(d, o, n);
      // Row yy is row k of tile row th, and row k + 4 of tile row th - 1. Whole lane groups are copied;
      // the lanes past TW land in the next tile row's slots, which a later row overwrites.
      for (int q = 0; q < 6; ++q) {
        if (th < TH) std::copy(tmp[q], tmp[q] + n, s.wide(q * 6 + static_cast<int>(k)) + th * TW + b0);
        if (k < 2 && th >= 1) std::copy(tmp[q], tmp[q] + n, s.wide(q * 6 + static_cast<int>(k) + 4) + (th - 1) * TW + b0);
      }
    }
  }
  i64 const n = tl.per_image;
  for (int q = 0; q < 6; ++q) {
    T const* const d[6] = {s.wide(q * 6), s.wide(q * 6 + 1), s.wide(q * 6 + 2),
                           s.wide(q * 6 + 3), s.wide(q * 6 + 4), s.wide(q * 6 + 5)};
    T* const o[6] = {V + q * plane, V + (6 + q) * plane, V + (12 + q) * plane,
                     V + (18 + q) * plane, V + (24 + q) * plane, V + (30 + q) * plane};
    bt6<T>(d, o, n);
  }
}

// y (OH×OW plane) = beta·y + Aᵀ M A + bias for each tile, from M[ξ][·][j].
template <class T>
void output_transform_plane(ConvGeometry const& g, Tiling const& tl, T const* M, i64 plane, T bias, T beta, T* y,
                            PlaneScratch<T>& s) {
  i64 const RW = tl.RW, TW = tl.TW, OH = g.OH(), OW = g.OW(), n = tl.per_image;
  for (int q = 0; q < 6; ++q) {  // along y: S[q·4 + u][j] = (Aᵀ·column q of tile j)[u]
    T const* const d[6] = {M + q * plane,        M + (6 + q) * plane,  M + (12 + q) * plane,
                           M + (18 + q) * plane, M + (24 + q) * plane, M + (30 + q) * plane};
    T* const o[4] = {s.wide(q * 4), s.wide(q * 4 + 1), s.wide(q * 4 + 2), s.wide(q * 4 + 3)};
    at6<T>(d, o, n);
  }
  T *z0 = s.phase(0), *z1 = s.phase(1), *z2 = s.phase(2), *z3 = s.phase(3);
  for (i64 yy = 0; yy < OH; ++yy) {  // along x: output row yy = row u of tile row th, as 4 phases
    i64 const th = yy / 4, u = yy % 4, off = th * TW;
    T const* const d[6] = {s.wide(static_cast<int>(u)) + off,      s.wide(4 + static_cast<int>(u)) + off,
                           s.wide(8 + static_cast<int>(u)) + off,  s.wide(12 + static_cast<int>(u)) + off,
                           s.wide(16 + static_cast<int>(u)) + off, s.wide(20 + static_cast<int>(u)) + off};
    T* const o[4] = {z0, z1, z2, z3};
    at6<T>(d, o, RW);
    T* row = y + yy * OW;
    i64 const full = OW / 4;
    if (beta == T(0)) {
      for (i64 b = 0; b < full; ++b) {
        row[4 * b] = z0[b] + bias;
        row[4 * b + 1] = z1[b] + bias;
        row[4 * b + 2] = z2[b] + bias;
        row[4 * b + 3] = z3[b] + bias;
      }
      for (i64 xx = 4 * full; xx < OW; ++xx) row[xx] = s.phase(static_cast<int>(xx & 3))[full] + bias;
    } else {
      for (i64 b = 0; b < full; ++b) {
        row[4 * b] += z0[b] + bias;
        row[4 * b + 1] += z1[b] + bias;
        row[4 * b + 2] += z2[b] + bias;
        row[4 * b + 3] += z3[b] + bias;
      }
      for (i64 xx = 4 * full; xx < OW; ++xx) row[xx] += s.phase(static_cast<int>(xx & 3))[full] + bias;
    }
  }
}

// dM[ξ][·][j] = (A g Aᵀ)[ξ] for each tile's 4×4 window g of the output-gradient plane gy (zero past the edge).
template <class T>
void output_adjoint_plane(ConvGeometry const& g, Tiling const& tl, T const* gy, T* dM, i64 plane, PlaneScratch<T>& s) {
  i64 const RW = tl.RW, TW = tl.TW, TH = tl.TH, OH = g.OH(), OW = g.OW(), n = tl.per_image;
  alignas(64) T tmp[6][64 + 8];
  for (i64 yy = 0; yy < 4 * TH; ++yy) {  // along x: Wd[q·4 + u][j] = (A·row u of tile j)[q]
    load_phases(gy, OH, OW, 0, yy, s);
    i64 const th = yy / 4, u = yy % 4;
    for (i64 b0 = 0; b0 < RW; b0 += 64) {
      i64 const m = std::min<i64>(64, RW - b0);
      T const* const d[4] = {s.phase(0) + b0, s.phase(1) + b0, s.phase(2) + b0, s.phase(3) + b0};
      T* const o[6] = {tmp[0], tmp[1], tmp[2], tmp[3], tmp[4], tmp[5]};
      a4<T>(d, o, m);
      for (int q = 0; q < 6; ++q) std::copy(tmp[q], tmp[q] + m, s.wide(q * 4 + static_cast<int>(u)) + th * TW + b0);
    }
  }
  for (int q = 0; q < 6; ++q) {  // along y, straight into dM
    T const* const d[4] = {s.wide(q * 4), s.wide(q * 4 + 1), s.wide(q * 4 + 2), s.wide(q * 4 + 3)};
    T* const o[6] = {dM + q * plane,        dM + (6 + q) * plane,  dM + (12 + q) * plane,
                     dM + (18 + q) * plane, dM + (24 + q) * plane, dM + (30 + q) * plane};
    a4<T>(d, o, n);
  }
}

// Chunk-level drivers: images [n0, n0 + cn), tc = cn · per_image tiles.
template <class T>
void input_transform(ConvGeometry const& g, Tiling const& tl, T const* x, i64 n0, i64 cn, T* V, PlaneScratch<T>& s) {
  i64 const tc = cn * tl.per_image, plane = g.C * tc, HW = g.H * g.W;
  for (i64 n = 0; n < cn; ++n)
    for (i64 c = 0; c < g.C; ++c)
      input_transform_plane(g, tl, x + ((n0 + n) * g.C + c) * HW, V + c * tc + n * tl.per_image, plane, s);
}
template <class T>
void output_transform(ConvGeometry const& g, Tiling const& tl, T const* M, T const* bias, T beta, i64 n0, i64 cn,
                      T* y, PlaneScratch<T>& s) {
  i64 const tc = cn * tl.per_image, plane = g.O * tc, OHW = g.OH() * g.OW();
  for (i64 n = 0; n < cn; ++n)
    for (i64 o = 0; o < g.O; ++o)
      output_transform_plane(g, tl, M + o * tc + n * tl.per_image, plane, bias ? bias[o] : T(0), beta,
                             y + ((n0 + n) * g.O + o) * OHW, s);
}
template <class T>
void output_adjoint(ConvGeometry const& g, Tiling const& tl, T const* gy, i64 n0, i64 cn, T* dM, PlaneScratch<T>& s) {
  i64 const tc = cn * tl.per_image, plane = g.O * tc, OHW = g.OH() * g.OW();
  for (i64 n = 0; n < cn; ++n)
    for (i64 o = 0; o < g.O; ++o)
      output_adjoint_plane(g, tl, gy + ((n0 + n) * g.O + o) * OHW, dM + o * tc + n * tl.per_image, plane, s);
}

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// y = beta·y + conv(x, kernels) + bias, with U the transformed kernels (weight_transform, A = g.O, B = g.C).
template <class T>
void forward(ConvGeometry const& g, T const* x, T const* U, T const* bias, T beta, T* y) {
  Tiling const tl(g, sizeof(T));
  i64 const ct = tl.chunk_tiles();
  HostBuffer<T> V(static_cast<std::size_t>(kPos * g.C * ct + 64)), M(static_cast<std::size_t>(kPos * g.O * ct + 64));
  PlaneScratch<T> s(tl);
  for (i64 n0 = 0; n0 < g.N; n0 += tl.images_per_chunk) {
    i64 const cn = std::min(tl.images_per_chunk, g.N - n0), tc = cn * tl.per_image;
    input_transform(g, tl, x, n0, cn, V.data(), s);
    for (int xi = 0; xi < kPos; ++xi) {
      Eigen::Map<RowMat<T> const> u(U + xi * g.O * g.C, g.O, g.C), v(V.data() + xi * g.C * tc, g.C, tc);
      Eigen::Map<RowMat<T>>(M.data() + xi * g.O * tc, g.O, tc).noalias() = u * v;
    }
    output_transform(g, tl, M.data(), bias, beta, n0, cn, y, s);
  }
}

// gw = beta·gw + ∂L/∂w from the output gradient gy and the input x.
template <class T>
void weight_grad(ConvGeometry const& g, T const* x, T const* gy, T beta, T* gw) {
  Tiling const tl(g, sizeof(T));
  i64 const ct = tl.chunk_tiles();
  HostBuffer<T> V(static_cast<std::size_t>(kPos * g.C * ct + 64)), dM(static_cast<std::size_t>(kPos * g.O * ct + 64));
  HostBuffer<T> dU(static_cast<std::size_t>(kPos * g.O * g.C));
  PlaneScratch<T> s(tl);
  for (i64 n0 = 0; n0 < g.N; n0 += tl.images_per_chunk) {
    i64 const cn = std::min(tl.images_per_chunk, g.N - n0), tc = cn * tl.per_image;
    input_transform(g, tl, x, n0, cn, V.data(), s);
    output_adjoint(g, tl, gy, n0, cn, dM.data(), s);
    for (int xi = 0; xi < kPos; ++xi) {
      Eigen::Map<RowMat<T> const> m(dM.data() + xi * g.O * tc, g.O, tc), v(V.data() + xi * g.C * tc, g.C, tc);
      Eigen::Map<RowMat<T>> u(dU.data() + xi * g.O * g.C, g.O, g.C);
      if (n0 == 0)
        u.noalias() = m * v.transpose();
      else
        u.noalias() += m * v.transpose();
    }
  }
  weight_transform_adjoint(g.O, g.C, dU.data(), beta, gw);
}

// gx = beta·gx + ∂L/∂x: the forward convolution of gy (padded by 2 - pad) with the flipped kernels.
template <class T>
void data_grad(ConvGeometry const& g, T const* w, T const* gy, T beta, T* gx) {
  ConvGeometry const t{.N = g.N, .C = g.O, .H = g.OH(), .W = g.OW(), .O = g.C, .k = 3, .stride = 1, .pad = 2 - g.pad};
  HostBuffer<T> U(static_cast<std::size_t>(kPos * g.O * g.C));
  weight_transform(g.C, g.O, w, /*flip=*/true, U.data());
  forward(t, gy, U.data(), static_cast<T const*>(nullptr), beta, gx);
}

}  // namespace ddp::detail::winograd
