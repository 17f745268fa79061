// ddp::Work: the allocation-free handle of an asynchronous collective on a queue-based backend (threads,
// MPI), and the completion state it reads.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <limits>
#include <utility>

#include "ddp/comm/detail/wait.hpp"

namespace ddp {

namespace detail {

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

}  // namespace detail

// The handle all_reduce_async returns for queue-based backends (threads, MPI): a few words, no allocation.
// Valid while its backend lives. wait() may be called any number of times, from the issuing thread.
class Work {
 public:
  Work() = default;
  Work(detail::CompletionState const* state, std::uint64_t seq, detail::WaitPolicy policy) noexcept
      : state_(state), seq_(seq), policy_(policy) {}
  // Blocks until this collective (and every one issued before it on this rank) finished; rethrows its error.
  void wait() const {
    if (state_ != nullptr) state_->wait(seq_, policy_);
  }
  // True once finished (successfully or not); wait() then returns or throws without blocking.
  bool test() const noexcept { return state_ == nullptr || state_->done(seq_); }
  std::uint64_t sequence() const noexcept { return seq_; }

 private:
  detail::CompletionState const* state_ = nullptr;
  std::uint64_t seq_ = 0;
  detail::WaitPolicy policy_{};
};

}  // namespace ddp
