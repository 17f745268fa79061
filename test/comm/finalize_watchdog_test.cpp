// ddp/comm/mpi/finalize_watchdog.hpp: what bounds MpiSession's MPI_Finalize.
#include "ddp/comm/mpi/finalize_watchdog.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

using ddp::detail::FinalizeWatchdog;
using namespace std::chrono_literals;

namespace {
template <class Pred>
bool eventually(Pred pred) {
  auto const deadline = std::chrono::steady_clock::now() + 10s;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}
}  // namespace

TEST_CASE("FinalizeWatchdog: acts when the guarded call outlives the period, and asks again while told to wait") {
  std::atomic<int> asked{0};
  {
    FinalizeWatchdog watchdog(5ms, [&] { return asked.fetch_add(1) + 1 >= 3; });  // waits twice, then acts
    CHECK(eventually([&] { return asked.load() >= 3; }));
    std::this_thread::sleep_for(30ms);
  }
  CHECK(asked.load() == 3);  // once it acted, it stopped
}

TEST_CASE("FinalizeWatchdog: a call that returns in time disarms it") {
  std::atomic<int> asked{0};
  auto const start = std::chrono::steady_clock::now();
  {
    FinalizeWatchdog watchdog(10s, [&] {
      asked.fetch_add(1);
      return true;
    });
  }
  CHECK(std::chrono::steady_clock::now() - start < 5s);  // destruction wakes the thread, never waits it out
  CHECK(asked.load() == 0);
}

TEST_CASE("FinalizeWatchdog: a zero period arms nothing") {
  std::atomic<int> asked{0};
  {
    FinalizeWatchdog watchdog(0ms, [&] {
      asked.fetch_add(1);
      return true;
    });
    std::this_thread::sleep_for(20ms);
  }
  CHECK(asked.load() == 0);
}

TEST_CASE("thread_blocked_in_read: true only for the thread's own fd while it waits in read(2)") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  std::atomic<long> tid{-1};
  std::thread reader([&] {
    tid.store(ddp::detail::this_thread_id());
    char c = 0;
    CHECK(::read(fds[0], &c, 1) == 1);
  });
  CHECK(eventually([&] { return tid.load() > 0 && ddp::detail::thread_blocked_in_read(tid.load(), fds[0]); }));
  CHECK_FALSE(ddp::detail::thread_blocked_in_read(tid.load(), fds[1]));
  CHECK_FALSE(ddp::detail::thread_blocked_in_read(ddp::detail::this_thread_id(), fds[0]));  // this one runs
  CHECK(::write(fds[1], "x", 1) == 1);
  reader.join();
  ::close(fds[0]);
  ::close(fds[1]);
}
