// The DDP hot path allocates nothing: after warm-up, async all-reduces of bucket slices of a flat arena
// (plus blocking all-reduces and broadcasts, small and large) make zero heap allocations on any thread.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <span>
#include <vector>

#include "ddp/comm/threads.hpp"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};
}  // namespace

// Counting replacements of the global allocation functions (this test binary only).
void* operator new(std::size_t size) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return ::operator new(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

TEST_CASE("async bucket all-reduces and blocking collectives allocate nothing after warm-up") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    g_allocations.store(0);
    ddp::spawn(n, [](ddp::ThreadsBackend& comm) {
      std::vector<float> arena(1 << 18, 1.0f);
      std::vector<std::size_t> const edges = {0, 1000, 70000, 200000, arena.size()};
      std::vector<ddp::Work> works(edges.size() - 1);
      auto step = [&] {
        for (std::size_t b = 0; b + 1 < edges.size(); ++b) {
          works[b] = comm.all_reduce_async(std::span(arena).subspan(edges[b], edges[b + 1] - edges[b]),
                                           ddp::ReduceOp::kAvg, {"bucket", static_cast<std::int64_t>(b)});
        }
        for (auto& w : works) w.wait();
        comm.all_reduce(std::span(arena).first(7), ddp::ReduceOp::kMax);
        comm.broadcast(std::span(arena).first(50000), 0);
      };
      step();  // warm-up: starts the progress thread
      comm.barrier();
      if (comm.rank() == 0) g_counting.store(true);
      comm.barrier();
      for (int i = 0; i < 20; ++i) step();
      comm.barrier();
      if (comm.rank() == 0) g_counting.store(false);
      comm.barrier();
    });
    CHECK(g_allocations.load() == 0);
  }
}
