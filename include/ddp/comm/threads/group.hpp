// The shared state of an in-process rank group: per-rank arrival slots and publications, staging buffers,
// the group-wide failure record, and the barrier every ThreadsBackend collective is built from.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/detail/wait.hpp"
#include "ddp/comm/peer_status.hpp"
#include "ddp/comm/trace.hpp"
#include "ddp/comm/watch.hpp"
#include "ddp/error.hpp"

namespace ddp {

// ThreadsBackend settings; ThreadsOptions{.timeout = {.after = 30s}}.
struct ThreadsOptions {
  // A collective that waits longer than this for its peers fails on every rank, naming the operation, its
  // sequence number and the ranks that did not arrive; a stall warning comes first (see TimeoutOptions).
  TimeoutOptions timeout{};
  // Busy-wait before sleeping; negative: 20 us when every rank has a core, 0 when oversubscribed.
  std::chrono::nanoseconds spin{-1};
  // all_reduce / broadcast up to this many bytes go through per-rank staging with a single barrier.
  std::size_t small_bytes = 32 * 1024;
  // Async collectives in flight per rank before all_reduce_async blocks.
  std::size_t queue_capacity = 1024;
  TraceOptions trace{};
  // Node groups (node_all_reduce: hierarchical averaging, LocalSgdOptions::node_period). 0: the ranks are one node
  // (threads of one process). k > 0: consecutive groups of k ranks count as nodes, to study a cluster's layout in
  // one process; k must divide the world size.
  int ranks_per_node = 0;
};

namespace detail {

// What a rank announces when it arrives at a collective; peers read it after the barrier.
struct Publication {
  CollectiveKind kind = CollectiveKind::kBarrier;
  Dtype dtype = Dtype::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = -1;
  std::size_t count = 0;
  void* out = nullptr;
  void const* in = nullptr;
  CollectiveTag tag{};
};

struct alignas(64) RankSlot {
  std::atomic<std::uint64_t> arrived{0};  // number of barriers this rank has reached
  std::atomic<bool> departed{false};      // its backend was destroyed
  // Double-buffered by barrier parity: a rank rewrites pub[s % 2] at barrier s + 2 only after every peer
  // has reached barrier s + 1, i.e. finished reading it.
  Publication pub[2];
};

class ThreadsGroup {
 public:
  ThreadsGroup(int world_size, ThreadsOptions const& opts)
      : n_(checked_world_size(world_size)),
        opts_(checked_nodes(opts, world_size)),
        deadlines_(resolve(opts.timeout, "threads")),
        slots_(new RankSlot[static_cast<std::size_t>(world_size)]),
        staging_bytes_((std::max<std::size_t>(opts.small_bytes, 64) + 63) / 64 * 64),
        staging_(static_cast<std::byte*>(
            ::operator new (staging_bytes_ * 2 * static_cast<std::size_t>(world_size), std::align_val_t{64}))) {
    unsigned const cores = std::max(1u, std::thread::hardware_concurrency());
    policy_.spin = opts.spin.count() >= 0 ? opts.spin
                   : static_cast<unsigned>(world_size) <= cores
                       ? std::chrono::nanoseconds(std::chrono::microseconds(20))
                       : std::chrono::nanoseconds(0);
    policy_.yields = static_cast<unsigned>(world_size) <= cores ? 4 : 16;
  }
  ThreadsGroup(ThreadsGroup const&) = delete;
  ThreadsGroup& operator=(ThreadsGroup const&) = delete;
  static ThreadsOptions const& checked_nodes(ThreadsOptions const& opts, int world_size) {
    if (opts.ranks_per_node < 0 || (opts.ranks_per_node > 0 && world_size % opts.ranks_per_node != 0))
      throw ArgumentError(cat("ThreadsOptions::ranks_per_node must be 0 or divide the world size (", world_size,
                              "), got ", opts.ranks_per_node));
    return opts;
  }
  ~ThreadsGroup() { ::operator delete (staging_, std::align_val_t{64}); }

  int world_size() const noexcept { return n_; }
  ThreadsOptions const& options() const noexcept { return opts_; }
  WaitPolicy const& policy() const noexcept { return policy_; }
  RankSlot& slot(int r) noexcept { return slots_[static_cast<std::size_t>(r)]; }
  std::byte* staging(int r, std::uint64_t seq) noexcept {
    return staging_ + (static_cast<std::size_t>(r) * 2 + (seq & 1)) * staging_bytes_;
  }
  std::size_t staging_bytes() const noexcept { return staging_bytes_; }

  // Rank `rank` failed with `what` (spawn: it threw): records it (PeerStatus kFailed) as the first failure, and
  // wakes every waiter; later calls keep the first cause.
  void abort(int rank, std::string const& what) {
    peers_.note({.rank = rank, .state = PeerState::kFailed, .seen_by = rank, .reason = what});
    fail(rank, what);
  }
  // What the group has learned of ranks that left, stalled or failed (ThreadsBackend::peer_failures).
  PeerLog const& peers() const noexcept { return peers_; }

  int failed_rank() const noexcept { return failed_rank_.load(std::memory_order_acquire); }
  std::string failure() const {
    std::lock_guard lock(failure_mutex_);
    return failure_;
  }

  void depart(int rank) noexcept {
    try {
      peers_.note({.rank = rank, .state = PeerState::kLeft, .seen_by = rank, .reason = "its backend was destroyed"});
    } catch (...) {  // out of memory: the departure itself still counts
    }
    slot(rank).departed.store(true, std::memory_order_seq_cst);
    notifier_.notify();
  }

  // The error a rank raises when the group has failed.
  CommError failure_error(int rank, CollectiveKind kind, CollectiveTag tag) const {
    int const f = failed_rank();
    return CommError(detail::cat("ddp threads: ", name(kind), tag_suffix(tag), " on rank ", rank,
                                 " aborted because rank ", f, " failed: ", failure()),
                     f);
  }

  // Arrives at barrier `seq` (the rank's own count, 1-based) of collective number `op` and waits for every
  // peer. Throws CommError when the group failed, a peer left, or the timeout passed (the latter two also
  // fail the group). Past the warning point it reports the ranks still missing, once.
  void arrive_and_wait(int rank, std::uint64_t seq, CollectiveKind kind, CollectiveTag tag, std::uint64_t op) {
    slot(rank).arrived.store(seq, std::memory_order_seq_cst);
    notifier_.notify();
    if (all_arrived(seq) && failed_rank_.load(std::memory_order_relaxed) < 0) return;
    auto const start = Clock::now();
    auto const done = [&] {
      return failed_rank_.load(std::memory_order_acquire) >= 0 || all_arrived(seq) || any_left(seq);
    };
    if (deadlines_.warn.count() > 0 && !notifier_.wait(done, policy_, start + deadlines_.warn)) {
      deadlines_.warn_stall(stall_warning("threads", cat(name(kind), " #", op, tag_suffix(tag)), rank, n_, deadlines_,
                                          cat(" for ", rank_list(missing(seq)))));
    }
    notifier_.wait(done, policy_, start + deadlines_.timeout);
    // Every peer arrived: this collective completed, even if a peer failed right after leaving it.
    if (all_arrived(seq)) return;
    if (failed_rank() >= 0) throw failure_error(rank, kind, tag);
    std::string gone;
    for (int k : missing(seq)) {
      if (slot(k).departed.load(std::memory_order_acquire)) gone += detail::cat(gone.empty() ? "" : ", ", k);
    }
    std::string const what =
        detail::cat("ddp threads: ", name(kind), " #", op, tag_suffix(tag), " on rank ", rank, " of ", n_);
    if (gone.empty())  // the ranks that departed noted themselves (depart)
      for (int k : missing(seq))
        peers_.note({.rank = k,
                     .state = PeerState::kStalled,
                     .seen_by = rank,
                     .seq = op,
                     .reason = cat("did not arrive within ", seconds_text(deadlines_.timeout))});
    std::string const msg =
        !gone.empty()
            ? detail::cat(what, " cannot complete: ranks that will never arrive: ", gone,
                          " (left: their backend was destroyed); every rank must issue the same collectives")
            : detail::cat(what, " timed out after ", seconds_text(deadlines_.timeout), ": ", rank_list(missing(seq)),
                          " did not arrive; raise the timeout (ThreadsOptions::timeout, $", kTimeoutEnvVar,
                          ") if they are just slow");
    fail(rank, msg);
    throw CommError(msg, rank);
  }

  static int checked_world_size(int n) {
    if (n < 1) throw ArgumentError(detail::cat("ddp threads: world_size must be >= 1, got ", n));
    return n;
  }

 private:
  // Records the first failure (for failure_error) and wakes every waiter; later calls keep the first cause.
  void fail(int rank, std::string const& what) {
    {
      std::lock_guard lock(failure_mutex_);
      if (failed_rank_.load(std::memory_order_relaxed) >= 0) return;
      failure_ = what;
      failed_rank_.store(rank, std::memory_order_seq_cst);
    }
    notifier_.notify_all();
  }

  bool all_arrived(std::uint64_t seq) const noexcept {
    for (int k = 0; k < n_; ++k) {
      if (slots_[static_cast<std::size_t>(k)].arrived.load(std::memory_order_acquire) < seq) return false;
    }
    return true;
  }
  std::vector<int> missing(std::uint64_t seq) const {
    std::vector<int> m;
    for (int k = 0; k < n_; ++k) {
      if (slots_[static_cast<std::size_t>(k)].arrived.load(std::memory_order_acquire) < seq) m.push_back(k);
    }
    return m;
  }
  bool any_left(std::uint64_t seq) const noexcept {
    for (int k = 0; k < n_; ++k) {
      auto const& s = slots_[static_cast<std::size_t>(k)];
      if (s.arrived.load(std::memory_order_acquire) < seq && s.departed.load(std::memory_order_acquire)) return true;
    }
    return false;
  }

  int n_;
  ThreadsOptions opts_;
  Deadlines deadlines_;
  WaitPolicy policy_{};
  std::unique_ptr<RankSlot[]> slots_;
  std::size_t staging_bytes_;
  std::byte* staging_;
  alignas(64) std::atomic<int> failed_rank_{-1};
  mutable std::mutex failure_mutex_;
  PeerLog peers_;
  std::string failure_;
  Notifier notifier_;
};

}  // namespace detail
}  // namespace ddp
