// SpaceAllocator<DeviceSpace>: device memory for tensors. CUDA: the stream-ordered pool (cudaMallocAsync on the
// legacy default stream, so a training step reuses last step's blocks); CPU device systems: the host block cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "ddp/tensor/device_system.hpp"
#include "ddp/tensor/host_allocator.hpp"
#include "ddp/tensor/tensor.hpp"

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#include "ddp/tensor/device_buffer.hpp"  // CudaError, cuda_check
#endif

namespace ddp {

// Uninitialised storage, as for host tensors. Freeing is stream-ordered on CUDA: a block freed while kernels
// that use it are still queued is reused only by work queued after them.
template <>
struct SpaceAllocator<DeviceSpace> {
  template <class T>
  static std::shared_ptr<T[]> allocate(std::size_t n) {
    std::size_t const bytes = n * sizeof(T);
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
    if (bytes == 0) return {};
    keep_pool_memory();
    void* p = nullptr;
    detail::cuda_check(cudaMallocAsync(&p, bytes, cudaStream_t{}), "cudaMallocAsync (device tensor)");
    return std::shared_ptr<T[]>(static_cast<T*>(p), [](T* q) { cudaFreeAsync(q, cudaStream_t{}); });
#else
    return std::shared_ptr<T[]>(static_cast<T*>(detail::HostBlockCache::allocate(bytes)),
                                [bytes](T* q) { detail::HostBlockCache::deallocate(q, bytes); });
#endif
  }

 private:
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
  // The default pool returns freed memory to the driver at every synchronisation (release threshold 0); keep it
  // instead, so each step reuses the last step's blocks (what PyTorch's caching allocator does). Once per device
  // and thread.
  static void keep_pool_memory() {
    thread_local int configured = -1;
    int dev = 0;
    detail::cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
    if (dev == configured) return;
    cudaMemPool_t pool = nullptr;
    detail::cuda_check(cudaDeviceGetDefaultMemPool(&pool, dev), "cudaDeviceGetDefaultMemPool");
    std::uint64_t keep = ~std::uint64_t{0};
    detail::cuda_check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
                       "cudaMemPoolSetAttribute");
    configured = dev;
  }
#endif
};

namespace detail {
// Device scratch for a kernel's intermediates (per-row losses, per-channel statistics, a cuDNN workspace):
// freed when it goes out of scope (stream-ordered on CUDA, so queued kernels may still use it).
template <class T>
class DeviceScratch {
 public:
  explicit DeviceScratch(std::int64_t n) : p_(SpaceAllocator<DeviceSpace>::allocate<T>(static_cast<std::size_t>(n))) {}
  T* data() const noexcept { return p_.get(); }

 private:
  std::shared_ptr<T[]> p_;
};
}  // namespace detail

}  // namespace ddp
