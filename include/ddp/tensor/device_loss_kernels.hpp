// Device kernels for the softmax family and the losses (log_softmax, cross-entropy, NLL, MSE) over Thrust: one
// index per row for row-wise work, one per element for gradients; mean losses reduced on the device.
#pragma once

#include <cstdint>
#include <limits>

#include "ddp/tensor/device_allocator.hpp"
#include "ddp/tensor/device_errors.hpp"
#include "ddp/tensor/device_launch.hpp"

namespace ddp {

namespace detail::dev {
template <class T>
DDP_HOST_DEVICE inline T row_max(T const* x, i64 cols) {
  T m = x[0];
  for (i64 c = 1; c < cols; ++c) m = x[c] > m ? x[c] : m;
  return m;
}
template <class T>
struct LogSoftmaxFwd {  // one row per index
  i64 cols;
  T const* x;
  T* y;
  DDP_HOST_DEVICE void operator()(i64 r) const {
    T const* xr = x + r * cols;
    T* yr = y + r * cols;
    T const m = row_max(xr, cols);
    T z = 0;
    for (i64 c = 0; c < cols; ++c) z += dmath::exp(xr[c] - m);
    T const log_z = dmath::log(z);  // (x - m) - log Σ exp(x - m), never m + log Σ (see the host kernel)
    for (i64 c = 0; c < cols; ++c) yr[c] = (xr[c] - m) - log_z;
  }
};
template <class T>
struct LogSoftmaxBwd {  // one row per index
  i64 cols;
  T const* y;
  T const* gy;
  T beta;
  T* gx;
  DDP_HOST_DEVICE void operator()(i64 r) const {
    T const* g = gy + r * cols;
    T s = 0;
    for (i64 c = 0; c < cols; ++c) s += g[c];
    for (i64 c = 0; c < cols; ++c) dmath::assign_or_add(gx[r * cols + c], g[c] - dmath::exp(y[r * cols + c]) * s, beta);
  }
};
template <class T>
struct CrossEntropyFwd {  // one row per index: probabilities and the row's loss
  i64 cols;
  T const* logits;
  std::int32_t const* target;
  T* probs;
  T* row_loss;
  DeviceErrorRecord* err;
  DDP_HOST_DEVICE void operator()(i64 r) const {
    T const* xr = logits + r * cols;
    T* pr = probs + r * cols;
    if (target[r] < 0 || target[r] >= cols) {  // reported at the next host read; the row's outputs are NaN
      report_device_error(err, DeviceErrorKind::kClassId, DeviceErrorOp::kCrossEntropy, r, target[r], cols);
      T const nan = std::numeric_limits<T>::quiet_NaN();
      for (i64 c = 0; c < cols; ++c) pr[c] = nan;
      row_loss[r] = nan;
      return;
    }
    T const m = row_max(xr, cols);
    T z = 0;
    for (i64 c = 0; c < cols; ++c) z += (pr[c] = dmath::exp(xr[c] - m));
    for (i64 c = 0; c < cols; ++c) pr[c] /= z;
    row_loss[r] = dmath::log(z) - (xr[target[r]] - m);
  }
};
template <class T>
struct CrossEntropyBwd {  // one element per index; the scale is s, or g[0] / rows where g is given
  i64 cols;
  T const* probs;
  std::int32_t const* target;
  T s, beta;
  T* gx;
  T const* g = nullptr;
  T rows = T(1);
  DDP_HOST_DEVICE void operator()(i64 i) const {
    T const scale = g ? *g / rows : s;
    dmath::assign_or_add(gx[i], scale * probs[i], beta);
    if (i % cols == target[i / cols]) gx[i] -= scale;
  }
};
template <class T>
struct MeanInto {  // out[0] = (x[0] + ... + x[n-1]) / n, added in index order (one thread: n is a batch's rows)
  i64 n;
  T const* x;
  T* out;
  DDP_HOST_DEVICE void operator()(i64) const {
    T s = T(0);
    for (i64 i = 0; i < n; ++i) s += x[i];
    out[0] = n ? s / T(n) : T(0);
  }
};
template <class T>
struct NllPick {  // -logp[r, target[r]]
  i64 cols;
  T const* logp;
  std::int32_t const* target;
  DeviceErrorRecord* err;
  DDP_HOST_DEVICE T operator()(i64 r) const {
    if (target[r] < 0 || target[r] >= cols) {
      report_device_error(err, DeviceErrorKind::kClassId, DeviceErrorOp::kNllLoss, r, target[r], cols);
      return std::numeric_limits<T>::quiet_NaN();
    }
    return -logp[r * cols + target[r]];
  }
};
template <class T>
struct NllBwd {  // one element per index; beta 0 or 1
  i64 cols;
  std::int32_t const* target;
  T s, beta;
  T* gx;
  DDP_HOST_DEVICE void operator()(i64 i) const {
    T v = beta == T(0) ? T(0) : gx[i];
    if (i % cols == target[i / cols]) v -= s;
    gx[i] = v;
  }
};
template <class T>
struct SquaredError {
  T const* p;
  T const* t;
  DDP_HOST_DEVICE T operator()(i64 i) const {
    T const d = p[i] - t[i];
    return d * d;
  }
};
template <class T>
struct MseBwd {
  T const* p;
  T const* t;
  T s, beta;
  T* gp;
  DDP_HOST_DEVICE void operator()(i64 i) const { dmath::assign_or_add(gp[i], s * (p[i] - t[i]), beta); }
};
}  // namespace detail::dev

// Part of Kernels<DeviceSpace>; contracts as Kernels<HostSpace>'s softmax family. Mean losses come back to the
// host (a synchronising read on CUDA), as the host kernels return them, or, for cross-entropy (what the autograd
// calls), stay in device memory.
struct DeviceLossKernels {
  using i64 = std::int64_t;

  template <class T>
  static void log_softmax_fwd(i64 rows, i64 cols, T const* x, T* y) {
    if (cols > 0) detail::device_for(rows, detail::dev::LogSoftmaxFwd<T>{cols, x, y});
  }
  // gx = beta gx + gy - softmax * rowsum(gy), softmax = exp(y)
  template <class T>
  static void log_softmax_bwd(i64 rows, i64 cols, T const* y, T const* gy, T beta, T* gx) {
    detail::device_for(rows, detail::dev::LogSoftmaxBwd<T>{cols, y, gy, beta, gx});
  }
  // Mean cross-entropy of logits (rows, cols) against class ids; writes softmax probabilities for backward.
  template <class T>
  static T cross_entropy_fwd(i64 rows, i64 cols, T const* logits, std::int32_t const* target, T* probs) {
    if (rows == 0) return T(0);
    detail::DeviceScratch<T> row_loss(rows);
    detail::device_for(rows, detail::dev::CrossEntropyFwd<T>{cols, logits, target, probs, row_loss.data(),
                                                             detail::device_error_slot().device});
    return detail::device_sum<T>(rows, detail::dev::Load<T>{row_loss.data()}) / T(rows);
  }
  // gx = beta gx + g * (probs - onehot(target)) / rows
  template <class T>
  static void cross_entropy_bwd(i64 rows, i64 cols, T const* probs, std::int32_t const* target, T g, T beta, T* gx) {
    T const s = rows ? g / T(rows) : T(0);
    detail::device_for(rows * cols, detail::dev::CrossEntropyBwd<T>{cols, probs, target, s, beta, gx});
  }
  // The same two with the loss and its gradient in device memory (loss[0], g[0]): no host wait, no copy. The mean
  // adds the rows in order on one device thread (on Thrust's CPU system bitwise the value above).
  template <class T>
  static void cross_entropy_fwd(i64 rows, i64 cols, T const* logits, std::int32_t const* target, T* probs, T* loss) {
    if (rows == 0) {
      detail::device_for(1, detail::dev::MeanInto<T>{0, nullptr, loss});
      return;
    }
    detail::DeviceScratch<T> row_loss(rows);
    detail::device_for(rows, detail::dev::CrossEntropyFwd<T>{cols, logits, target, probs, row_loss.data(),
                                                             detail::device_error_slot().device});
    detail::device_for(1, detail::dev::MeanInto<T>{rows, row_loss.data(), loss});
  }
  template <class T>
  static void cross_entropy_bwd(i64 rows, i64 cols, T const* probs, std::int32_t const* target, T const* g, T beta,
                                T* gx) {
    detail::device_for(rows * cols,
                       detail::dev::CrossEntropyBwd<T>{cols, probs, target, T(0), beta, gx, g, static_cast<T>(rows)});
  }
  // Mean negative log-likelihood of log-probabilities (rows, cols).
  template <class T>
  static T nll_fwd(i64 rows, i64 cols, T const* logp, std::int32_t const* target) {
    return rows ? detail::device_sum<T>(
                      rows, detail::dev::NllPick<T>{cols, logp, target, detail::device_error_slot().device}) /
                      T(rows)
                : T(0);
  }
  template <class T>
  static void nll_bwd(i64 rows, i64 cols, std::int32_t const* target, T g, T beta, T* gx) {
    T const s = rows ? g / T(rows) : T(0);
    detail::device_for(rows * cols, detail::dev::NllBwd<T>{cols, target, s, beta, gx});
  }
  // Mean squared error over n elements.
  template <class T>
  static T mse_fwd(i64 n, T const* p, T const* t) {
    return n ? detail::device_sum<T>(n, detail::dev::SquaredError<T>{p, t}) / T(n) : T(0);
  }
  // gp = beta gp + g * 2 (p - t) / n
  template <class T>
  static void mse_bwd(i64 n, T const* p, T const* t, T g, T beta, T* gp) {
    T const s = n ? T(2) * g / T(n) : T(0);
    detail::device_for(n, detail::dev::MseBwd<T>{p, t, s, beta, gp});
  }
};

}  // namespace ddp
