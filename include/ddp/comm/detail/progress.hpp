// A per-rank progress thread: a bounded single-producer queue of trivially copyable collective requests,
// executed strictly in issue order, with allocation-free completion handles (ddp::Work).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/comm/detail/wait.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/error.hpp"

namespace ddp::detail {

using QueueWork = ::ddp::Work;  // the handle ProgressQueue::submit returns

// Runs Exec(request) for each submitted request on one lazily started thread, in submission order.
// submit()/drain() are called by the owning rank's thread only (single producer).
template <class Request, class Exec>
class ProgressQueue : public CompletionState {
  static_assert(std::is_trivially_copyable_v<Request>, "requests are copied into a fixed ring");

 public:
  ProgressQueue(std::size_t capacity, WaitPolicy policy, Exec exec)
      : ring_(std::max<std::size_t>(capacity, 1)), policy_(policy), exec_(std::move(exec)) {}
  ProgressQueue(ProgressQueue const&) = delete;
  ProgressQueue& operator=(ProgressQueue const&) = delete;

  ~ProgressQueue() { stop(); }

  // Runs what is queued, then ends the thread (a later submit() starts a new one).
  void stop() {
    if (!worker_.joinable()) return;
    stop_.store(true, std::memory_order_seq_cst);
    work_notifier_.notify_all();
    worker_.join();
    stop_.store(false, std::memory_order_relaxed);
  }

  // Enqueues and returns the request's handle; blocks only while `capacity` requests are in flight.
  Work submit(Request const& r) {
    if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
    std::uint64_t const seq = tail_ + 1;
    if (seq - done_.load(std::memory_order_acquire) > ring_.size()) {
      done_notifier_.wait([&] { return seq - done_.load(std::memory_order_acquire) <= ring_.size(); }, policy_);
    }
    ring_[(seq - 1) % ring_.size()] = r;
    tail_ = seq;
    published_.store(seq, std::memory_order_seq_cst);
    work_notifier_.notify();
    return Work(this, seq, policy_);
  }

  // Waits for everything submitted so far; rethrows the first error.
  void drain() const {
    if (tail_ != 0) wait(tail_, policy_);
  }
  bool idle() const noexcept { return done(tail_); }
  std::uint64_t issued() const noexcept { return tail_; }

 private:
  void run() {
    std::uint64_t next = done_.load(std::memory_order_acquire) + 1;
    // The idle worker sleeps quickly: it shares the cores with the rank's compute.
    WaitPolicy idle = policy_;
    idle.spin = std::min(idle.spin, std::chrono::nanoseconds(std::chrono::microseconds(5)));
    for (;;) {
      work_notifier_.wait(
          [&] { return published_.load(std::memory_order_acquire) >= next || stop_.load(std::memory_order_acquire); },
          idle);
      if (published_.load(std::memory_order_acquire) < next) return;  // stopped and nothing left
      Request const r = ring_[(next - 1) % ring_.size()];
      if (!failed()) {
        try {
          exec_(r);
        } catch (...) {
          fail(next, std::current_exception());
        }
      }
      complete(next);
      ++next;
    }
  }

  std::vector<Request> ring_;
  WaitPolicy policy_;
  Exec exec_;
  std::uint64_t tail_ = 0;  // owner thread only
  alignas(64) std::atomic<std::uint64_t> published_{0};
  std::atomic<bool> stop_{false};
  Notifier work_notifier_;
  std::thread worker_;
};

}  // namespace ddp::detail
