// Device kernels for max-pool and batch-norm over Thrust: one index per output element (pool forward), per
// input element (pool backward: gathers its windows, so overlapping windows need no atomics), per channel
// (batch-norm statistics, accumulated in double as on the host) and per element (normalisation).
#pragma once

#include <algorithm>
#include <cstdint>

#include "ddp/tensor/device_allocator.hpp"
#include "ddp/tensor/device_launch.hpp"
#include "ddp/tensor/kernels.hpp"  // ConvGeometry

namespace ddp {

namespace detail::dev {
template <class T>
struct MaxPoolFwd {  // one output element per index
  ConvGeometry g;
  T const* x;
  T* y;
  std::int32_t* idx;
  DDP_HOST_DEVICE void operator()(i64 o) const {
    i64 const OH = g.OH(), OW = g.OW();
    i64 const ow = o % OW, oh = (o / OW) % OH, p = o / (OW * OH);
    T const* in = x + p * g.H * g.W;
    i64 best = (oh * g.stride) * g.W + ow * g.stride;
    T bv = in[best];
    for (i64 ki = 0; ki < g.k; ++ki)
      for (i64 kj = 0; kj < g.k; ++kj) {
        i64 const j = (oh * g.stride + ki) * g.W + ow * g.stride + kj;
        if (in[j] > bv || in[j] != in[j]) {  // a later value wins if larger or NaN (PyTorch's rule)
          bv = in[j];
          best = j;
        }
      }
    y[o] = bv;
    idx[o] = static_cast<std::int32_t>(best);
  }
};
// Index: the integer type of the index arithmetic. 64-bit division costs tens of instructions on a GPU; with
// std::uint32_t (chosen when every index fits) conv2's pooling gradient at batch 256 takes 98 µs on an H100,
// 180 µs in i64 (ncu, 2026-11-25).
template <class T, class Index = i64>
struct MaxPoolBwd {  // one input element per index: the sum of gy over the windows whose argmax it is
  ConvGeometry g;
  T const* gy;
  std::int32_t const* idx;
  T beta;
  T* gx;
  DDP_HOST_DEVICE void operator()(i64 i64_i) const {
    Index const i = static_cast<Index>(i64_i);
    Index const W = static_cast<Index>(g.W), k = static_cast<Index>(g.k), s = static_cast<Index>(g.stride);
    Index const OH = static_cast<Index>(g.OH()), OW = static_cast<Index>(g.OW()), HW = static_cast<Index>(g.H) * W;
    Index const j = i % HW, p = i / HW, ih = j / W, iw = j % W;
    // Windows covering (ih, iw): oh·s <= ih < oh·s + k.
    Index const oh_lo = ih >= k ? (ih - k) / s + 1 : 0, oh_hi = ih / s < OH - 1 ? ih / s : OH - 1;
    Index const ow_lo = iw >= k ? (iw - k) / s + 1 : 0, ow_hi = iw / s < OW - 1 ? iw / s : OW - 1;
    T v = beta == T(0) ? T(0) : gx[i];
    for (Index oh = oh_lo; oh <= oh_hi; ++oh)
      for (Index ow = ow_lo; ow <= ow_hi; ++ow) {
        Index const o = (p * OH + oh) * OW + ow;
        if (idx[o] == static_cast<std::int32_t>(j)) v += gy[o];
      }
    gx[i] = v;
  }
};

// Per channel: batch mean, 1/std, unbiased variance, and y = a·x + b's coefficients (as the host computes them).
template <class T>
struct BatchNormStats {
  i64 N, C, HW;
  T const* x;
  T const* gamma;
  T const* beta;
  T eps;
  T* mean;
  T* invstd;
  T* var_unbiased;
  T* a;
  T* b;
  DDP_HOST_DEVICE void operator()(i64 c) const {
    i64 const M = N * HW;
    double s = 0, ss = 0;
    for (i64 n = 0; n < N; ++n) {
      T const* xp = x + (n * C + c) * HW;
      for (i64 i = 0; i < HW; ++i) s += xp[i];
    }
    double const m = M ? s / double(M) : 0.0;
    for (i64 n = 0; n < N; ++n) {
      T const* xp = x + (n * C + c) * HW;
      for (i64 i = 0; i < HW; ++i) ss += (xp[i] - m) * (xp[i] - m);
    }
    double const var = M ? ss / double(M) : 0.0;
    T const is = T(1.0 / ::sqrt(var + double(eps)));
    mean[c] = T(m);
    invstd[c] = is;
    var_unbiased[c] = M > 1 ? T(ss / double(M - 1)) : T(var);
    a[c] = gamma ? gamma[c] * is : is;
    b[c] = (beta ? beta[c] : T(0)) - a[c] * T(m);
  }
};
template <class T>
struct BatchNormEvalCoef {
  T const* gamma;
  T const* beta;
  T const* mean;
  T const* invstd;
  T* a;
  T* b;
  DDP_HOST_DEVICE void operator()(i64 c) const {
    a[c] = gamma ? gamma[c] * invstd[c] : invstd[c];
    b[c] = (beta ? beta[c] : T(0)) - a[c] * mean[c];
  }
};
template <class T>
struct ChannelAffine {  // y = a[c]·x + b[c]
  i64 C, HW;
  T const* x;
  T const* a;
  T const* b;
  T* y;
  DDP_HOST_DEVICE void operator()(i64 i) const {
    i64 const c = (i / HW) % C;
    y[i] = a[c] * x[i] + b[c];
  }
};
template <class T>
struct RsqrtEps {
  T const* var;
  T eps;
  T* out;
  DDP_HOST_DEVICE void operator()(i64 i) const { out[i] = T(1) / dmath::sqrt(var[i] + eps); }
};
template <class T>
struct BatchNormBwdSums {  // per channel: Σ gy and Σ gy·xhat; the parameter gradients
  i64 N, C, HW;
  T const* x;
  T const* mean;
  T const* invstd;
  T const* gy;
  T beta_g;
  T* ggamma;
  T beta_b;
  T* gbeta;
  T* sum_g;
  T* sum_gxhat;
  DDP_HOST_DEVICE void operator()(i64 c) const {
    double sg = 0, sgx = 0;
    for (i64 n = 0; n < N; ++n) {
      T const* xp = x + (n * C + c) * HW;
      T const* gp = gy + (n * C + c) * HW;
      for (i64 i = 0; i < HW; ++i) {
        sg += gp[i];
        sgx += gp[i] * (xp[i] - mean[c]);
      }
    }
    T const sgt = T(sg), sgxh = T(sgx) * invstd[c];
    sum_g[c] = sgt;
    sum_gxhat[c] = sgxh;
    if (ggamma) ggamma[c] = beta_g == T(0) ? sgxh : ggamma[c] + sgxh;
    if (gbeta) gbeta[c] = beta_b == T(0) ? sgt : gbeta[c] + sgt;
  }
};
template <class T>
struct BatchNormBwdInput {
  bool training;
  i64 N, C, HW;
  T const* x;
  T const* gamma;
  T const* mean;
  T const* invstd;
  T const* gy;
  T const* sum_g;
  T const* sum_gxhat;
  T beta_x;
  T* gx;
  DDP_HOST_DEVICE void operator()(i64 i) const {
    i64 const c = (i / HW) % C, M = N * HW;
    T const is = invstd[c], gm = gamma ? gamma[c] : T(1);
    T v;
    if (training) {
      T const xhat = (x[i] - mean[c]) * is;
      v = gm * is / T(M) * (T(M) * gy[i] - sum_g[c] - xhat * sum_gxhat[c]);
    } else {
      v = gm * is * gy[i];
    }
    gx[i] = beta_x == T(0) ? v : gx[i] + v;
  }
};
}  // namespace detail::dev

// Part of Kernels<DeviceSpace>; contracts as HostConvKernels' max-pool and batch-norm. Same arithmetic as the
// host loops, element for element: results equal the host kernels' bitwise on the CPU device systems.
struct DeviceImageKernels {
  using i64 = std::int64_t;

  template <class T>
  static void maxpool_fwd(ConvGeometry const& g, T const* x, T* y, std::int32_t* idx) {
    detail::device_for(g.N * g.C * g.OH() * g.OW(), detail::dev::MaxPoolFwd<T>{g, x, y, idx});
  }
  template <class T>
  static void maxpool_bwd(ConvGeometry const& g, T const* gy, std::int32_t const* idx, T beta, T* gx) {
    i64 const n = g.N * g.C * g.H * g.W, no = g.N * g.C * g.OH() * g.OW();
    if (std::max(n, no) <= i64{0xFFFFFFFF})
      detail::device_for(n, detail::dev::MaxPoolBwd<T, std::uint32_t>{g, gy, idx, beta, gx});
    else
      detail::device_for(n, detail::dev::MaxPoolBwd<T>{g, gy, idx, beta, gx});
  }

  template <class T>
  static void batchnorm_fwd_train(i64 N, i64 C, i64 HW, T const* x, T const* gamma, T const* beta_, T eps, T* y,
                                  T* mean, T* invstd, T* var_unbiased) {
    detail::DeviceScratch<T> a(C), b(C);
    detail::device_for(C, detail::dev::BatchNormStats<T>{N, C, HW, x, gamma, beta_, eps, mean, invstd, var_unbiased,
                                                         a.data(), b.data()});
    detail::device_for(N * C * HW, detail::dev::ChannelAffine<T>{C, HW, x, a.data(), b.data(), y});
  }
  // out[c] = 1 / sqrt(var[c] + eps)
  template <class T>
  static void rsqrt_eps(i64 n, T const* var, T eps, T* out) {
    detail::device_for(n, detail::dev::RsqrtEps<T>{var, eps, out});
  }
  template <class T>
  static void batchnorm_fwd_eval(i64 N, i64 C, i64 HW, T const* x, T const* gamma, T const* beta_, T const* mean,
                                 T const* invstd, T* y) {
    detail::DeviceScratch<T> a(C), b(C);
    detail::device_for(C, detail::dev::BatchNormEvalCoef<T>{gamma, beta_, mean, invstd, a.data(), b.data()});
    detail::device_for(N * C * HW, detail::dev::ChannelAffine<T>{C, HW, x, a.data(), b.data(), y});
  }
  template <class T>
  static void batchnorm_bwd(bool training, i64 N, i64 C, i64 HW, T const* x, T const* gamma, T const* mean,
                            T const* invstd, T const* gy, T beta_x, T* gx, T beta_g, T* ggamma, T beta_b, T* gbeta) {
    detail::DeviceScratch<T> sum_g(C), sum_gxhat(C);
    detail::device_for(C, detail::dev::BatchNormBwdSums<T>{N, C, HW, x, mean, invstd, gy, beta_g, ggamma, beta_b, gbeta,
                                                           sum_g.data(), sum_gxhat.data()});
    if (gx)
      detail::device_for(N * C * HW, detail::dev::BatchNormBwdInput<T>{training, N, C, HW, x, gamma, mean, invstd, gy,
                                                                       sum_g.data(), sum_gxhat.data(), beta_x, gx});
  }
};

}  // namespace ddp
