// Host kernels for optimizer updates: one fused, cache-blocked pass over flat parameter/grad/state slices.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace ddp {

// Hyper-parameters as the kernels see them (already in the element type).
template <class T>
struct SgdStep {
  T lr, momentum, dampening, weight_decay;
  bool nesterov;
  bool first;  // momentum buffer starts as the gradient
};
template <class T>
struct AdamStep {
  T lr, beta1, beta2, eps, weight_decay;
  bool decoupled;  // AdamW: w *= 1 - lr·wd first; Adam: g += wd·w
  T step_size;     // lr / (1 - beta1^t)
  T bc2_sqrt;      // sqrt(1 - beta2^t)
};

struct HostOptimKernels {
  using i64 = std::int64_t;
  static constexpr i64 kChunk = 2048;  // elements per block: w, g, state and a temporary stay in L1

  // PyTorch 1.13 SGD: d = g + wd·w; buf = first ? d : m·buf + (1-damp)·d; d = nesterov ? d + m·buf : buf;
  // w -= lr·d.  buf may be null when momentum == 0.
  template <class T>
  static void sgd_update(i64 n, T* w, T const* g, T* buf, SgdStep<T> const& p) {
    using A = Eigen::Array<T, Eigen::Dynamic, 1>;
    using M = Eigen::Map<A>;
    using CM = Eigen::Map<A const>;
    alignas(64) T tmp[kChunk];
    for (i64 s = 0; s < n; s += kChunk) {
      i64 const c = std::min(kChunk, n - s);
      M ww(w + s, c);
      CM gg(g + s, c);
      if (p.momentum == T(0)) {
        if (p.weight_decay == T(0))
          ww -= p.lr * gg;
        else
          ww -= p.lr * (gg + p.weight_decay * ww);
        continue;
      }
      M d(tmp, c), bb(buf + s, c);
      if (p.weight_decay == T(0))
        d = gg;
      else
        d = gg + p.weight_decay * ww;
      if (p.first)
        bb = d;
      else
        bb = p.momentum * bb + (T(1) - p.dampening) * d;
      if (p.nesterov)
        ww -= p.lr * (d + p.momentum * bb);
      else
        ww -= p.lr * bb;
    }
  }

  // PyTorch 1.13 Adam/AdamW (single-tensor path), bias-corrected. Every element takes the same path: blocks
  // of one SIMD packet (fully unrolled, unaligned loads; the last partial block through a padded copy).
  // Eigen's float sqrt packet is rsqrt + a Newton step, a few ulps off the scalar std::sqrt it uses for an
  // unaligned head or a tail; with both paths in play an element's bits would depend on where the arena puts
  // its parameter, i.e. on the bucket plan. With one path they depend only on its own values: bitwise the
  // same for any arena layout (on a given SIMD level).
  template <class T>
  static void adam_update(i64 n, T* w, T const* g, T* m, T* v, AdamStep<T> const& p) {
    constexpr i64 kB = Eigen::internal::packet_traits<T>::size;
    using A = Eigen::Array<T, kB, 1>;
    using Mp = Eigen::Map<A>;
    using CM = Eigen::Map<A const>;
    T const decay = T(1) - p.lr * p.weight_decay;
    bool const decay_w = p.decoupled && p.weight_decay != T(0);
    T const l2 = p.decoupled ? T(0) : p.weight_decay;
    auto block = [&](T* bw, T const* bg, T* bm, T* bv) {
      Mp ww(bw), mm(bm), vv(bv);
      CM gg(bg);
      if (decay_w) ww *= decay;
      A const d = l2 != T(0) ? A(gg + l2 * ww) : A(gg);
      mm = p.beta1 * mm + (T(1) - p.beta1) * d;
      vv = p.beta2 * vv + (T(1) - p.beta2) * d.square();
      ww -= p.step_size * (mm / ((vv.sqrt() / p.bc2_sqrt) + p.eps));
    };
    i64 i = 0;
    for (; i + kB <= n; i += kB) block(w + i, g + i, m + i, v + i);
    if (i < n) {
      i64 const r = n - i;
      alignas(64) T W[kB] = {}, G[kB] = {}, M[kB] = {}, V[kB] = {};
      std::copy(w + i, w + n, W), std::copy(g + i, g + n, G), std::copy(m + i, m + n, M), std::copy(v + i, v + n, V);
      block(W, G, M, V);
      std::copy(W, W + r, w + i), std::copy(M, M + r, m + i), std::copy(V, V + r, v + i);
    }
  }
};

}  // namespace ddp
