// bench/comm/core_pingpong: the round trip of one cache line between two cores (two threads pinned to CPUs A
// and B bounce a counter), the number that tells whether two ranks' cores share a cache. On this project's VM
// it reads ~55 ns (one L3 domain) or ~350 ns (two), switching from minute to minute as the hypervisor moves the
// vCPUs, and MpiBackend's shared-window all-reduce with plain stores follows it (bench/RESULTS.md).
//   bazel-bin/bench/comm/core_pingpong [CPU_A CPU_B]      (default 0 1)
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace {

bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

alignas(64) std::atomic<long> line{0};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 1 && argc != 3) {
    std::fprintf(stderr, "usage: core_pingpong [CPU_A CPU_B]\n");
    return 2;
  }
  int a = 0, b = 1;
  try {
    if (argc == 3) a = std::stoi(argv[1]), b = std::stoi(argv[2]);
  } catch (std::exception const&) {
    std::fprintf(stderr, "core_pingpong: CPU_A and CPU_B must be CPU numbers, got '%s' '%s'\n", argv[1], argv[2]);
    return 2;
  }
  int const cpus = static_cast<int>(std::thread::hardware_concurrency());
  if (a < 0 || b < 0 || a >= cpus || b >= cpus || a == b) {
    std::fprintf(stderr, "core_pingpong: CPU_A and CPU_B must be two different CPUs of 0..%d, got %d and %d\n",
                 cpus - 1, a, b);
    return 2;
  }
  constexpr long kRounds = 200000;
  bool pinned_b = false;
  std::thread other([&] {
    pinned_b = pin(b);
    for (long i = 0; i < kRounds; ++i) {
      while (line.load(std::memory_order_acquire) != 2 * i + 1) {}
      line.store(2 * i + 2, std::memory_order_release);
    }
  });
  if (!pin(a)) std::fprintf(stderr, "core_pingpong: cannot pin to CPU %d (timing unpinned)\n", a);
  auto const t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < kRounds; ++i) {
    line.store(2 * i + 1, std::memory_order_release);
    while (line.load(std::memory_order_acquire) != 2 * i + 2) {}
  }
  auto const t1 = std::chrono::steady_clock::now();
  other.join();
  if (!pinned_b) std::fprintf(stderr, "core_pingpong: cannot pin to CPU %d (timing unpinned)\n", b);
  std::printf("CPUs %d and %d: cache-line round trip %.1f ns\n", a, b,
              std::chrono::duration<double, std::nano>(t1 - t0).count() / kRounds);
}
