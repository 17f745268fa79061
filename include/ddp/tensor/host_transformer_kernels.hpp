// Host kernels for the transformer ops: embedding gather/scatter, layer norm, GELU, the (scaled, optionally causal)
// softmax of attention scores, axis swaps, last-dimension slices and batched GEMM. Part of Kernels<HostSpace>.
// Every loop is sequential in a fixed order: same inputs -> bitwise the same outputs, whatever the thread count.
#pragma once

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>  // vectorised erf for float arrays

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "ddp/tensor/host_attention_tiles.hpp"
#include "ddp/tensor/host_gemm.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

namespace detail {
// One row of a (causal) softmax on Eigen's packets (AVX-512, AVX, SSE, NEON, or plain scalars): attention's rows are
// a few dozen entries, where an Eigen expression per row and pass cost more than the arithmetic (a 2-3x slower
// softmax). Entries live.. are masked: never read into a result, written as exact zeros. Fixed order throughout.
template <class T>
struct SoftmaxRow {
  using i64 = std::int64_t;
  using P = typename Eigen::internal::packet_traits<T>::type;
  static constexpr i64 W = Eigen::internal::unpacket_traits<P>::size;

  // Lanes j0 .. j0 + W - 1 below live.
  static P below(i64 j0, i64 live) {
    using namespace Eigen::internal;
    return pcmp_lt(plset<P>(T(j0)), pset1<P>(T(live)));
  }
  // y[0, cols) = softmax(scale·x[0, live)), then zeros; x may be y. The packet that holds entry live - 1 is read
  // whole (its masked lanes selected away) when it lies inside the row, else the last entries go one at a time.
  static void forward(i64 live, i64 cols, T scale, T const* x, T* y) {
    using namespace Eigen::internal;
    i64 const full = live / W * W;
    bool const tail = live > full && full + W <= cols;
    P const ninf = pset1<P>(-std::numeric_limits<T>::infinity());
    P const mask = below(full, live);
    P mx = ninf;
    for (i64 j = 0; j < full; j += W) mx = pmax(mx, ploadu<P>(x + j));
    if (tail) mx = pmax(mx, pselect(mask, ploadu<P>(x + full), ninf));
    T m = predux_max(mx);
    if (!tail)
      for (i64 j = full; j < live; ++j) m = std::max(m, x[j]);
    P const pm = pset1<P>(m), sc = pset1<P>(scale), zero = pzero(pm);
    P acc = zero;
    for (i64 j = 0; j < full; j += W) {
      P const e = pexp(pmul(psub(ploadu<P>(x + j), pm), sc));
      pstoreu(y + j, e);
      acc = padd(acc, e);
    }
    i64 end = full;  // y[0, end) written
    if (tail) {
      P const e = pselect(mask, pexp(pmul(psub(pselect(mask, ploadu<P>(x + full), pm), pm), sc)), zero);
      pstoreu(y + full, e);
      acc = padd(acc, e);
      end = full + W;
    }
    T sum = predux(acc);
    if (!tail)
      for (; end < live; ++end) sum += (y[end] = std::exp((x[end] - m) * scale));
    P const inv = pset1<P>(T(1) / sum);
    i64 j = 0;
    for (; j + W <= end; j += W) pstoreu(y + j, pmul(ploadu<P>(y + j), inv));
    for (; j < end; ++j) y[j] *= T(1) / sum;
    std::fill(y + end, y + cols, T(0));
  }
  // In place: g[0, live) = scale·y·(g - Σ y·g), then zeros (g's masked entries are never read).
  static void backward(i64 live, i64 cols, T scale, T const* y, T* g) {
    using namespace Eigen::internal;
    i64 const full = live / W * W;
    bool const tail = live > full && full + W <= cols;
    P const mask = below(full, live), zero = pzero(mask);
    P acc = zero;
    for (i64 j = 0; j < full; j += W) acc = pmadd(ploadu<P>(y + j), ploadu<P>(g + j), acc);
    if (tail) acc = padd(acc, pselect(mask, pmul(ploadu<P>(y + full), ploadu<P>(g + full)), zero));
    T dot = predux(acc);
    if (!tail)
      for (i64 j = full; j < live; ++j) dot += y[j] * g[j];
    P const pd = pset1<P>(dot), sc = pset1<P>(scale);
    for (i64 j = 0; j < full; j += W) pstoreu(g + j, pmul(sc, pmul(ploadu<P>(y + j), psub(ploadu<P>(g + j), pd))));
    i64 end = full;
    if (tail) {
      pstoreu(g + full, pselect(mask, pmul(sc, pmul(ploadu<P>(y + full), psub(ploadu<P>(g + full), pd))), zero));
      end = full + W;
    }
    if (!tail)
      for (; end < live; ++end) g[end] = scale * y[end] * (g[end] - dot);
    std::fill(g + end, g + cols, T(0));
  }
};

// Layer norm rows on Eigen's packets, for the same reason: rows of a few hundred entries, where five Eigen
// expressions per row cost 3x the arithmetic. Each sum runs over the packets in order, then the lanes (predux), then
// the entries past the last whole packet. w, b null mean 1, 0; gw, gb, gx null mean not wanted.
template <class T>
struct LayerNormRow {
  using i64 = std::int64_t;
  using P = typename Eigen::internal::packet_traits<T>::type;
  static constexpr i64 W = Eigen::internal::unpacket_traits<P>::size;

  template <class F>  // Σ_j f(j) over packets, then the scalar tail f1(j)
  static T sum(i64 n, F f, auto f1) {
    using namespace Eigen::internal;
    i64 const full = n / W * W;
    P acc = pset1<P>(T(0));
    for (i64 j = 0; j < full; j += W) acc = padd(acc, f(j));
    T s = predux(acc);
    for (i64 j = full; j < n; ++j) s += f1(j);
    return s;
  }
  static void forward(i64 n, T eps, T const* x, T const* w, T const* b, T* y, T& mean, T& rstd) {
    using namespace Eigen::internal;
    T const m = sum(
                    n, [&](i64 j) { return ploadu<P>(x + j); }, [&](i64 j) { return x[j]; }) /
                T(n);
    P const pm = pset1<P>(m);
    T const var = sum(
                      n,
                      [&](i64 j) {
                        P const d = psub(ploadu<P>(x + j), pm);
                        return pmul(d, d);
                      },
                      [&](i64 j) { return (x[j] - m) * (x[j] - m); }) /
                  T(n);
    T const rs = T(1) / std::sqrt(var + eps);
    mean = m;
    rstd = rs;
    P const prs = pset1<P>(rs);
    i64 const full = n / W * W;
    for (i64 j = 0; j < full; j += W) {
      P v = pmul(psub(ploadu<P>(x + j), pm), prs);
      if (w) v = pmul(v, ploadu<P>(w + j));
      if (b) v = padd(v, ploadu<P>(b + j));
      pstoreu(y + j, v);
    }
    for (i64 j = full; j < n; ++j) {
      T v = (x[j] - m) * rs;
      if (w) v *= w[j];
      if (b) v += b[j];
      y[j] = v;
    }
  }
  // gw += gy·x̂, gb += gy; gx = beta_x gx + rstd·(g - mean(g) - x̂·mean(g·x̂)), g = gy·w.
  static void backward(i64 n, T const* x, T m, T rs, T const* w, T const* gy, T beta_x, T* gx, T* gw, T* gb) {
    using namespace Eigen::internal;
    P const pm = pset1<P>(m), prs = pset1<P>(rs);
    i64 const full = n / W * W;
    P sg = pset1<P>(T(0)), sgx = sg;
    for (i64 j = 0; j < full; j += W) {
      P const xh = pmul(psub(ploadu<P>(x + j), pm), prs), gyj = ploadu<P>(gy + j);
      if (gw) pstoreu(gw + j, pmadd(gyj, xh, ploadu<P>(gw + j)));
      if (gb) pstoreu(gb + j, padd(ploadu<P>(gb + j), gyj));
      P const g = w ? pmul(gyj, ploadu<P>(w + j)) : gyj;
      sg = padd(sg, g);
      sgx = pmadd(g, xh, sgx);
    }
    T mg = predux(sg), mgx = predux(sgx);
    for (i64 j = full; j < n; ++j) {
      T const xh = (x[j] - m) * rs;
      if (gw) gw[j] += gy[j] * xh;
      if (gb) gb[j] += gy[j];
      T const g = w ? gy[j] * w[j] : gy[j];
      mg += g;
      mgx += g * xh;
    }
    if (!gx) return;
    mg /= T(n);
    mgx /= T(n);
    P const pmg = pset1<P>(mg), pmgx = pset1<P>(mgx);
    for (i64 j = 0; j < full; j += W) {
      P const xh = pmul(psub(ploadu<P>(x + j), pm), prs), gyj = ploadu<P>(gy + j);
      P const g = w ? pmul(gyj, ploadu<P>(w + j)) : gyj;
      P v = pmul(prs, psub(psub(g, pmg), pmul(xh, pmgx)));
      if (beta_x != T(0)) v = padd(v, ploadu<P>(gx + j));
      pstoreu(gx + j, v);
    }
    for (i64 j = full; j < n; ++j) {
      T const xh = (x[j] - m) * rs;
      T const g = w ? gy[j] * w[j] : gy[j];
      T const v = rs * (g - mg - xh * mgx);
      gx[j] = beta_x != T(0) ? gx[j] + v : v;
    }
  }
};
}  // namespace detail

struct HostTransformerKernels {
  using i64 = std::int64_t;

  // ---- embedding: y[n, :] = table[ids[n], :]   ids (n) in [0, rows), table (rows, dim), y (n, dim) ----
  // Host ids are checked by the op before the call (the device kernel checks its own against rows).
  template <class T>
  static void embedding_fwd(i64 n, [[maybe_unused]] i64 rows, i64 dim, T const* table, std::int32_t const* ids, T* y) {
    for (i64 i = 0; i < n; ++i) std::memcpy(y + i * dim, table + i64(ids[i]) * dim, sizeof(T) * dim);
  }
  // gtable = beta gtable + Σ_{i: ids[i] = v} gy[i, :] for every row v, added in index order i = 0, 1, ...
  template <class T>
  static void embedding_bwd(i64 n, i64 rows, i64 dim, std::int32_t const* ids, T const* gy, T beta, T* gtable) {
    using A = Eigen::Array<T, Eigen::Dynamic, 1>;
    if (beta == T(0)) std::memset(gtable, 0, sizeof(T) * rows * dim);
    for (i64 i = 0; i < n; ++i)
      Eigen::Map<A>(gtable + i64(ids[i]) * dim, dim) += Eigen::Map<A const>(gy + i * dim, dim);
  }

  // ---- layer norm over the last dimension of (rows, cols) ----
  // y = (x - mean) · rstd · w + b, rstd = 1/sqrt(var + eps) with the biased variance; w, b may be null (1, 0).
  // Saves mean and rstd per row for the backward. Two passes in T (mean, then the squares about it).
  template <class T>
  static void layer_norm_fwd(i64 rows, i64 cols, T eps, T const* x, T const* w, T const* b, T* y, T* mean, T* rstd) {
    for (i64 r = 0; r < rows; ++r)
      detail::LayerNormRow<T>::forward(cols, eps, x + r * cols, w, b, y + r * cols, mean[r], rstd[r]);
  }
  // With x̂ = (x - mean)·rstd and g = gy·w:  gx = rstd · (g - mean(g) - x̂·mean(g·x̂)),  gw = Σ_rows gy·x̂,
  // gb = Σ_rows gy. Each with its own beta (0: overwrite, 1: add); gx, gw, gb may be null (not wanted).
  template <class T>
  static void layer_norm_bwd(i64 rows, i64 cols, T const* x, T const* mean, T const* rstd, T const* w, T const* gy,
                             T beta_x, T* gx, T beta_w, T* gw, T beta_b, T* gb) {
    if (gw && beta_w == T(0)) std::memset(gw, 0, sizeof(T) * cols);
    if (gb && beta_b == T(0)) std::memset(gb, 0, sizeof(T) * cols);
    for (i64 r = 0; r < rows; ++r)
      detail::LayerNormRow<T>::backward(cols, x + r * cols, mean[r], rstd[r], w, gy + r * cols, beta_x,
                                        gx ? gx + r * cols : nullptr, gw, gb);
  }

  // ---- GELU: kErf x·Φ(x); kTanh 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))) ----
  template <class T>
  static void gelu_fwd(i64 n, GeluApprox approx, T const* x, T* y) {
    using A = Eigen::Array<T, Eigen::Dynamic, 1>;
    Eigen::Map<A const> xx(x, n);
    Eigen::Map<A> yy(y, n);
    if (approx == GeluApprox::kErf)
      yy = T(0.5) * xx * (T(1) + (xx * T(kInvSqrt2)).erf());
    else
      yy = T(0.5) * xx * (T(1) + (T(kSqrt2OverPi) * (xx + T(0.044715) * xx.cube())).tanh());
  }
  // gx = beta gx + gy · gelu'(x)
  template <class T>
  static void gelu_bwd(i64 n, GeluApprox approx, T const* x, T const* gy, T beta, T* gx) {
    using A = Eigen::Array<T, Eigen::Dynamic, 1>;
    if (approx == GeluApprox::kErf) {  // one pass, Φ(x) + x·φ(x) formed per packet (10% faster than in blocks)
      Eigen::Map<A const> xx(x, n), g(gy, n);
      Eigen::Map<A> out(gx, n);
      auto const d = T(0.5) * (T(1) + (xx * T(kInvSqrt2)).erf()) + xx * (T(-0.5) * xx.square()).exp() * T(kInvSqrt2Pi);
      if (beta == T(0))
        out = g * d;
      else
        out += g * d;
      return;
    }
    constexpr i64 kBlock = 1024;  // kTanh: the derivative a block at a time (t is used twice), in cache
    A d(kBlock);
    for (i64 i0 = 0; i0 < n; i0 += kBlock) {
      i64 const m = std::min(kBlock, n - i0);
      Eigen::Map<A const> xx(x + i0, m), g(gy + i0, m);
      auto dd = d.head(m);
      A const t = (T(kSqrt2OverPi) * (xx + T(0.044715) * xx.cube())).tanh();  // kTanh
      dd = T(0.5) * (T(1) + t) +
           T(0.5) * xx * (T(1) - t.square()) * T(kSqrt2OverPi) * (T(1) + T(3 * 0.044715) * xx.square());
      Eigen::Map<A> out(gx + i0, m);
      if (beta == T(0))
        out = g * dd;
      else
        out += g * dd;
    }
  }

  // ---- softmax over the last dimension of (rows, cols), of scale·x ----
  // kCausal: rows are grouped in squares of cols (query i of a (cols, cols) score matrix is row r with
  // i = r mod cols), and keys j > i are masked out (probability exactly 0).
  template <class T>
  static void softmax_fwd(i64 rows, i64 cols, T scale, SoftmaxMask mask, T const* x, T* y) {
    for (i64 r = 0; r < rows; ++r)
      detail::SoftmaxRow<T>::forward(mask == SoftmaxMask::kCausal ? r % cols + 1 : cols, cols, scale, x + r * cols,
                                     y + r * cols);
  }
  // gx = beta gx + scale · y · (gy - Σ_c y·gy)   (masked entries have y = 0, so their gradient is 0)
  template <class T>
  static void softmax_bwd(i64 rows, i64 cols, T scale, T const* y, T const* gy, T beta, T* gx) {
    using A = Eigen::Array<T, Eigen::Dynamic, 1>;
    for (i64 r = 0; r < rows; ++r) {
      Eigen::Map<A const> yr(y + r * cols, cols), g(gy + r * cols, cols);
      T const dot = (yr * g).sum();
      Eigen::Map<A> out(gx + r * cols, cols);
      if (beta == T(0))
        out = scale * yr * (g - dot);
      else
        out += scale * yr * (g - dot);
    }
  }

  // ---- y = beta y + x with axes i and j swapped: x (pre, di, mid, dj, post) -> y (pre, dj, mid, di, post) ----
  template <class T>
  static void swap_axes(AxisSwap const& s, T const* x, T beta, T* y) {
    for (i64 p = 0; p < s.pre; ++p)
      for (i64 a = 0; a < s.di; ++a)
        for (i64 m = 0; m < s.mid; ++m)
          for (i64 b = 0; b < s.dj; ++b) {
            T const* src = x + (((p * s.di + a) * s.mid + m) * s.dj + b) * s.post;
            T* dst = y + (((p * s.dj + b) * s.mid + m) * s.di + a) * s.post;
            if (beta == T(0))
              for (i64 q = 0; q < s.post; ++q) dst[q] = src[q];
            else
              for (i64 q = 0; q < s.post; ++q) dst[q] += src[q];
          }
  }

  // ---- causal multi-head self-attention, fused: qkv (B, T, 3C) holds q, k and v side by side, H heads of D = C/H ----
  // Per (b, h), reading q, k and v in place: P = softmax(scale·q·kᵀ) with each query's later keys masked (exactly 0),
  // y[b, :, h·D : (h+1)·D] = P·v. P (B, H, T, T) is kept for the backward. No sliced copies.
  // Where a head fits detail::AttentionTiles (whole packets along keys and D, as the GPT's 64 × 32 heads), its
  // register tiles do the products, each row tile stopping at the packet that holds its last diagonal entry: faster
  // than a BLAS call per product on those heads (bench/RESULTS.md). Other heads take attention_fwd_blas.
  template <class T>
  static void attention_fwd(i64 B, i64 Tn, i64 H, i64 D, T scale, T const* qkv, T* p, T* y) {
    using Tiles = detail::AttentionTiles<T>;
    if (!Tiles::fits(Tn, D)) return attention_fwd_blas(B, Tn, H, D, scale, qkv, p, y);
    i64 const C = H * D, ld = 3 * C;
    Eigen::Array<T, Eigen::Dynamic, 1> kt(D * Tn);  // one head's kᵀ
    for (i64 b = 0; b < B; ++b)
      for (i64 h = 0; h < H; ++h) {
        T const* q = qkv + b * Tn * ld + h * D;  // k at q + C, v at q + 2C, rows 3C apart
        T* pb = p + (b * H + h) * Tn * Tn;
        Tiles::pack_t(Tn, D, q + C, ld, kt.data());
        Tiles::scores(Tn, D, q, ld, kt.data(), pb);
        softmax_fwd(Tn, Tn, scale, SoftmaxMask::kCausal, pb, pb);  // reads only the unmasked part, zeroes the rest
        Tiles::lower_times(Tn, D, pb, q + 2 * C, ld, T(0), y + b * Tn * C + h * D, C);
      }
  }
  // The same with the host GEMM (the BLAS where built with one). The causal mask is used twice over: the queries
  // split at s = T/2, and the first s see only the first s keys, so each product runs as two, the first on an s × s
  // corner (a quarter fewer multiplications than the full square); what is skipped is exactly the masked part, whose
  // probabilities are exactly 0.
  template <class T>
  static void attention_fwd_blas(i64 B, i64 Tn, i64 H, i64 D, T scale, T const* qkv, T* p, T* y) {
    using detail::host_gemm;
    i64 const C = H * D, s = Tn / 2, ld = 3 * C;
    for (i64 b = 0; b < B; ++b)
      for (i64 h = 0; h < H; ++h) {
        T const* q = qkv + b * Tn * ld + h * D;  // k at q + C, v at q + 2C, rows 3C apart
        T const *k = q + C, *v = q + 2 * C;
        T* pb = p + (b * H + h) * Tn * Tn;
        T* yb = y + b * Tn * C + h * D;
        if (s > 0) host_gemm(Trans::kNo, Trans::kYes, s, s, D, T(1), q, ld, k, ld, T(0), pb, Tn);
        host_gemm(Trans::kNo, Trans::kYes, Tn - s, Tn, D, T(1), q + s * ld, ld, k, ld, T(0), pb + s * Tn, Tn);
        softmax_fwd(Tn, Tn, scale, SoftmaxMask::kCausal, pb, pb);  // reads only the unmasked part, zeroes the rest
        if (s > 0) host_gemm(Trans::kNo, Trans::kNo, s, D, s, T(1), pb, Tn, v, ld, T(0), yb, C);
        host_gemm(Trans::kNo, Trans::kNo, Tn - s, D, Tn, T(1), pb + s * Tn, Tn, v, ld, T(0), yb + s * C, C);
      }
  }
  // gqkv = beta gqkv + the gradient of attention_fwd's y with respect to qkv, from gy (B, T, C) and the saved P:
  // dv = Pᵀ·dy, dP = dy·vᵀ, dS = scale·P∘(dP - rowsum(P∘dP)), dq = dS·k, dk = dSᵀ·q. On detail::AttentionTiles
  // where the head fits, as the forward (P and dS are 0 above the diagonal: L·B and Lᵀ·B read only their lower part).
  template <class T>
  static void attention_bwd(i64 B, i64 Tn, i64 H, i64 D, T scale, T const* qkv, T const* p, T const* gy, T beta,
                            T* gqkv) {
    using Tiles = detail::AttentionTiles<T>;
    if (!Tiles::fits(Tn, D)) return attention_bwd_blas(B, Tn, H, D, scale, qkv, p, gy, beta, gqkv);
    i64 const C = H * D, ld = 3 * C;
    Eigen::Array<T, Eigen::Dynamic, 1> ds(Tn * Tn), vt(D * Tn);
    for (i64 b = 0; b < B; ++b)
      for (i64 h = 0; h < H; ++h) {
        T const* q = qkv + b * Tn * ld + h * D;  // k at q + C, v at q + 2C, rows 3C apart; so are dq, dk and dv
        T const* dy = gy + b * Tn * C + h * D;
        T const* pb = p + (b * H + h) * Tn * Tn;
        T* dq = gqkv + b * Tn * ld + h * D;
        Tiles::lower_t_times(Tn, D, pb, dy, C, beta, dq + 2 * C, ld);  // dv = Pᵀ·dy
        Tiles::pack_t(Tn, D, q + 2 * C, ld, vt.data());
        Tiles::scores(Tn, D, dy, C, vt.data(), ds.data());                // dP = dy·vᵀ, the unmasked part
        softmax_bwd_causal(Tn, scale, pb, ds.data());                     // dS, its masked part zeroed
        Tiles::lower_times(Tn, D, ds.data(), q + C, ld, beta, dq, ld);    // dq = dS·k
        Tiles::lower_t_times(Tn, D, ds.data(), q, ld, beta, dq + C, ld);  // dk = dSᵀ·q
      }
  }
  // The same with the host GEMM, split at s = T/2 as attention_fwd_blas: P and dS are 0 above the diagonal, so keys
  // past s meet only queries past s, and queries before s only keys before s.
  template <class T>
  static void attention_bwd_blas(i64 B, i64 Tn, i64 H, i64 D, T scale, T const* qkv, T const* p, T const* gy, T beta,
                                 T* gqkv) {
    using detail::host_gemm;
    i64 const C = H * D, s = Tn / 2, ld = 3 * C, r = Tn - s;
    Eigen::Array<T, Eigen::Dynamic, 1> ds(Tn * Tn);
    T* dS = ds.data();
    for (i64 b = 0; b < B; ++b)
      for (i64 h = 0; h < H; ++h) {
        T const* q = qkv + b * Tn * ld + h * D;  // k at q + C, v at q + 2C, rows 3C apart
        T const *k = q + C, *v = q + 2 * C;
        T const* dy = gy + b * Tn * C + h * D;
        T const* pb = p + (b * H + h) * Tn * Tn;
        T* dq = gqkv + b * Tn * ld + h * D;
        T *dk = dq + C, *dv = dq + 2 * C;
        // dv: keys before s from every query, keys from s on from the queries from s on
        if (s > 0) host_gemm(Trans::kYes, Trans::kNo, s, D, Tn, T(1), pb, Tn, dy, C, beta, dv, ld);
        host_gemm(Trans::kYes, Trans::kNo, r, D, r, T(1), pb + s * Tn + s, Tn, dy + s * C, C, beta, dv + s * ld, ld);
        // dP, the unmasked part; softmax_bwd zeroes the masked part of dS
        if (s > 0) host_gemm(Trans::kNo, Trans::kYes, s, s, D, T(1), dy, C, v, ld, T(0), dS, Tn);
        host_gemm(Trans::kNo, Trans::kYes, r, Tn, D, T(1), dy + s * C, C, v, ld, T(0), dS + s * Tn, Tn);
        softmax_bwd_causal(Tn, scale, pb, dS);
        if (s > 0) host_gemm(Trans::kNo, Trans::kNo, s, D, s, T(1), dS, Tn, k, ld, beta, dq, ld);
        host_gemm(Trans::kNo, Trans::kNo, r, D, Tn, T(1), dS + s * Tn, Tn, k, ld, beta, dq + s * ld, ld);
        if (s > 0) host_gemm(Trans::kYes, Trans::kNo, s, D, Tn, T(1), dS, Tn, q, ld, beta, dk, ld);
        host_gemm(Trans::kYes, Trans::kNo, r, D, r, T(1), dS + s * Tn + s, Tn, q + s * ld, ld, beta, dk + s * ld, ld);
      }
  }
  // In place, one (T, T) causal block: g = scale·y·(g - Σ_c y·g) over each row's unmasked entries (query i: keys 0..i),
  // 0 over the masked ones (whose g is never read: attention_bwd leaves part of it unwritten).
  template <class T>
  static void softmax_bwd_causal(i64 Tn, T scale, T const* y, T* g) {
    for (i64 i = 0; i < Tn; ++i) detail::SoftmaxRow<T>::backward(i + 1, Tn, scale, y + i * Tn, g + i * Tn);
  }

  // ---- dst[r, :cols] = beta dst[r, :cols] + src[r, :cols], rows with leading dimensions src_ld and dst_ld ----
  template <class T>
  static void copy_rows(i64 rows, i64 cols, T const* src, i64 src_ld, T beta, T* dst, i64 dst_ld) {
    if (src_ld == 0 && beta == T(0)) {  // one row broadcast (a Linear's bias): vector stores, no call per row
      using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
      Eigen::Map<Mat, 0, Eigen::OuterStride<>>(dst, rows, cols, Eigen::OuterStride<>(dst_ld)).rowwise() =
          Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic> const>(src, cols);
      return;
    }
    for (i64 r = 0; r < rows; ++r) {
      T const* s = src + r * src_ld;
      T* d = dst + r * dst_ld;
      if (beta == T(0))
        std::memcpy(d, s, sizeof(T) * cols);
      else
        for (i64 c = 0; c < cols; ++c) d[c] += s[c];
    }
  }
};

}  // namespace ddp
