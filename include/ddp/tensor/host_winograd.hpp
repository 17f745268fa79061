// Winograd F(4×4, 3×3) convolution on the host (Lavin & Gray, "Fast Algorithms for Convolutional Neural
// Networks", CVPR 2016) for 3×3, stride-1 layers. Each 4×4 output tile is computed from a 6×6 input tile
// with 36 multiplies per (input, output) channel pair instead of 144: the work becomes 36 independent
// GEMMs over transformed tiles, 4× fewer multiply-adds than im2col + GEMM.
//
//   forward        Y  = Aᵀ [ (G w Gᵀ) ⊙ (Bᵀ d B) ] A        per tile; the ⊙ summed over input channels is
//                                                          a GEMM per transformed position ξ (36 of them)
//   backward       dM = A g Aᵀ per tile of the output gradient g, shared by both gradients:
//                  weight  dw = Gᵀ [ Σ_tiles dM ⊙ (Bᵀ d B) ] G   (one GEMM per ξ, summed over tiles)
//                  input   dx = Σ_tiles B [ Σ_out (G w Gᵀ) ⊙ dM ] Bᵀ, overlapping 6×6 windows added up
//                          (the exact adjoint of the forward; one GEMM per ξ)
//
// Tiles are processed a few images at a time, so the transformed data stays in L2 between the transforms
// and the GEMMs. Transformed data is channel-fastest ([ξ][tile][channel]): the transforms then run on a
// whole row of tiles × all channels as one vector (loops the compiler vectorises), and only the first and
// last step (reading the NCHW input, writing the NCHW output) touch single values.
// Everything is sequential and deterministic. Rounding differs from im2col (the transforms add and scale),
// by a few ulps of the summed magnitudes; select ConvAlgorithm::kIm2col for the plain product.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ddp/config.hpp"
#include "ddp/tensor/host_allocator.hpp"
#include "ddp/tensor/host_channels_last.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/tensor/winograd_math.hpp"

namespace ddp::detail::winograd {

inline constexpr i64 kL2Budget = i64{3} << 19;  // bytes of V + M per chunk (1.5 MiB)

// The kernels' precondition (the automatic choice in HostConvKernels also wants enough channels for the
// GEMMs to pay for the transforms). Any padding.
constexpr bool supports(ConvGeometry const& g) noexcept { return g.k == 3 && g.stride == 1; }

// Output tiling of a geometry; tiles are processed a few whole images at a time (a chunk), sized so the
// chunk's transformed input and product (V and M) stay in L2 between the transforms and the GEMMs.
struct Tiling {
  i64 TH, TW, per_image, images_per_chunk;
  Tiling(ConvGeometry const& g, i64 elem_bytes)
      : TH((g.OH() + kTile - 1) / kTile), TW((g.OW() + kTile - 1) / kTile), per_image(TH * TW) {
    i64 const per_tile = kPos * (g.C + g.O) * elem_bytes;
    images_per_chunk = std::clamp<i64>(kL2Budget / (per_tile * per_image), 1, std::max<i64>(g.N, 1));
  }
  i64 chunk_tiles() const noexcept { return images_per_chunk * per_image; }
};

// ---- data transforms, one image and one row of tiles at a time ----
// In V (M, dM), position ξ, tile t of the chunk and channel c sit at [ξ·plane + t·C + c] (plane = tc·C,
// tc the chunk's tile count); the chunk's image i has tiles i·per_image + th·TW + tw.

template <class T>
struct Scratch {
  i64 TW, CM;  // tiles per row; max(channels in, channels out)
  HostBuffer<T> buf;
  T* image;    // one image, channel-fastest: H·W rows of C (or OH·OW rows of O)
  T* phases;   // 4 × (TW + 1) × CM: one padded image row split by x mod 4
  T* rows[6];  // input: x-transformed rows k = 0..5 of the current tile row, 6 × TW × CM each
  T* mid;      // output: 24 × TW × CM (S or W)
  T* pooled;   // with g.pool2(): one pooled image, channel-fastest (OH/2 · OW/2 rows of O)
  static i64 pooled_size(ConvGeometry const& g) { return g.pool2() ? (g.OH() / 2) * (g.OW() / 2) * g.O : 0; }
  static i64 image_size(Tiling const& tl, ConvGeometry const& g) {
    // the larger of: the input or output image, channel-fastest; the padded input gradient as phase rows
    return std::max({g.H * g.W * g.C, g.OH() * g.OW() * g.O, (4 * tl.TH + 2) * 4 * (tl.TW + 1) * g.C});
  }
  explicit Scratch(Tiling const& tl, ConvGeometry const& g)
      : TW(tl.TW),
        CM(std::max(g.C, g.O)),
        buf(static_cast<std::size_t>(image_size(tl, g) + (4 * (tl.TW + 1) + 60 * tl.TW) * std::max(g.C, g.O) +
                                     pooled_size(g))) {
    T* p = buf.data();
    image = p;
    p += image_size(tl, g);
    phases = p;
    p += 4 * (TW + 1) * CM;
    for (auto& r : rows) r = p, p += 6 * TW * CM;
    mid = p;
    p += 24 * TW * CM;
    pooled = p;
  }
};

// phases[r][b][·] = xpad(yy, 4b + r): padded row yy of the channel-fastest image xt (H·W rows of C).
template <class T>
DDP_ALWAYS_INLINE void split_row(T const* xt, i64 C, i64 H, i64 W, i64 pad, i64 yy, i64 TW, T* phases) {
  i64 const span = 4 * (TW + 1), iy = yy - pad;
  if (iy < 0 || iy >= H) {
    std::fill(phases, phases + span * C, T(0));
    return;
  }
  i64 const lo = std::min(pad, span), hi = std::max(lo, std::min(span, pad + W));  // padded columns [lo, hi) are inside
  auto at = [&](i64 p) { return phases + ((p & 3) * (TW + 1) + (p >> 2)) * C; };
  for (i64 p = 0; p < lo; ++p) std::fill(at(p), at(p) + C, T(0));
  for (i64 p = hi; p < span; ++p) std::fill(at(p), at(p) + C, T(0));
  T const* src = xt + (iy * W - pad) * C;
  for (i64 p = lo; p < hi; ++p) copy_lanes(src + p * C, C, at(p));
}

// V rows of one image: (Bᵀ d B)[ξ] for each tile's zero-padded 6×6 window d of x (C planes of H×W).
template <class T>
void input_transform_image(ConvGeometry const& g, Tiling const& tl, T const* x, T* V, i64 plane, Scratch<T>& s) {
  i64 const TW = tl.TW, C = g.C, n = TW * C;
  planes_to_rows(x, g.H * g.W, C, g.H * g.W, [&](i64 p) { return s.image + p * C; });
  for (i64 th = 0; th < tl.TH; ++th) {
    // Rows 4th and 4th + 1 are rows 4 and 5 of the previous tile row: rotate them in instead of redoing them.
    if (th > 0) std::rotate(s.rows, s.rows + 4, s.rows + 6);
    for (i64 k = th > 0 ? 2 : 0; k < 6; ++k) {
      split_row(s.image, C, g.H, g.W, g.pad, 4 * th + k, TW, s.phases);
      T const* ph = s.phases;
      i64 const stride = (TW + 1) * C;  // between phases
      T const* const d[6] = {ph, ph + stride, ph + 2 * stride, ph + 3 * stride, ph + C, ph + stride + C};
      T* r = s.rows[k];
      T* const o[6] = {r, r + n, r + 2 * n, r + 3 * n, r + 4 * n, r + 5 * n};
      bt6<T>(d, o, n);  // along x: lane (tw, c) reads phases at tile column tw and tw + 1
    }
    T* Vt = V + th * TW * C;
    for (int q = 0; q < 6; ++q) {  // along y, straight into V
      T const* const d[6] = {s.rows[0] + q * n, s.rows[1] + q * n, s.rows[2] + q * n,
                             s.rows[3] + q * n, s.rows[4] + q * n, s.rows[5] + q * n};
      T* const o[6] = {Vt + q * plane,        Vt + (6 + q) * plane,  Vt + (12 + q) * plane,
                       Vt + (18 + q) * plane, Vt + (24 + q) * plane, Vt + (30 + q) * plane};
      bt6<T>(d, o, n);
    }
  }
}

// ---- a fused 2×2, stride-2 max-pool after bias and ReLU (g.pool2()) ----
// Each window's 4 values are compared after the bias, in PyTorch's order (a later value wins if larger or
// NaN), so values and gradients are those of max_pool2d(relu(conv + bias), 2). code[o] is the winner's place
// in the window (0..3), or 4 where the pooled value is not > 0 (ReLU passes no gradient there).

// pooled[(ph·PW + pw)·O + o] and codes, from the channel-fastest image img (OH·OW rows of O, before bias).
// Channels are processed in blocks with the codes kept as T first, so the loops vectorise.
template <class T>
void pool_rows(ConvGeometry const& g, T const* img, T const* bias, T* pooled, std::uint8_t* codes) {
  constexpr i64 kBlock = 256;
  i64 const O = g.O, OW = g.OW(), PH = g.OH() / 2, PW = OW / 2;
  alignas(64) T kf[kBlock];
  alignas(64) T zero_bias[kBlock] = {};
  for (i64 ph = 0; ph < PH; ++ph)
    for (i64 pw = 0; pw < PW; ++pw)
      for (i64 o0 = 0; o0 < O; o0 += kBlock) {
        i64 const nb = std::min(kBlock, O - o0), at = ((2 * ph) * OW + 2 * pw) * O + o0;
        T const* __restrict r0 = img + at;
        T const* __restrict r1 = r0 + O;
        T const* __restrict r2 = r0 + OW * O;
        T const* __restrict r3 = r2 + O;
        T const* __restrict bs = bias ? bias + o0 : zero_bias;
        T* __restrict out = pooled + (ph * PW + pw) * O + o0;
        T* __restrict k = kf;
        DDP_IVDEP
        for (i64 o = 0; o < nb; ++o) {
          T m = r0[o] + bs[o], c = T(0);
          T v = r1[o] + bs[o];
          bool t = (v > m) | (v != v);
          m = t ? v : m, c = t ? T(1) : c;
          v = r2[o] + bs[o];
          t = (v > m) | (v != v);
          m = t ? v : m, c = t ? T(2) : c;
          v = r3[o] + bs[o];
          t = (v > m) | (v != v);
          m = t ? v : m, c = t ? T(3) : c;
          bool const pass = m > T(0);
          out[o] = pass ? m : T(0);
          k[o] = pass ? c : T(4);
        }
        std::uint8_t* code = codes + (ph * PW + pw) * O + o0;
        for (i64 o = 0; o < nb; ++o) code[o] = static_cast<std::uint8_t>(kf[o]);
      }
}

// The channel-fastest output-gradient image img (OH·OW rows of O) from the pooled gradient rows gp
// (PH·PW rows of O) and the codes: each window's gradient goes to its winner; the rest is 0.
template <class T>
void unpool_rows(ConvGeometry const& g, T const* gp, std::uint8_t const* codes, T* img) {
  constexpr i64 kBlock = 256;
  i64 const O = g.O, OH = g.OH(), OW = g.OW(), PH = OH / 2, PW = OW / 2;
  alignas(64) T kf[kBlock];
  for (i64 ph = 0; ph < PH; ++ph) {
    for (i64 pw = 0; pw < PW; ++pw)
      for (i64 o0 = 0; o0 < O; o0 += kBlock) {
        i64 const nb = std::min(kBlock, O - o0), at = ((2 * ph) * OW + 2 * pw) * O + o0;
        std::uint8_t const* code = codes + (ph * PW + pw) * O + o0;
        for (i64 o = 0; o < nb; ++o) kf[o] = static_cast<T>(code[o]);
        T* __restrict r0 = img + at;
        T* __restrict r1 = r0 + O;
        T* __restrict r2 = r0 + OW * O;
        T* __restrict r3 = r2 + O;
        T const* __restrict gr = gp + (ph * PW + pw) * O + o0;
        T const* __restrict k = kf;
        DDP_IVDEP
        for (i64 o = 0; o < nb; ++o) {
          T const v = gr[o], c = k[o];
          r0[o] = c == T(0) ? v : T(0);
          r1[o] = c == T(1) ? v : T(0);
          r2[o] = c == T(2) ? v : T(0);
          r3[o] = c == T(3) ? v : T(0);
        }
      }
    if (OW & 1) {  // the column no window covers
      std::fill(img + ((2 * ph) * OW + OW - 1) * O, img + ((2 * ph) * OW + OW) * O, T(0));
      std::fill(img + ((2 * ph + 1) * OW + OW - 1) * O, img + ((2 * ph + 1) * OW + OW) * O, T(0));
    }
  }
  if (OH & 1) std::fill(img + (OH - 1) * OW * O, img + OH * OW * O, T(0));  // the row no window covers
}

// y of one image (O planes of OH×OW) = Aᵀ M A + bias for each tile (then ReLU with g.relu()); with
// g.pool2(), y is the pooled image (O planes of OH/2 × OW/2) and codes its window codes (pool_rows).
template <class T>
void output_transform_image(ConvGeometry const& g, Tiling const& tl, T const* M, i64 plane, T const* bias, T* y,
                            std::uint8_t* codes, Scratch<T>& s) {
  i64 const TW = tl.TW, O = g.O, n = TW * O, OH = g.OH(), OW = g.OW();
  T* S = s.mid;     // S[q·4 + u] (n lanes): Aᵀ along y
  T* Z = s.phases;  // Z[v][tw][o]: one output row, split by x mod 4
  for (i64 th = 0; th < tl.TH; ++th) {
    T const* Mt = M + th * TW * O;
    for (int q = 0; q < 6; ++q) {
      T const* const d[6] = {Mt + q * plane,        Mt + (6 + q) * plane,  Mt + (12 + q) * plane,
                             Mt + (18 + q) * plane, Mt + (24 + q) * plane, Mt + (30 + q) * plane};
      T* const o[4] = {S + (q * 4) * n, S + (q * 4 + 1) * n, S + (q * 4 + 2) * n, S + (q * 4 + 3) * n};
      at6<T>(d, o, n);
    }
    for (int u = 0; u < 4 && 4 * th + u < OH; ++u) {
      T const* const d[6] = {S + u * n,        S + (4 + u) * n,  S + (8 + u) * n,
                             S + (12 + u) * n, S + (16 + u) * n, S + (20 + u) * n};
      T* const o[4] = {Z, Z + n, Z + 2 * n, Z + 3 * n};
      at6<T>(d, o, n);
      T* dst = s.image + (4 * th + u) * OW * O;
      for (i64 xx = 0; xx < OW; ++xx) copy_lanes(Z + ((xx & 3) * TW + (xx >> 2)) * O, O, dst + xx * O);
    }
  }
  if (g.pool2()) {
    i64 const P = (OH / 2) * (OW / 2);
    pool_rows(g, s.image, bias, s.pooled, codes);
    rows_to_planes([&](i64 p) -> T const* { return s.pooled + p * O; }, O, P, static_cast<T const*>(nullptr), T(0), y,
                   P);
    return;
  }
  rows_to_planes([&](i64 p) -> T const* { return s.image + p * O; }, O, OH* OW, bias, T(0), y, OH* OW, g.relu());
}

// dM rows of one image: (A g Aᵀ)[ξ] for each tile's 4×4 window g of gy (O planes of OH×OW; zero past the edge).
// With a fused ReLU, g is gy where the layer's output y > 0. gb (if not null) += Σ g per channel.
// With g.pool2(), gy is the pooled gradient (O planes of OH/2 × OW/2), routed through the window codes.
template <class T>
void output_adjoint_image(ConvGeometry const& g, Tiling const& tl, T const* gy, T const* y, std::uint8_t const* codes,
                          T* dM, i64 plane, T* gb, Scratch<T>& s) {
  i64 const TW = tl.TW, O = g.O, n = TW * O, OH = g.OH(), OW = g.OW();
  T* Wr = s.mid;    // Wr[q·4 + u] (n lanes): A along x of row u of the tile row
  T* Q = s.phases;  // Q[v][tw][o] = gy(o, 4th + u, 4tw + v)
  if (g.pool2()) {
    i64 const P = (OH / 2) * (OW / 2);
    planes_to_rows(gy, P, O, P, [&](i64 p) { return s.pooled + p * O; });
    unpool_rows(g, s.pooled, codes, s.image);
  } else {
    planes_to_rows(
        gy, OH * OW, O, OH * OW, [&](i64 p) { return s.image + p * O; }, g.relu() ? y : nullptr);
  }
  if (gb)
    for (i64 p = 0; p < OH * OW; ++p) {
      T const* r = s.image + p * O;
      DDP_IVDEP
      for (i64 o = 0; o < O; ++o) gb[o] += r[o];
    }
  auto at = [&](i64 xx) { return Q + ((xx & 3) * TW + (xx >> 2)) * O; };
  for (i64 th = 0; th < tl.TH; ++th) {
    for (int u = 0; u < 4; ++u) {
      i64 const yy = 4 * th + u;
      if (yy >= OH) {
        std::fill(Q, Q + 4 * n, T(0));
      } else {
        T const* src = s.image + yy * OW * O;
        for (i64 xx = 0; xx < OW; ++xx) copy_lanes(src + xx * O, O, at(xx));
        for (i64 xx = OW; xx < 4 * TW; ++xx) std::fill(at(xx), at(xx) + O, T(0));
      }
      T const* const d[4] = {Q, Q + n, Q + 2 * n, Q + 3 * n};
      T* const o[6] = {Wr + u * n,        Wr + (4 + u) * n,  Wr + (8 + u) * n,
                       Wr + (12 + u) * n, Wr + (16 + u) * n, Wr + (20 + u) * n};
      a4<T>(d, o, n);
    }
    T* Mt = dM + th * TW * O;
    for (int q = 0; q < 6; ++q) {  // along y, straight into dM
      T const* const d[4] = {Wr + (q * 4) * n, Wr + (q * 4 + 1) * n, Wr + (q * 4 + 2) * n, Wr + (q * 4 + 3) * n};
      T* const o[6] = {Mt + q * plane,        Mt + (6 + q) * plane,  Mt + (12 + q) * plane,
                       Mt + (18 + q) * plane, Mt + (24 + q) * plane, Mt + (30 + q) * plane};
      a4<T>(d, o, n);
    }
  }
}

// gx of one image (C planes of H×W) = beta·gx + Σ_tiles B dV Bᵀ over each tile's 6×6 window (the adjoint
// of input_transform_image). The padded gradient is accumulated as phase rows, then cropped and transposed.
template <class T>
void input_adjoint_image(ConvGeometry const& g, Tiling const& tl, T const* dV, i64 plane, T beta, T* gx,
                         Scratch<T>& s) {
  i64 const TW = tl.TW, C = g.C, n = TW * C, Hp = 4 * tl.TH + 2, row_len = 4 * (TW + 1) * C, stride = (TW + 1) * C;
  T* acc = s.image;  // acc[yy][r][b][c]: padded row yy, column 4b + r
  std::fill(acc, acc + Hp * row_len, T(0));
  T* out6[6];
  for (int l = 0; l < 6; ++l) out6[l] = s.mid + l * n;
  for (i64 th = 0; th < tl.TH; ++th) {
    T const* Vt = dV + th * TW * C;
    for (int q = 0; q < 6; ++q) {  // along y: rows k of position q
      T const* const d[6] = {Vt + q * plane,        Vt + (6 + q) * plane,  Vt + (12 + q) * plane,
                             Vt + (18 + q) * plane, Vt + (24 + q) * plane, Vt + (30 + q) * plane};
      T* const o[6] = {s.rows[0] + q * n, s.rows[1] + q * n, s.rows[2] + q * n,
                       s.rows[3] + q * n, s.rows[4] + q * n, s.rows[5] + q * n};
      b6<T>(d, o, n);
    }
    for (int k = 0; k < 6; ++k) {  // along x, added into padded row 4th + k
      T const* r = s.rows[k];
      T const* const d[6] = {r, r + n, r + 2 * n, r + 3 * n, r + 4 * n, r + 5 * n};
      T* const o[6] = {out6[0], out6[1], out6[2], out6[3], out6[4], out6[5]};
      b6<T>(d, o, n);
      T* row = acc + (4 * th + k) * row_len;
      T* const dst[6] = {row, row + stride, row + 2 * stride, row + 3 * stride, row + C, row + stride + C};
      for (int l = 0; l < 6; ++l) {
        T* dl = dst[l];
        T const* sl = out6[l];
        DDP_IVDEP
        for (i64 j = 0; j < n; ++j) dl[j] += sl[j];
      }
    }
  }
  for (i64 iy = 0; iy < g.H; ++iy) {
    T const* row = acc + (iy + g.pad) * row_len;
    rows_to_planes(
        [&](i64 p) -> T const* {
          i64 const q = p + g.pad;
          return row + ((q & 3) * (TW + 1) + (q >> 2)) * C;
        },
        C, g.W, static_cast<T const*>(nullptr), beta, gx + iy * g.W, g.H * g.W);
  }
}

// Chunk-level drivers: images [n0, n0 + cn), tc = cn · per_image tiles.
template <class T>
void input_transform(ConvGeometry const& g, Tiling const& tl, T const* x, i64 n0, i64 cn, T* V, Scratch<T>& s) {
  i64 const plane = cn * tl.per_image * g.C;
  for (i64 i = 0; i < cn; ++i)
    input_transform_image(g, tl, x + (n0 + i) * g.C * g.H * g.W, V + i * tl.per_image * g.C, plane, s);
}
// Elements per image of the layer's output (pooled with g.pool2()).
inline i64 output_image_size(ConvGeometry const& g) {
  return g.pool2() ? g.O * (g.OH() / 2) * (g.OW() / 2) : g.O * g.OH() * g.OW();
}
template <class T>
void output_transform(ConvGeometry const& g, Tiling const& tl, T const* M, T const* bias, i64 n0, i64 cn, T* y,
                      std::uint8_t* codes, Scratch<T>& s) {
  i64 const plane = cn * tl.per_image * g.O, img = output_image_size(g);
  for (i64 i = 0; i < cn; ++i)
    output_transform_image(g, tl, M + i * tl.per_image * g.O, plane, bias, y + (n0 + i) * img,
                           codes ? codes + (n0 + i) * img : nullptr, s);
}
template <class T>
void output_adjoint(ConvGeometry const& g, Tiling const& tl, T const* gy, T const* y, std::uint8_t const* codes, i64 n0,
                    i64 cn, T* dM, T* gb, Scratch<T>& s) {
  i64 const plane = cn * tl.per_image * g.O, img = output_image_size(g);
  for (i64 i = 0; i < cn; ++i)
    output_adjoint_image(g, tl, gy + (n0 + i) * img, y ? y + (n0 + i) * img : nullptr,
                         codes ? codes + (n0 + i) * img : nullptr, dM + i * tl.per_image * g.O, plane, gb, s);
}

// y = conv(x, kernels) + bias, with U the transformed kernels (weight_transform, A = g.O, B = g.C).
// Per chunk: V = input transform, M_ξ = V_ξ (tc × C) · U_ξᵀ (C × O) for the 36 ξ, y = output transform.
// With g.pool2(), y is the pooled output and codes (N · OH/2 · OW/2 · O) receives the window codes.
template <class T>
void forward(ConvGeometry const& g, T const* x, T const* U, T const* bias, T* y, std::uint8_t* codes = nullptr) {
  Tiling const tl(g, sizeof(T));
  i64 const ct = tl.chunk_tiles();
  HostBuffer<T> V(static_cast<std::size_t>(kPos * g.C * ct + 64)), M(static_cast<std::size_t>(kPos * g.O * ct + 64));
  Scratch<T> s(tl, g);
  for (i64 n0 = 0; n0 < g.N; n0 += tl.images_per_chunk) {
    i64 const cn = std::min(tl.images_per_chunk, g.N - n0), tc = cn * tl.per_image;
    input_transform(g, tl, x, n0, cn, V.data(), s);
    for (int xi = 0; xi < kPos; ++xi) {
      Eigen::Map<RowMat<T> const> v(V.data() + xi * tc * g.C, tc, g.C), u(U + xi * g.O * g.C, g.O, g.C);
      Eigen::Map<RowMat<T>>(M.data() + xi * tc * g.O, tc, g.O).noalias() = v * u.transpose();
    }
    output_transform(g, tl, M.data(), bias, n0, cn, y, codes, s);
  }
}

// Gradients from the output gradient gy: gx = beta_x·gx + ∂L/∂x, gw = beta_w·gw + ∂L/∂w, gb likewise (any
// may be null; y is the layer's output, read when g.relu()). Per chunk: dM = output adjoint of gy;
// dU_ξ (O × C) += dM_ξᵀ · V_ξ with V the input transform of x; dV_ξ (tc × C) = dM_ξ · U_ξ and gx += the
// input adjoint of dV. The bias gradient is summed from the staged (masked) gy.
template <class T>
void backward(ConvGeometry const& g, T const* x, T const* w, T const* gy, T const* y, T beta_x, T* gx, T beta_w, T* gw,
              T beta_b, T* gb, std::uint8_t const* codes = nullptr) {
  if (!gx && !gw && !gb) return;
  HostBuffer<T> bsum(static_cast<std::size_t>(gb ? g.O : 0));
  if (gb) std::fill(bsum.data(), bsum.data() + g.O, T(0));
  Tiling const tl(g, sizeof(T));
  i64 const ct = tl.chunk_tiles();
  HostBuffer<T> dM(static_cast<std::size_t>(kPos * g.O * ct + 64));
  HostBuffer<T> V(static_cast<std::size_t>(kPos * g.C * ct + 64));  // V for gw, dV for gx
  HostBuffer<T> dU(static_cast<std::size_t>(gw ? kPos * g.O * g.C : 0));
  HostBuffer<T> U(static_cast<std::size_t>(gx ? kPos * g.O * g.C : 0));
  if (gx) weight_transform(g.O, g.C, w, U.data());
  Scratch<T> s(tl, g);
  for (i64 n0 = 0; n0 < g.N; n0 += tl.images_per_chunk) {
    i64 const cn = std::min(tl.images_per_chunk, g.N - n0), tc = cn * tl.per_image;
    output_adjoint(g, tl, gy, y, codes, n0, cn, dM.data(), gb ? bsum.data() : nullptr, s);
    if (gw) {
      input_transform(g, tl, x, n0, cn, V.data(), s);
      for (int xi = 0; xi < kPos; ++xi) {
        Eigen::Map<RowMat<T> const> m(dM.data() + xi * tc * g.O, tc, g.O), v(V.data() + xi * tc * g.C, tc, g.C);
        Eigen::Map<RowMat<T>> u(dU.data() + xi * g.O * g.C, g.O, g.C);
        if (n0 == 0)
          u.noalias() = m.transpose() * v;
        else
          u.noalias() += m.transpose() * v;
      }
    }
    if (gx) {
      for (int xi = 0; xi < kPos; ++xi) {
        Eigen::Map<RowMat<T> const> m(dM.data() + xi * tc * g.O, tc, g.O), u(U.data() + xi * g.O * g.C, g.O, g.C);
        Eigen::Map<RowMat<T>>(V.data() + xi * tc * g.C, tc, g.C).noalias() = m * u;
      }
      i64 const plane = tc * g.C;
      for (i64 i = 0; i < cn; ++i)
        input_adjoint_image(g, tl, V.data() + i * tl.per_image * g.C, plane, beta_x, gx + (n0 + i) * g.C * g.H * g.W,
                            s);
    }
  }
  if (gw) weight_transform_adjoint(g.O, g.C, dU.data(), beta_w, gw);
  if (gb)
    for (i64 o = 0; o < g.O; ++o) gb[o] = beta_b == T(0) ? bsum.data()[o] : gb[o] + bsum.data()[o];
}

}  // namespace ddp::detail::winograd
