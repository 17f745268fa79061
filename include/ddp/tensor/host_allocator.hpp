// Host memory for tensors: small blocks from malloc; large blocks (>= 64 KiB) recycled through a
// per-thread cache so a training step reuses last step's activations instead of mmap/munmap + page faults.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <unordered_map>

namespace ddp::detail {

// Exact-size free lists, one cache per thread (each rank of the threads backend is a thread, so ranks
// never contend). A block freed on another thread joins that thread's cache. At most kMaxCachedBytes are
// held per thread; the rest goes back to malloc. Blocks are 64-byte aligned.
class HostBlockCache {
 public:
  static constexpr std::size_t kMinBytes = std::size_t{1} << 16;
  static constexpr std::size_t kMaxCachedBytes = std::size_t{512} << 20;
  static constexpr std::size_t kAlign = 64;

  HostBlockCache() = default;
  ~HostBlockCache() {
    destroyed() = true;
    for (auto& [bytes, p] : free_) std::free(p);
  }
  HostBlockCache(HostBlockCache const&) = delete;
  HostBlockCache& operator=(HostBlockCache const&) = delete;

  static void* allocate(std::size_t bytes) {
    std::size_t const rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (rounded >= kMinBytes && !destroyed()) {
      auto& c = local();
      if (auto it = c.free_.find(rounded); it != c.free_.end()) {
        void* p = it->second;
        c.free_.erase(it);
        c.cached_ -= rounded;
        return p;
      }
    }
    void* p = std::aligned_alloc(kAlign, rounded ? rounded : kAlign);
    if (!p) throw std::bad_alloc();
    return p;
  }
  static void deallocate(void* p, std::size_t bytes) noexcept {
    std::size_t const rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (rounded >= kMinBytes && !destroyed()) {
      auto& c = local();
      if (c.cached_ + rounded <= kMaxCachedBytes) {
        try {
          c.free_.emplace(rounded, p);
          c.cached_ += rounded;
          return;
        } catch (...) {}
      }
    }
    std::free(p);
  }

 private:
  static HostBlockCache& local() {
    thread_local HostBlockCache cache;
    return cache;
  }
  // Set when this thread's cache is destroyed at thread exit; trivially destructible, so a block freed
  // later (by another thread-local's destructor) still sees it and goes straight back to free().
  static bool& destroyed() noexcept {
    thread_local bool d = false;
    return d;
  }

  std::unordered_multimap<std::size_t, void*> free_;
  std::size_t cached_ = 0;
};

// Scratch memory from the cache, freed on scope exit (e.g. im2col columns, reused across images and steps).
template <class T>
class HostBuffer {
 public:
  explicit HostBuffer(std::size_t n) : n_(n), p_(static_cast<T*>(HostBlockCache::allocate(n * sizeof(T)))) {}
  ~HostBuffer() { HostBlockCache::deallocate(p_, n_ * sizeof(T)); }
  HostBuffer(HostBuffer const&) = delete;
  HostBuffer& operator=(HostBuffer const&) = delete;
  T* data() noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

 private:
  std::size_t n_;
  T* p_;
};

}  // namespace ddp::detail
