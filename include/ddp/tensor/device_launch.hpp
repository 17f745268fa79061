// The launch shapes every Thrust-based device kernel uses (an index loop and a reduction), the math the
// functors call on host and device alike, and the host<->device copies.
#pragma once

#include <thrust/for_each.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform_reduce.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "ddp/config.hpp"
#include "ddp/tensor/device_counters.hpp"
#include "ddp/tensor/device_errors.hpp"
#include "ddp/tensor/device_system.hpp"

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#include "ddp/tensor/device_buffer.hpp"  // cuda_check
#endif

namespace ddp::detail {

using i64 = std::int64_t;

// f(i) for every i in [0, n), on the device system (in parallel, in no particular order). f must write only
// what index i owns.
template <class F>
void device_for(i64 n, F const& f) {
  if (n <= 0) return;
  thrust::for_each_n(device_policy(), thrust::counting_iterator<i64>(0), n, f);
}

// op over f(i) for i in [0, n), starting from init, returned to the host. op must be associative and
// commutative (Thrust may combine in any tree). Like device_to_host, it then reports what the kernels before it
// found wrong in their inputs (device_errors.hpp).
template <class T, class F, class Op>
T device_reduce(i64 n, F const& f, T init, Op op) {
  if (n <= 0) return init;
  count_host_wait();
  T const r = thrust::transform_reduce(device_policy(), thrust::counting_iterator<i64>(0),
                                       thrust::counting_iterator<i64>(n), f, init, op);
  check_device_errors();  // the host has waited for every kernel before this one
  return r;
}

// Σ_{i<n} f(i) with init 0, returned to the host. The CPP system adds in index order (a left fold, like the host
// kernels' loops); CUDA and OMP add in a tree: deterministic for a given size and system, not bitwise the host's.
template <class T, class F>
T device_sum(i64 n, F const& f) {
  return device_reduce<T>(n, f, T(0), thrust::plus<T>());
}

// Bytes between host and device memory (synchronous: the host data may be reused on return).
inline void device_from_host(void* dst, void const* src, std::size_t bytes) {
  if (bytes == 0) return;
  count_sync_copy(bytes);
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
  cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D (Kernels<DeviceSpace>::from_host)");
#else
  std::memcpy(dst, src, bytes);
#endif
}
inline void device_to_host(void* dst, void const* src, std::size_t bytes) {
  if (bytes == 0) return;
  count_sync_copy(bytes);
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
  cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H (Kernels<DeviceSpace>::to_host)");
#else
  std::memcpy(dst, src, bytes);
#endif
  check_device_errors();  // the host has waited for every kernel before this copy
}

// Scalar math usable in device functors: libm's float/double functions (CUDA provides both sides).
namespace dmath {
template <class T>
DDP_HOST_DEVICE inline T exp(T x) {
  if constexpr (sizeof(T) == 4)
    return ::expf(x);
  else
    return ::exp(x);
}
template <class T>
DDP_HOST_DEVICE inline T log(T x) {
  if constexpr (sizeof(T) == 4)
    return ::logf(x);
  else
    return ::log(x);
}
template <class T>
DDP_HOST_DEVICE inline T tanh(T x) {
  if constexpr (sizeof(T) == 4)
    return ::tanhf(x);
  else
    return ::tanh(x);
}
template <class T>
DDP_HOST_DEVICE inline T sqrt(T x) {
  if constexpr (sizeof(T) == 4)
    return ::sqrtf(x);
  else
    return ::sqrt(x);
}
template <class T>
DDP_HOST_DEVICE inline T pow(T x, T y) {
  if constexpr (sizeof(T) == 4)
    return ::powf(x, y);
  else
    return ::pow(x, y);
}
template <class T>
DDP_HOST_DEVICE inline T abs(T x) {
  if constexpr (sizeof(T) == 4)
    return ::fabsf(x);
  else
    return ::fabs(x);
}
// dst = beta·dst + v where beta is 0 (dst not read: it may hold garbage) or 1, as the host's assign_or_add.
template <class T>
DDP_HOST_DEVICE inline void assign_or_add(T& dst, T v, T beta) {
  if (beta == T(0))
    dst = v;
  else if (beta == T(1))
    dst += v;
  else
    dst = beta * dst + v;
}
}  // namespace dmath

}  // namespace ddp::detail
