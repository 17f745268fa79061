// SpaceAllocator<DeviceSpace>: device memory for tensors, through a per-thread cache of freed blocks over the
// device's allocator (CUDA: the stream-ordered pool, cudaMallocAsync on the legacy default stream; CPU device
// systems: aligned_alloc), so a training step after warm-up allocates nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <unordered_map>

#include "ddp/tensor/device_counters.hpp"
#include "ddp/tensor/device_system.hpp"
#include "ddp/tensor/host_allocator.hpp"
#include "ddp/tensor/tensor.hpp"

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#include "ddp/tensor/device_buffer.hpp"  // CudaError, cuda_check
#endif

namespace ddp {

namespace detail {

// This thread's freed device blocks, by device and size (rounded up to 512 bytes), handed to its next allocations
// of that size: after a step's warm-up a training step takes nothing from the device's allocator (last step's
// blocks come back), as PyTorch's caching allocator does, and device_counts().allocations counts only what the
// cache could not serve. One cache per thread (each rank of the threads backend is a thread); a block freed on
// another thread joins that thread's cache. At most kMaxCachedBytes are kept per thread; an allocation the
// device refuses empties the cache and tries again.
// CUDA: blocks come from the stream-ordered pool (cudaMallocAsync on the legacy default stream). A block freed
// while kernels that use it are still queued is handed only to later work, which (on one stream, as the device
// kernels run) is queued after them; a buffer used on another stream must outlive that stream's work.
class DeviceBlockCache {
 public:
  static constexpr std::size_t kGranule = 512;
  static constexpr std::size_t kMaxCachedBytes = std::size_t{4} << 30;

  DeviceBlockCache() = default;
  ~DeviceBlockCache() {
    destroyed() = true;
    release_all();
  }
  DeviceBlockCache(DeviceBlockCache const&) = delete;
  DeviceBlockCache& operator=(DeviceBlockCache const&) = delete;

  // The current device (CUDA: cudaGetDevice; CPU systems: 0): a block is handed back with the device it came from.
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
  static int current_device() noexcept {
    int dev = 0;
    cudaGetDevice(&dev);
    return dev;
  }
#else
  static int current_device() noexcept { return 0; }
#endif

  // A block of at least `bytes` on the current device.
  static void* allocate(std::size_t bytes) {
    Key const key{current_device(), round(bytes)};
    if (!destroyed()) {
      auto& c = local();
      if (auto it = c.free_.find(key); it != c.free_.end()) {
        void* p = it->second;
        c.free_.erase(it);
        c.cached_ -= key.bytes;
        return p;
      }
    }
    count_allocation(key.bytes);
    if (void* p = raw_allocate(key.bytes)) return p;
    if (!destroyed()) local().release_all();  // the device is full: give back what this thread holds, retry
    if (void* p = raw_allocate(key.bytes)) return p;
    throw_out_of_memory(key.bytes);
  }
  // Back to this thread's cache: `device` is the one the block was allocated on (the freeing thread may be on
  // another).
  static void deallocate(void* p, std::size_t bytes, int device) noexcept {
    Key const key{device, round(bytes)};
    if (!destroyed()) {
      auto& c = local();
      if (c.cached_ + key.bytes <= kMaxCachedBytes) {
        try {
          c.free_.emplace(key, p);
          c.cached_ += key.bytes;
          return;
        } catch (...) {}
      }
    }
    raw_free(p);
  }

 private:
  struct Key {
    int device;
    std::size_t bytes;
    bool operator==(Key const&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(Key const& k) const noexcept { return k.bytes * 31 + static_cast<std::size_t>(k.device); }
  };

  static std::size_t round(std::size_t bytes) noexcept { return (bytes + kGranule - 1) / kGranule * kGranule; }

  void release_all() noexcept {
    for (auto& [key, p] : free_) raw_free(p);
    free_.clear();
    cached_ = 0;
  }

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
  static void* raw_allocate(std::size_t bytes) {
    keep_pool_memory();
    void* p = nullptr;
    cudaError_t const rc = cudaMallocAsync(&p, bytes, cudaStream_t{});
    if (rc == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it: the caller retries
      return nullptr;
    }
    cuda_check(rc, "cudaMallocAsync (device tensor)");
    return p;
  }
  static void raw_free(void* p) noexcept { cudaFreeAsync(p, cudaStream_t{}); }
  [[noreturn]] static void throw_out_of_memory(std::size_t bytes) {
    cuda_check(cudaErrorMemoryAllocation, cat("cudaMallocAsync of ", bytes, " bytes (device tensor)").c_str());
    throw std::bad_alloc();
  }
  // The default pool returns freed memory to the driver at every synchronisation (release threshold 0); keep it
  // instead. Once per device and thread.
  static void keep_pool_memory() {
    thread_local int configured = -1;
    int const dev = current_device();
    if (dev == configured) return;
    cudaMemPool_t pool = nullptr;
    cuda_check(cudaDeviceGetDefaultMemPool(&pool, dev), "cudaDeviceGetDefaultMemPool");
    std::uint64_t keep = ~std::uint64_t{0};
    cuda_check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
    configured = dev;
  }
#else
  static void* raw_allocate(std::size_t bytes) noexcept { return std::aligned_alloc(64, bytes); }
  static void raw_free(void* p) noexcept { std::free(p); }
  [[noreturn]] static void throw_out_of_memory(std::size_t) { throw std::bad_alloc(); }
#endif

  static DeviceBlockCache& local() {
    thread_local DeviceBlockCache cache;
    return cache;
  }
  // Set when this thread's cache is destroyed at thread exit (trivially destructible, so a block freed later
  // still sees it and goes straight back to the device).
  static bool& destroyed() noexcept {
    thread_local bool d = false;
    return d;
  }

  std::unordered_multimap<Key, void*, KeyHash> free_;
  std::size_t cached_ = 0;
};

}  // namespace detail

// Uninitialised storage, as for host tensors, through this thread's DeviceBlockCache.
template <>
struct SpaceAllocator<DeviceSpace> {
  template <class T>
  static std::shared_ptr<T[]> allocate(std::size_t n) {
    std::size_t const bytes = n * sizeof(T);
    if (bytes == 0) return {};
    int const device = detail::DeviceBlockCache::current_device();
    return std::shared_ptr<T[]>(static_cast<T*>(detail::DeviceBlockCache::allocate(bytes)),
                                [bytes, device](T* q) { detail::DeviceBlockCache::deallocate(q, bytes, device); });
  }
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
