// Device kernels for the transformer ops over Thrust: embedding gather/scatter, layer norm, GELU, the (scaled,
// optionally causal) softmax of attention scores, axis swaps and last-dimension slices. Part of Kernels<DeviceSpace>.
#pragma once

#include <cstdint>
#include <limits>

#include "ddp/tensor/device_errors.hpp"
#include "ddp/tensor/device_launch.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

namespace detail::dev {
template <class T>
struct EmbeddingFwd {  // one output element per index; a bad id is reported (once per row) and its row is NaN
  i64 dim, rows;
  T const* table;
  std::int32_t const* ids;
  T* y;
  DeviceErrorRecord* err;
  DDP_HOST_DEVICE void operator()(i64 i) const {
    i64 const n = i / dim, c = i % dim;
    i64 const id = ids[n];
    if (id < 0 || id >= rows) {
      if (c == 0) report_device_error(err, DeviceErrorKind::kClassId, DeviceErrorOp::kEmbedding, n, id, rows);
      y[i] = std::numeric_limits<T>::quiet_NaN();
      return;
    }
    y[i] = table[id * dim + c];
  }
};
template <class T>
struct EmbeddingBwd {  // one table element (v, c) per index: the rows of gy whose id is v, in index order
  i64 n, dim;
  std::int32_t const* ids;
  T const* gy;
  T beta;
  T* gtable;
  DDP_HOST_DEVICE void operator()(i64 k) const {
    i64 const v = k / dim, c = k % dim;
    T s = beta == T(0) ? T(0) : beta * gtable[k];  // the host's order: the old value first, then each use
    for (i64 i = 0; i < n; ++i)
      if (ids[i] == v) s += gy[i * dim + c];
    gtable[k] = s;
  }
};
template <class T>
struct LayerNormFwd {  // one row per index
  i64 cols;
  T eps;
  T const* x;
  T const* w;
  T const* b;
  T* y;
  T* mean;
  T* rstd;
  DDP_HOST_DEVICE void operator()(i64 r) const {
    T const* xr = x + r * cols;
    T* yr = y + r * cols;
    T s = 0;
    for (i64 c = 0; c < cols; ++c) s += xr[c];
    T const m = s / T(cols);
    T q = 0;
    for (i64 c = 0; c < cols; ++c) q += (xr[c] - m) * (xr[c] - m);
    T const rs = T(1) / dmath::sqrt(q / T(cols) + eps);
    mean[r] = m;
    rstd[r] = rs;
    for (i64 c = 0; c < cols; ++c) {
      T v = (xr[c] - m) * rs;
      if (w) v *= w[c];
      if (b) v += b[c];
      yr[c] = v;
    }
  }
};
template <class T>
struct LayerNormParamGrads {  // one column per index: gw = Σ_rows gy·x̂, gb = Σ_rows gy, rows in order
  i64 rows, cols;
  T const* x;
  T const* mean;
  T const* rstd;
  T const* gy;
  T beta_w;
  T* gw;
  T beta_b;
  T* gb;
  DDP_HOST_DEVICE void operator()(i64 c) const {
    T sw = gw && beta_w != T(0) ? beta_w * gw[c] : T(0);
    T sb = gb && beta_b != T(0) ? beta_b * gb[c] : T(0);
    for (i64 r = 0; r < rows; ++r) {
      T const g = gy[r * cols + c];
      sw += g * ((x[r * cols + c] - mean[r]) * rstd[r]);
      sb += g;
    }
    if (gw) gw[c] = sw;
    if (gb) gb[c] = sb;
  }
};
template <class T>
struct LayerNormInputGrad {  // one row per index: gx = rstd · (g - mean(g) - x̂·mean(g·x̂)), g = gy·w
  i64 cols;
  T const* x;
  T const* mean;
  T const* rstd;
  T const* w;
  T const* gy;
  T beta;
  T* gx;
  DDP_HOST_DEVICE void operator()(i64 r) const {
    T const* xr = x + r * cols;
    T const* gr = gy + r * cols;
    T const m = mean[r], rs = rstd[r];
    T sg = 0, sgx = 0;
    for (i64 c = 0; c < cols; ++c) {
      T const g = w ? gr[c] * w[c] : gr[c];
      sg += g;
      sgx += g * ((xr[c] - m) * rs);
    }
    T const mg = sg / T(cols), mgx = sgx / T(cols);
    for (i64 c = 0; c < cols; ++c) {
      T const g = w ? gr[c] * w[c] : gr[c];
      T const xhat = (xr[c] - m) * rs;
      dmath::assign_or_add(gx[r * cols + c], rs * (g - mg - xhat * mgx), beta);
    }
  }
};
template <class T>
struct GeluFwd {
  GeluApprox approx;
  T const* x;
  T* y;
  DDP_HOST_DEVICE void operator()(i64 i) const {
    T const v = x[i];
    if (approx == GeluApprox::kErf)
      y[i] = T(0.5) * v * (T(1) + dmath::erf(v * T(kInvSqrt2)));
    else
      y[i] = T(0.5) * v * (T(1) + dmath::tanh(T(kSqrt2OverPi) * (v + T(0.044715) * (v * v * v))));
  }
};
template <class T>
struct GeluBwd {  // gx = beta gx + gy · gelu'(x)
  GeluApprox approx;
  T const* x;
  T const* gy;
  T beta;
  T* gx;
  DDP_HOST_DEVICE void operator()(i64 i) const {
    T const v = x[i];
    T d;
    if (approx == GeluApprox::kErf) {  // Φ(x) + x·φ(x)
      d = T(0.5) * (T(1) + dmath::erf(v * T(kInvSqrt2))) + v * dmath::exp(T(-0.5) * (v * v)) * T(kInvSqrt2Pi);
    } else {
      T const t = dmath::tanh(T(kSqrt2OverPi) * (v + T(0.044715) * (v * v * v)));
      d = T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * T(kSqrt2OverPi) * (T(1) + T(3 * 0.044715) * (v * v));
    }
    dmath::assign_or_add(gx[i], gy[i] * d, beta);
  }
};
template <class T>
struct ScaledSoftmaxFwd {  // one row per index; causal: row r sees keys j <= r mod cols, the others get exactly 0
  i64 cols;
  T scale;
  SoftmaxMask mask;
  T const* x;
  T* y;
  DDP_HOST_DEVICE void operator()(i64 r) const {
    T const* xr = x + r * cols;
    T* yr = y + r * cols;
    i64 const live = mask == SoftmaxMask::kCausal ? r % cols + 1 : cols;
    T m = xr[0];
    for (i64 c = 1; c < live; ++c) m = xr[c] > m ? xr[c] : m;
    T z = 0;
    for (i64 c = 0; c < live; ++c) z += (yr[c] = dmath::exp((xr[c] - m) * scale));
    for (i64 c = 0; c < live; ++c) yr[c] /= z;
    for (i64 c = live; c < cols; ++c) yr[c] = T(0);
  }
};
template <class T>
struct ScaledSoftmaxBwd {  // one row per index: gx = beta gx + scale · y · (gy - Σ_c y·gy)
  i64 cols;
  T scale;
  T const* y;
  T const* gy;
  T beta;
  T* gx;
  DDP_HOST_DEVICE void operator()(i64 r) const {
    T const* yr = y + r * cols;
    T const* g = gy + r * cols;
    T dot = 0;
    for (i64 c = 0; c < cols; ++c) dot += yr[c] * g[c];
    for (i64 c = 0; c < cols; ++c) dmath::assign_or_add(gx[r * cols + c], scale * yr[c] * (g[c] - dot), beta);
  }
};
template <class T>
struct SwapAxes {  // one output element of (pre, dj, mid, di, post) per index
  AxisSwap s;
  T const* x;
  T beta;
  T* y;
  DDP_HOST_DEVICE void operator()(i64 i) const {
    i64 rest = i;
    i64 const q = rest % s.post;
    rest /= s.post;
    i64 const a = rest % s.di;
    rest /= s.di;
    i64 const m = rest % s.mid;
    rest /= s.mid;
    i64 const b = rest % s.dj;
    i64 const p = rest / s.dj;
    dmath::assign_or_add(y[i], x[(((p * s.di + a) * s.mid + m) * s.dj + b) * s.post + q], beta);
  }
};
template <class T>
struct CopyRows {  // one element of the (rows, cols) block per index
  i64 cols;
  T const* src;
  i64 src_ld;
  T beta;
  T* dst;
  i64 dst_ld;
  DDP_HOST_DEVICE void operator()(i64 i) const {
    i64 const r = i / cols, c = i % cols;
    dmath::assign_or_add(dst[r * dst_ld + c], src[r * src_ld + c], beta);
  }
};
}  // namespace detail::dev

// Part of Kernels<DeviceSpace> (device.hpp); the contracts are HostTransformerKernels' (host_transformer_kernels.hpp).
// Determinism: no atomics anywhere. Element-wise kernels (embedding gather, GELU, axis swaps, row copies) do one
// index per output element; row-wise ones (layer norm, softmax) one index per row, looping over its columns in
// order; the parameter gradients of layer norm one index per column, adding the rows in order; the embedding's
// scatter-add one index per table element, adding the uses in index order. So every result is bitwise the same on
// every run, rank and device system, and on CPP equals the host kernels' up to the order of sums (Eigen's are
// vectorised) and erf/exp/tanh (a few ulps); the embedding's gradient and layer norm's gw/gb for beta 0 or 1 are
// bitwise the host's. Embedding ids are checked in the kernel: a bad one is reported at the next host read
// (device_errors.hpp) and its output row is NaN.
struct DeviceTransformerKernels {
  using i64 = std::int64_t;

  // ---- embedding: y[n, :] = table[ids[n], :]   ids (n), table (rows, dim), y (n, dim) ----
  // An id outside [0, rows) is an ArgumentError at the next host read
  // ("embedding: id X at position R is outside [0, rows)") and its output row is NaN; nothing is read out of bounds.
  template <class T>
  static void embedding_fwd(i64 n, i64 rows, i64 dim, T const* table, std::int32_t const* ids, T* y) {
    if (dim > 0)
      detail::device_for(n * dim,
                         detail::dev::EmbeddingFwd<T>{dim, rows, table, ids, y, detail::device_error_slot().device});
  }
  // gtable = beta gtable + Σ_{i: ids[i] = v} gy[i, :] for every row v, added in index order i = 0, 1, ...
  // One index per table element, each scanning all n ids: O(rows·n·dim) work (a gather, with no atomics and no
  // sort), bitwise reproducible on any device system. Fine for character vocabularies (65 rows × 16k ids × 384 is
  // 4·10⁸ compares); for a 50k-token vocabulary it is ~800× that, and wants a sort of the ids by value instead.
  // Ids outside [0, rows) match no row (the forward reported them).
  template <class T>
  static void embedding_bwd(i64 n, i64 rows, i64 dim, std::int32_t const* ids, T const* gy, T beta, T* gtable) {
    detail::device_for(rows * dim, detail::dev::EmbeddingBwd<T>{n, dim, ids, gy, beta, gtable});
  }

  // ---- layer norm over the last dimension of (rows, cols) ----
  // y = (x - mean) · rstd · w + b, rstd = 1/sqrt(var + eps) with the biased variance; w, b may be null (1, 0).
  // Saves mean and rstd per row for the backward. Two passes in T (mean, then the squares about it).
  template <class T>
  static void layer_norm_fwd(i64 rows, i64 cols, T eps, T const* x, T const* w, T const* b, T* y, T* mean, T* rstd) {
    if (cols > 0) detail::device_for(rows, detail::dev::LayerNormFwd<T>{cols, eps, x, w, b, y, mean, rstd});
  }
  // With x̂ = (x - mean)·rstd and g = gy·w:  gx = rstd · (g - mean(g) - x̂·mean(g·x̂)),  gw = Σ_rows gy·x̂,
  // gb = Σ_rows gy. Each with its own beta (0: overwrite, 1: add); gx, gw, gb may be null (not wanted).
  template <class T>
  static void layer_norm_bwd(i64 rows, i64 cols, T const* x, T const* mean, T const* rstd, T const* w, T const* gy,
                             T beta_x, T* gx, T beta_w, T* gw, T beta_b, T* gb) {
    if (gw || gb)
      detail::device_for(cols,
                         detail::dev::LayerNormParamGrads<T>{rows, cols, x, mean, rstd, gy, beta_w, gw, beta_b, gb});
    if (gx && cols > 0)
      detail::device_for(rows, detail::dev::LayerNormInputGrad<T>{cols, x, mean, rstd, w, gy, beta_x, gx});
  }

  // ---- GELU: kErf x·Φ(x); kTanh 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))) ----
  template <class T>
  static void gelu_fwd(i64 n, GeluApprox approx, T const* x, T* y) {
    detail::device_for(n, detail::dev::GeluFwd<T>{approx, x, y});
  }
  // gx = beta gx + gy · gelu'(x)
  template <class T>
  static void gelu_bwd(i64 n, GeluApprox approx, T const* x, T const* gy, T beta, T* gx) {
    detail::device_for(n, detail::dev::GeluBwd<T>{approx, x, gy, beta, gx});
  }

  // ---- softmax over the last dimension of (rows, cols), of scale·x ----
  // kCausal: rows are grouped in squares of cols (query i of a (cols, cols) score matrix is row r with
  // i = r mod cols), and keys j > i are masked out (probability exactly 0).
  template <class T>
  static void softmax_fwd(i64 rows, i64 cols, T scale, SoftmaxMask mask, T const* x, T* y) {
    if (cols > 0) detail::device_for(rows, detail::dev::ScaledSoftmaxFwd<T>{cols, scale, mask, x, y});
  }
  // gx = beta gx + scale · y · (gy - Σ_c y·gy)   (masked entries have y = 0, so their gradient is 0)
  template <class T>
  static void softmax_bwd(i64 rows, i64 cols, T scale, T const* y, T const* gy, T beta, T* gx) {
    detail::device_for(rows, detail::dev::ScaledSoftmaxBwd<T>{cols, scale, y, gy, beta, gx});
  }

  // ---- y = beta y + x with axes i and j swapped: x (pre, di, mid, dj, post) -> y (pre, dj, mid, di, post) ----
  template <class T>
  static void swap_axes(AxisSwap const& s, T const* x, T beta, T* y) {
    detail::device_for(s.pre * s.di * s.mid * s.dj * s.post, detail::dev::SwapAxes<T>{s, x, beta, y});
  }

  // ---- dst[r, :cols] = beta dst[r, :cols] + src[r, :cols], rows with leading dimensions src_ld and dst_ld ----
  template <class T>
  static void copy_rows(i64 rows, i64 cols, T const* src, i64 src_ld, T beta, T* dst, i64 dst_ld) {
    if (cols > 0) detail::device_for(rows * cols, detail::dev::CopyRows<T>{cols, src, src_ld, beta, dst, dst_ld});
  }
};

}  // namespace ddp
