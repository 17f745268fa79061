// Device kernels for optimizer updates: SGD (momentum, dampening, Nesterov, weight decay) and Adam/AdamW, one
// fused pass over flat parameter/grad/state slices, one index per element.
#pragma once

#include <cstdint>

#include "ddp/tensor/device_launch.hpp"
#include "ddp/tensor/host_optim_kernels.hpp"  // SgdStep, AdamStep

namespace ddp {

namespace detail::dev {
template <class T>
struct SgdUpdate {
  T* w;
  T const* g;
  T* buf;
  SgdStep<T> p;
  DDP_HOST_DEVICE void operator()(i64 i) const {
    if (p.momentum == T(0)) {
      if (p.weight_decay == T(0))
        w[i] -= p.lr * g[i];
      else
        w[i] -= p.lr * (g[i] + p.weight_decay * w[i]);
      return;
    }
    T const d = p.weight_decay == T(0) ? g[i] : g[i] + p.weight_decay * w[i];
    T const b = p.first ? d : p.momentum * buf[i] + (T(1) - p.dampening) * d;
    buf[i] = b;
    if (p.nesterov)
      w[i] -= p.lr * (d + p.momentum * b);
    else
      w[i] -= p.lr * b;
  }
};
template <class T>
struct AdamUpdate {
  T* w;
  T const* g;
  T* m;
  T* v;
  AdamStep<T> p;
  T decay;
  DDP_HOST_DEVICE void operator()(i64 i) const {
    T d;
    if (p.decoupled) {
      if (p.weight_decay != T(0)) w[i] *= decay;
      d = g[i];
    } else {
      d = p.weight_decay != T(0) ? g[i] + p.weight_decay * w[i] : g[i];
    }
    m[i] = p.beta1 * m[i] + (T(1) - p.beta1) * d;
    v[i] = p.beta2 * v[i] + (T(1) - p.beta2) * (d * d);
    w[i] -= p.step_size * (m[i] / ((dmath::sqrt(v[i]) / p.bc2_sqrt) + p.eps));
  }
};
}  // namespace detail::dev

// Part of Kernels<DeviceSpace>; the update rules are HostOptimKernels' (PyTorch 1.13), element for element, so
// the same gradients give the same parameters as on the host (bitwise on the CPU device systems).
struct DeviceOptimKernels {
  using i64 = std::int64_t;

  template <class T>
  static void sgd_update(i64 n, T* w, T const* g, T* buf, SgdStep<T> const& p) {
    detail::device_for(n, detail::dev::SgdUpdate<T>{w, g, buf, p});
  }
  template <class T>
  static void adam_update(i64 n, T* w, T const* g, T* m, T* v, AdamStep<T> const& p) {
    detail::device_for(n, detail::dev::AdamUpdate<T>{w, g, m, v, p, T(1) - p.lr * p.weight_decay});
  }
};

}  // namespace ddp
