// FinalizeWatchdog: bounds a call that may never return (MPI_Finalize, see MpiSessionOptions). While one is
// alive, a thread wakes every `period`; if the guarded call has not finished by then (the watchdog is still
// alive), it asks `on_timeout`, which acts and returns true, or returns false to wait another period.
// Destruction disarms it and joins the thread. A zero period arms nothing.
//
// thread_blocked_in_read(tid, fd): whether thread tid of this process is blocked in read(2) on fd now, from
// /proc (Linux; false elsewhere). MpiSession uses it to tell a rank still closing its connections from one
// that finished and waits in the launcher's barrier (a read on $PMI_FD).
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace ddp::detail {

class FinalizeWatchdog {
 public:
  FinalizeWatchdog(std::chrono::milliseconds period, std::function<bool()> on_timeout) {
    if (period <= std::chrono::milliseconds::zero()) return;
    thread_ = std::thread([this, period, act = std::move(on_timeout)] {
      std::unique_lock lock(mutex_);
      while (!cv_.wait_for(lock, period, [this] { return done_; })) {
        lock.unlock();
        if (act()) return;
        lock.lock();
      }
    });
  }
  FinalizeWatchdog(FinalizeWatchdog const&) = delete;
  FinalizeWatchdog& operator=(FinalizeWatchdog const&) = delete;
  ~FinalizeWatchdog() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

inline bool thread_blocked_in_read([[maybe_unused]] long tid, [[maybe_unused]] int fd) {
#if defined(__linux__) && defined(SYS_read)
  // /proc/self/task/<tid>/syscall: "<number> <arg1> ..." while blocked in a system call, else "running" or -1.
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/syscall");
  long number = -1;
  std::string first_arg;
  if (!(in >> number >> first_arg) || number != SYS_read) return false;
  return std::strtol(first_arg.c_str(), nullptr, 16) == fd;
#else
  return false;
#endif
}

inline long this_thread_id() noexcept {
#if defined(__linux__) && defined(SYS_gettid)
  return static_cast<long>(::syscall(SYS_gettid));
#else
  return -1;
#endif
}

}  // namespace ddp::detail
