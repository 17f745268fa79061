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
        if (p.weight_decay == T(0)) ww -= p.lr * gg;
        else ww -= p.lr * (gg + p.weight_decay * ww);
        continue;
      }
      M d(tmp, c), bb(buf + s, c);
      if (p.weight_decay == T(0)) d = gg; else d = gg + p.weight_decay * ww;
      if (p.first) bb = d; else bb = p.momentum * bb + (T(1) - p.dampening) * d;
      if (p.nesterov) ww -= p.lr * (d + p.momentum * bb);
      else ww -= p.lr * bb;
    }
  }

  // PyTorch 1.13 Adam/AdamW (single-tensor path), bias-corrected.
  template <class T>
  static void adam_update(i64 n, T* w, T const* g, T* m, T* v, AdamStep<T> const& p) {
    using A = Eigen::Array<T, Eigen::Dynamic, 1>;
    using Mp = Eigen::Map<A>;
    using CM = Eigen::Map<A const>;
    alignas(64) T tmp[kChunk];
    T const decay = T(1) - p.lr * p.weight_decay;
    for (i64 s = 0; s < n; s += kChunk) {
      i64 const c = std::min(kChunk, n - s);
      Mp ww(w + s, c), mm(m + s, c), vv(v + s, c), d(tmp, c);
      CM gg(g + s, c);
      if (p.decoupled) {
        if (p.weight_decay != T(0)) ww *= decay;
        d = gg;
      } else {
        if (p.weight_decay != T(0)) d = gg + p.weight_decay * ww; else d = gg;
      }
      mm = p.beta1 * mm + (T(1) - p.beta1) * d;
      vv = p.beta2 * vv + (T(1) - p.beta2) * d.square();
      ww -= p.step_size * (mm / ((vv.sqrt() / p.bc2_sqrt) + p.eps));
    }
  }
};

}  // namespace ddp
