// Spin-then-block waiting: a futex-backed event count, so waits are fast when the peer is running and cheap
// when it is not (oversubscribed ranks, idle progress threads).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "ddp/comm/detail/futex.hpp"

namespace ddp::detail {

using Clock = std::chrono::steady_clock;

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// How long a waiter burns the CPU before it sleeps. Spinning wins when every waiter has its own core
// (latency ~100 ns instead of ~5 us for a futex wake); with more threads than cores it only steals time
// from the thread being waited for, so `spin` should then be ~0 and a few yields do the work.
struct WaitPolicy {
  std::chrono::nanoseconds spin{std::chrono::microseconds(20)};
  int yields = 8;
  // Longest single sleep; a safety net only (wakeups are explicit).
  std::chrono::nanoseconds max_sleep{std::chrono::milliseconds(50)};
};

// A deadline that may be "never" without overflowing time arithmetic.
inline Clock::time_point deadline_after(std::chrono::nanoseconds timeout) noexcept {
  auto const now = Clock::now();
  if (timeout.count() <= 0 || timeout >= std::chrono::hours(24 * 365)) return Clock::time_point::max();
  return now + timeout;
}

// Event count: waiters sleep on `epoch_` only after announcing themselves in `sleepers_`, and notifiers
// touch the shared words only when someone sleeps. Correctness (no lost wakeup) needs the state change a
// predicate reads to be a seq_cst store/RMW made before notify(), which every caller in ddp does.
class Notifier {
 public:
  void notify() noexcept {
    if (sleepers_.load(std::memory_order_seq_cst) != 0) notify_all();
  }
  void notify_all() noexcept {
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(epoch_);
  }

  // Returns true once pred() holds, false if `deadline` passed first (pred() re-checked at the end).
  template <class Pred>
  bool wait(Pred&& pred, WaitPolicy const& policy, Clock::time_point deadline = Clock::time_point::max()) {
    if (pred()) return true;
    if (policy.spin.count() > 0) {
      // Pure spinning for the first microsecond or two, then spinning with sched_yield: if the thread we
      // wait for shares our core (another process took the other one), yielding lets it run now instead of
      // after our spin budget; if it does not, a yield is a ~0.2 us no-op syscall.
      auto const start = Clock::now();
      auto const pure_end = start + std::min(policy.spin, std::chrono::nanoseconds(std::chrono::microseconds(2)));
      auto const spin_end = start + policy.spin;
      for (std::uint32_t i = 1;; ++i) {
        if (pred()) return true;
        if ((i & 31u) == 0 && Clock::now() >= pure_end) break;
        cpu_relax();
      }
      while (Clock::now() < spin_end) {
        if (pred()) return true;
        std::this_thread::yield();
      }
    }
    for (int i = 0; i < policy.yields; ++i) {
      if (pred()) return true;
      std::this_thread::yield();
    }
    for (;;) {
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      std::uint32_t const epoch = epoch_.load(std::memory_order_seq_cst);
      if (pred()) {
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
        return true;
      }
      auto const now = Clock::now();
      if (now >= deadline) {
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
        return pred();
      }
      auto sleep = policy.max_sleep;
      if (deadline != Clock::time_point::max()) {
        sleep = std::min(sleep, std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now));
      }
      futex_wait(epoch_, epoch, sleep);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
  }

 private:
  alignas(64) std::atomic<std::uint32_t> epoch_{0};
  std::atomic<std::uint32_t> sleepers_{0};
};

}  // namespace ddp::detail
