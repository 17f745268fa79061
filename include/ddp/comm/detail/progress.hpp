// A per-rank progress thread: a bounded single-producer queue of trivially copyable collective requests,
// executed strictly in issue order, with allocation-free completion handles (QueueWork).
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
#include "ddp/error.hpp"

namespace ddp::detail {

// Completion state shared by a queue and its handles. Sequence numbers start at 1; `done_` counts
// finished requests (failed ones included). After the first failure every later request fails with the
// same error: a backend whose collective failed is no longer in step with its peers.
class CompletionState {
 public:
  bool done(std::uint64_t seq) const noexcept { return done_.load(std::memory_order_acquire) >= seq; }

  // Blocks until request `seq` finished; rethrows its error.
  void wait(std::uint64_t seq, WaitPolicy const& policy) const {
    if (!done(seq)) done_notifier_.wait([&] { return done(seq); }, policy);
    if (failed_from_.load(std::memory_order_acquire) <= seq) std::rethrow_exception(error_);
  }

 protected:
  void complete(std::uint64_t seq) noexcept {
    done_.store(seq, std::memory_order_seq_cst);
    done_notifier_.notify();
  }
  // Called by the worker before complete(seq) for the first failed request.
  void fail(std::uint64_t seq, std::exception_ptr e) noexcept {
    error_ = std::move(e);
    failed_from_.store(seq, std::memory_order_release);
  }
  bool failed() const noexcept {
    return failed_from_.load(std::memory_order_relaxed) != std::numeric_limits<std::uint64_t>::max();
  }

  alignas(64) std::atomic<std::uint64_t> done_{0};
  std::atomic<std::uint64_t> failed_from_{std::numeric_limits<std::uint64_t>::max()};
  std::exception_ptr error_;
  mutable Notifier done_notifier_;
};

// The handle all_reduce_async returns for queue-based backends (threads, MPI): two words, no allocation.
// Valid while its backend lives. wait() may be called any number of times, from the issuing thread.
class QueueWork {
 public:
  QueueWork() = default;
  QueueWork(CompletionState const* state, std::uint64_t seq, WaitPolicy policy) noexcept
      : state_(state), seq_(seq), policy_(policy) {}
  // Blocks until this collective (and every one issued before it on this rank) finished; rethrows its error.
  void wait() const {
    if (state_ != nullptr) state_->wait(seq_, policy_);
  }
  // True once finished (successfully or not); wait() then returns or throws without blocking.
  bool test() const noexcept { return state_ == nullptr || state_->done(seq_); }
  std::uint64_t sequence() const noexcept { return seq_; }

 private:
  CompletionState const* state_ = nullptr;
  std::uint64_t seq_ = 0;
  WaitPolicy policy_{};
};

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
  QueueWork submit(Request const& r) {
    if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
    std::uint64_t const seq = tail_ + 1;
    if (seq - done_.load(std::memory_order_acquire) > ring_.size()) {
      done_notifier_.wait([&] { return seq - done_.load(std::memory_order_acquire) <= ring_.size(); }, policy_);
    }
    ring_[(seq - 1) % ring_.size()] = r;
    tail_ = seq;
    published_.store(seq, std::memory_order_seq_cst);
    work_notifier_.notify();
    return QueueWork(this, seq, policy_);
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
          [&] {
            return published_.load(std::memory_order_acquire) >= next || stop_.load(std::memory_order_acquire);
          },
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
