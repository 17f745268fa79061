// The per-thread block cache: a large block freed on a thread is handed back to the next request of
// the same size on that thread (no fresh pages, no page faults); small blocks and other sizes are not;
// blocks outliving their thread's cache go back to free().
#include <doctest/doctest.h>

#include <cstdint>
#include <thread>

#include "ddp/tensor/host_allocator.hpp"
#include "ddp/tensor/tensor.hpp"

using ddp::detail::HostBlockCache;

TEST_CASE("a freed large block is reused by the next allocation of its size on the same thread") {
  std::size_t const big = std::size_t{1} << 20;
  void* a = HostBlockCache::allocate(big);
  REQUIRE(a != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(a) % HostBlockCache::kAlign == 0);
  HostBlockCache::deallocate(a, big);
  void* b = HostBlockCache::allocate(big);
  CHECK(b == a);
  // A different size is not served from that block.
  void* c = HostBlockCache::allocate(big + 4096);
  CHECK(c != b);
  HostBlockCache::deallocate(c, big + 4096);
  HostBlockCache::deallocate(b, big);
}

TEST_CASE("tensor storage is recycled across steps") {
  void const* first = nullptr;
  {
    ddp::Tensor<float> t(ddp::Shape{64, 64, 24, 24});
    first = t.data();
  }
  ddp::Tensor<float> again(ddp::Shape{64, 64, 24, 24});
  CHECK(static_cast<void const*>(again.data()) == first);
}

TEST_CASE("each thread has its own cache; a block freed on another thread joins that thread's cache") {
  std::size_t const big = std::size_t{1} << 19;
  void* mine = HostBlockCache::allocate(big);
  void* theirs = nullptr;
  std::thread t([&] {
    HostBlockCache::deallocate(mine, big);   // joins the worker's cache
    theirs = HostBlockCache::allocate(big);  // and is handed back there
  });
  t.join();
  CHECK(theirs == mine);
  // The worker's cache is gone with the thread; this block is returned to free() by whoever frees it.
  HostBlockCache::deallocate(theirs, big);
}
