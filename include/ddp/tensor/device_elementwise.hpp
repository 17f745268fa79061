// Device element-wise kernels over Thrust: fill, copy, axpby, add, mul, broadcasts, sums, activations and the
// host<->device copies. Each functor does the host kernel's arithmetic for its element, in the same order.
#pragma once

#include <cstdint>
#include <limits>

#include "ddp/tensor/device_allocator.hpp"
#include "ddp/tensor/device_launch.hpp"
#include "ddp/tensor/half.hpp"

namespace ddp {

namespace detail::dev {
template <class T>
struct Fill {
  T v;
  T* y;
  DDP_HOST_DEVICE void operator()(i64 i) const { y[i] = v; }
};
template <class From, class To>
struct Cast {
  From const* x;
  To* y;
  float scale;
  DDP_HOST_DEVICE void operator()(i64 i) const { y[i] = To(static_cast<float>(x[i]) * scale); }
};
template <class T>
struct Copy {
  T const* x;
  T* y;
  DDP_HOST_DEVICE void operator()(i64 i) const { y[i] = x[i]; }
};
template <class T>
struct Axpby {
  T a;
  T const* x;
  T b;
  T* y;
  DDP_HOST_DEVICE void operator()(i64 i) const {
    if (b == T(0))
      y[i] = a == T(1) ? x[i] : a * x[i];
    else if (b == T(1))
      y[i] += a == T(1) ? x[i] : a * x[i];
    else
      y[i] = a * x[i] + b * y[i];
  }
};
template <class T>
struct Add {
  T sa;
  T const* a;
  T sb;
  T const* b;
  T* out;
  DDP_HOST_DEVICE void operator()(i64 i) const { out[i] = sa * a[i] + sb * b[i]; }
};
template <class T>
struct Mul {
  T const* a;
  T const* b;
  T beta;
  T* out;
  DDP_HOST_DEVICE void operator()(i64 i) const { dmath::assign_or_add(out[i], a[i] * b[i], beta); }
};
template <class T>
struct AddRowBroadcast {
  i64 cols;
  T const* bias;
  T* y;
  DDP_HOST_DEVICE void operator()(i64 i) const { y[i] += bias[i % cols]; }
};
template <class T>
struct AddRowBroadcastTo {
  i64 cols;
  T const* x;
  T const* bias;
  T* y;
  DDP_HOST_DEVICE void operator()(i64 i) const { y[i] = x[i] + bias[i % cols]; }
};
template <class T>
struct SumRows {  // one column per index
  i64 rows, cols;
  T const* x;
  T beta;
  T* out;
  DDP_HOST_DEVICE void operator()(i64 c) const {
    T s = 0;
    for (i64 r = 0; r < rows; ++r) s += x[r * cols + c];
    dmath::assign_or_add(out[c], s, beta);
  }
};
template <class T>
struct AddChannelBroadcast {
  i64 C, HW;
  T const* bias;
  T* y;
  DDP_HOST_DEVICE void operator()(i64 i) const { y[i] += bias[(i / HW) % C]; }
};
// sum_channels in three passes, each in a fixed order (deterministic): kPlaneLanes strided lanes per (n, c)
// plane (lane l sums elements l, l + kPlaneLanes, ...: adjacent GPU threads read adjacent addresses), then
// each plane's lanes in order, then the planes of n = 0..N-1 in order. One thread per channel gave a
// convolution's bias gradient to 32 or 64 GPU threads (15 of the 18 ms of GPU time per BasicNet step at batch
// 256 on an H100); one thread per plane read planes of 576–676 floats apart in a warp: 181 µs per call (the mean
// over BasicNet's two convolutions at batch 256), where the lane and plane passes take 14 + 13 µs (ncu,
// 2026-11-25).
inline constexpr i64 kPlaneLanes = 32;
template <class T>
struct PlaneLaneSums {  // index = plane * kPlaneLanes + lane
  i64 HW;
  T const* x;
  T* lanes;
  DDP_HOST_DEVICE void operator()(i64 k) const {
    i64 const j = k / kPlaneLanes, lane = k % kPlaneLanes;
    T const* p = x + j * HW;
    T s = 0;
    for (i64 i = lane; i < HW; i += kPlaneLanes) s += p[i];
    lanes[k] = s;
  }
};
template <class T>
struct PlaneSums {  // one (n, c) plane per index: its lanes in order
  T const* lanes;
  T* planes;
  DDP_HOST_DEVICE void operator()(i64 j) const {
    T const* p = lanes + j * kPlaneLanes;
    T plane = 0;
    for (i64 l = 0; l < kPlaneLanes; ++l) plane += p[l];
    planes[j] = plane;
  }
};
template <class T>
struct SumPlanes {  // one channel per index
  i64 N, C;
  T const* planes;
  T beta;
  T* out;
  DDP_HOST_DEVICE void operator()(i64 c) const {
    T s = 0;
    for (i64 n = 0; n < N; ++n) s += planes[n * C + c];
    out[c] = beta == T(0) ? s : beta * out[c] + s;
  }
};
template <class T>
struct AddScalar {
  T v, beta;
  T* y;
  DDP_HOST_DEVICE void operator()(i64 i) const {
    if (beta == T(0))
      y[i] = v;
    else if (beta == T(1))
      y[i] += v;
    else
      y[i] = beta * y[i] + v;
  }
};
template <class T>
struct Load {
  T const* x;
  DDP_HOST_DEVICE T operator()(i64 i) const { return x[i]; }
};
template <class T>
struct Square {
  T const* x;
  DDP_HOST_DEVICE T operator()(i64 i) const { return x[i] * x[i]; }
};
template <class T>
struct Abs {
  T const* x;
  DDP_HOST_DEVICE T operator()(i64 i) const { return dmath::abs(x[i]); }
};
template <class T>
struct AbsPow {
  T const* x;
  T p;
  DDP_HOST_DEVICE T operator()(i64 i) const { return dmath::pow(dmath::abs(x[i]), p); }
};
// max(a, b) that keeps a NaN from either side (a NaN fails every comparison), so the reduction's result is NaN
// when any element is, whatever order Thrust combines them in.
template <class T>
struct MaxKeepNaN {
  DDP_HOST_DEVICE T operator()(T a, T b) const { return (a != a || a > b) ? a : b; }
};
// y = min(max(y, lo), hi); a NaN stays NaN (both comparisons fail).
template <class T>
struct Clamp {
  T lo, hi;
  T* y;
  DDP_HOST_DEVICE void operator()(i64 i) const {
    T const v = y[i];
    y[i] = v < lo ? lo : (v > hi ? hi : v);
  }
};

template <class T>
struct ReluFwd {
  T const* x;
  T* y;
  DDP_HOST_DEVICE void operator()(i64 i) const { y[i] = x[i] < T(0) ? T(0) : x[i]; }
};
template <class T>
struct ReluBwd {  // beta is 0 or 1
  T const* y;
  T const* gy;
  T beta;
  T* gx;
  DDP_HOST_DEVICE void operator()(i64 i) const {
    T const v = y[i] > T(0) ? gy[i] : T(0);
    if (beta == T(0))
      gx[i] = v;
    else
      gx[i] += v;
  }
};
template <class T>
struct TanhFwd {
  T const* x;
  T* y;
  DDP_HOST_DEVICE void operator()(i64 i) const { y[i] = dmath::tanh(x[i]); }
};
template <class T>
struct TanhBwd {
  T const* y;
  T const* gy;
  T beta;
  T* gx;
  DDP_HOST_DEVICE void operator()(i64 i) const { dmath::assign_or_add(gx[i], gy[i] * (T(1) - y[i] * y[i]), beta); }
};
template <class T>
struct SigmoidFwd {
  T const* x;
  T* y;
  DDP_HOST_DEVICE void operator()(i64 i) const { y[i] = T(1) / (T(1) + dmath::exp(-x[i])); }
};
template <class T>
struct SigmoidBwd {
  T const* y;
  T const* gy;
  T beta;
  T* gx;
  DDP_HOST_DEVICE void operator()(i64 i) const { dmath::assign_or_add(gx[i], gy[i] * y[i] * (T(1) - y[i]), beta); }
};
// Status-word check of a reduced gradient bucket (bucket/reducer.hpp, static_graph): word i times `scale` must
// be within 0.25 of `id`; a word that is not is recorded as a device error (bucket `tag`, rank i).
template <class T>
struct CheckIds {
  T const* words;
  double scale;
  std::int64_t id, tag;
  DeviceErrorRecord* err;
  DDP_HOST_DEVICE void operator()(std::int64_t i) const {
    double const got = static_cast<double>(words[i]) * scale;
    double const off = got - static_cast<double>(id);
    if (off < 0.25 && off > -0.25) return;
    std::int64_t const k = static_cast<std::int64_t>(got < 0 ? got - 0.5 : got + 0.5);
    bool const integral = got - static_cast<double>(k) < 0.25 && got - static_cast<double>(k) > -0.25;
    report_device_error(err, DeviceErrorKind::kBucketId, DeviceErrorOp::kBucketCheck, tag, i, integral ? k : -1);
  }
};
}  // namespace detail::dev

// Part of Kernels<DeviceSpace> (device.hpp); the contracts are Kernels<HostSpace>'s (host_kernels.hpp).
// Results equal the host kernels' bitwise where both compute one rounding per element (fill, copy, axpby,
// add, mul, broadcasts, relu); sums and transcendental functions agree to a few ulps.
struct DeviceElementwiseKernels {
  using i64 = std::int64_t;

  template <class T>
  static void fill(i64 n, T v, T* y) {
    detail::device_for(n, detail::dev::Fill<T>{v, y});
  }
  template <class T>
  static void copy(i64 n, T const* x, T* y) {
    if (x != y) detail::device_for(n, detail::dev::Copy<T>{x, y});
  }
  // Checks that each of n words, times `scale`, is `id` (within 0.25), without a host wait: a word that is not
  // is a DdpError at the next host read (device_errors.hpp), naming bucket `tag` and the word's index as the rank.
  // Only non-host spaces have it: the host reads its words directly (bucket/reducer.hpp).
  template <class T>
  static void check_ids(i64 n, T const* words, T scale, i64 id, i64 tag) {
    detail::device_for(
        n, detail::dev::CheckIds<T>{words, static_cast<double>(scale), id, tag, detail::device_error_slot().device});
  }
  // y = To(float(x) * scale) (host_kernels.hpp)
  template <class From, class To>
  static void cast(i64 n, float scale, From const* x, To* y) {
    detail::device_for(n, detail::dev::Cast<From, To>{x, y, scale});
  }
  // y = a * x + b * y  (b == 0 never reads y)
  template <class T>
  static void axpby(i64 n, T a, T const* x, T b, T* y) {
    detail::device_for(n, detail::dev::Axpby<T>{a, x, b, y});
  }
  // out = sa * a + sb * b
  template <class T>
  static void add(i64 n, T sa, T const* a, T sb, T const* b, T* out) {
    detail::device_for(n, detail::dev::Add<T>{sa, a, sb, b, out});
  }
  // out = a * b + beta * out
  template <class T>
  static void mul(i64 n, T const* a, T const* b, T beta, T* out) {
    detail::device_for(n, detail::dev::Mul<T>{a, b, beta, out});
  }
  // y[r, c] += bias[c]
  template <class T>
  static void add_row_broadcast(i64 rows, i64 cols, T const* bias, T* y) {
    detail::device_for(rows * cols, detail::dev::AddRowBroadcast<T>{cols, bias, y});
  }
  // y[r, c] = x[r, c] + bias[c]   (y may be x)
  template <class T>
  static void add_row_broadcast(i64 rows, i64 cols, T const* x, T const* bias, T* y) {
    detail::device_for(rows * cols, detail::dev::AddRowBroadcastTo<T>{cols, x, bias, y});
  }
  // out[c] = beta * out[c] + sum_r x[r, c]
  template <class T>
  static void sum_rows(i64 rows, i64 cols, T const* x, T beta, T* out) {
    detail::device_for(cols, detail::dev::SumRows<T>{rows, cols, x, beta, out});
  }
  // y[n, c, :] += bias[c]
  template <class T>
  static void add_channel_broadcast(i64 N, i64 C, i64 HW, T const* bias, T* y) {
    detail::device_for(N * C * HW, detail::dev::AddChannelBroadcast<T>{C, HW, bias, y});
  }
  // out[c] = beta * out[c] + sum_{n, hw} x[n, c, hw]
  template <class T>
  static void sum_channels(i64 N, i64 C, i64 HW, T const* x, T beta, T* out) {
    detail::DeviceScratch<T> lanes(N * C * detail::dev::kPlaneLanes), planes(N * C);
    detail::device_for(N * C * detail::dev::kPlaneLanes, detail::dev::PlaneLaneSums<T>{HW, x, lanes.data()});
    detail::device_for(N * C, detail::dev::PlaneSums<T>{lanes.data(), planes.data()});
    detail::device_for(C, detail::dev::SumPlanes<T>{N, C, planes.data(), beta, out});
  }
  // y = beta * y + v  (beta == 0 never reads y)
  template <class T>
  static void add_scalar(i64 n, T v, T beta, T* y) {
    detail::device_for(n, detail::dev::AddScalar<T>{v, beta, y});
  }
  // Element-wise copies between host memory and device memory: synchronous, except from_host_async, which the
  // host does not wait for (device_launch.hpp: pinned staging and cudaMemcpyAsync on CUDA).
  template <class T>
  static void from_host(i64 n, T const* src, T* dst) {
    detail::device_from_host(dst, src, sizeof(T) * static_cast<std::size_t>(n));
  }
  template <class T>
  static void from_host_async(i64 n, T const* src, T* dst) {
    detail::device_from_host_async(dst, src, sizeof(T) * static_cast<std::size_t>(n));
  }
  template <class T>
  static void to_host(i64 n, T const* src, T* dst) {
    detail::device_to_host(dst, src, sizeof(T) * static_cast<std::size_t>(n));
  }
  template <class T>
  static T sum(i64 n, T const* x) {
    return detail::device_sum<T>(n, detail::dev::Load<T>{x});
  }
  // ||x||_p: (Σ|x_i|^p)^(1/p) for p > 0, max |x_i| for p = +inf; NaN if any element is NaN.
  template <class T>
  static T norm(i64 n, T const* x, T p) {
    using namespace detail;
    if (p == std::numeric_limits<T>::infinity()) return device_reduce<T>(n, dev::Abs<T>{x}, T(0), dev::MaxKeepNaN<T>{});
    if (p == T(2)) return dmath::sqrt(device_sum<T>(n, dev::Square<T>{x}));
    if (p == T(1)) return device_sum<T>(n, dev::Abs<T>{x});
    return dmath::pow(device_sum<T>(n, dev::AbsPow<T>{x, p}), T(1) / p);
  }
  // y = min(max(y, lo), hi) element-wise (lo <= hi); NaN stays NaN.
  template <class T>
  static void clamp(i64 n, T lo, T hi, T* y) {
    detail::device_for(n, detail::dev::Clamp<T>{lo, hi, y});
  }

  // ---- activations: forward y = f(x); backward gx = beta * gx + gy * f'(.) ----
  template <class T>
  static void relu_fwd(i64 n, T const* x, T* y) {
    detail::device_for(n, detail::dev::ReluFwd<T>{x, y});
  }
  template <class T>
  static void relu_bwd(i64 n, T const* y, T const* gy, T beta, T* gx) {
    detail::device_for(n, detail::dev::ReluBwd<T>{y, gy, beta, gx});
  }
  template <class T>
  static void tanh_fwd(i64 n, T const* x, T* y) {
    detail::device_for(n, detail::dev::TanhFwd<T>{x, y});
  }
  template <class T>
  static void tanh_bwd(i64 n, T const* y, T const* gy, T beta, T* gx) {
    detail::device_for(n, detail::dev::TanhBwd<T>{y, gy, beta, gx});
  }
  template <class T>
  static void sigmoid_fwd(i64 n, T const* x, T* y) {
    detail::device_for(n, detail::dev::SigmoidFwd<T>{x, y});
  }
  template <class T>
  static void sigmoid_bwd(i64 n, T const* y, T const* gy, T beta, T* gx) {
    detail::device_for(n, detail::dev::SigmoidBwd<T>{y, gy, beta, gx});
  }
};

}  // namespace ddp
