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
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
// One thread's pinned staging for device_from_host_async: a ring of buffers, each with the event of the copy that
// last read it, so a buffer is refilled only once its copy has run (on the device where it was recorded).
class PinnedStaging {
 public:
  static constexpr std::size_t kSlots = 4;  // two tensors a step (inputs, targets), double-buffered
  PinnedStaging() = default;
  PinnedStaging(PinnedStaging const&) = delete;
  PinnedStaging& operator=(PinnedStaging const&) = delete;
  ~PinnedStaging() {
    for (auto& s : slots_) {  // at thread exit; errors (a context already torn down) are ignored
      if (s.done) cudaEventDestroy(s.done);
      if (s.data) cudaFreeHost(s.data);
    }
  }
  // A buffer of at least `bytes` whose previous copy has completed; `waited` tells whether the host had to wait.
  void* take(std::size_t bytes, int device, bool& waited) {
    Slot& s = slots_[next_++ % kSlots];
    waited = false;
    if (s.done) {
      cudaError_t const rc = cudaEventQuery(s.done);
      if (rc == cudaErrorNotReady) {
        waited = true;
        cuda_check(cudaEventSynchronize(s.done), "cudaEventSynchronize (pinned staging)");
      } else {
        cuda_check(rc, "cudaEventQuery (pinned staging)");
      }
      if (s.device != device) {  // events belong to a device
        cudaEventDestroy(s.done);
        s.done = nullptr;
      }
    }
    if (!s.done) {
      cuda_check(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "cudaEventCreate (pinned staging)");
      s.device = device;
    }
    if (s.capacity < bytes) {
      if (s.data) cuda_check(cudaFreeHost(s.data), "cudaFreeHost (pinned staging)");
      s.data = nullptr;
      s.capacity = 0;
      cuda_check(cudaHostAlloc(&s.data, bytes, cudaHostAllocPortable), "cudaHostAlloc (pinned staging)");
      s.capacity = bytes;
    }
    current_ = &s;
    return s.data;
  }
  // The copy out of the buffer take() returned is queued on `stream`.
  void queued(cudaStream_t stream) { cuda_check(cudaEventRecord(current_->done, stream), "cudaEventRecord (staging)"); }

 private:
  struct Slot {
    void* data = nullptr;
    std::size_t capacity = 0;
    cudaEvent_t done = nullptr;
    int device = -1;
  };
  Slot slots_[kSlots];
  std::size_t next_ = 0;
  Slot* current_ = nullptr;
};
#endif

// Host memory to device memory without the host waiting for the copy: later device work (on the compute stream)
// sees the data, and `src` may be reused on return. CUDA: `src` is copied into one of this thread's pinned
// staging buffers, then cudaMemcpyAsync on the legacy default stream; the host waits only if that buffer's
// previous copy (four uploads ago) is still queued, counted as a host wait. CPU systems: a memcpy.
inline void device_from_host_async(void* dst, void const* src, std::size_t bytes) {
  if (bytes == 0) return;
  count_async_copy(bytes);
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
  thread_local PinnedStaging staging;
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  bool waited = false;
  void* const pinned = staging.take(bytes, device, waited);
  if (waited) count_host_wait();
  std::memcpy(pinned, src, bytes);
  cuda_check(cudaMemcpyAsync(dst, pinned, bytes, cudaMemcpyHostToDevice, cudaStream_t{}),
             "cudaMemcpyAsync H2D (Kernels<DeviceSpace>::from_host_async)");
  staging.queued(cudaStream_t{});
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
// erf: CUDA's erff/erf on the device; std::erf on the host (the Thrust CPU systems, and nvcc's host pass).
template <class T>
DDP_HOST_DEVICE inline T erf(T x) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4)
    return ::erff(x);
  else
    return ::erf(x);
#else
  return std::erf(x);
#endif
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
