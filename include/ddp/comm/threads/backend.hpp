// ThreadsBackend: n ranks as n threads of one process, collectives over shared memory; ddp::spawn runs them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/detail/describe.hpp"
#include "ddp/comm/detail/front_end.hpp"
#include "ddp/comm/detail/progress.hpp"
#include "ddp/comm/detail/reduce.hpp"
#include "ddp/comm/threads/group.hpp"
#include "ddp/comm/trace.hpp"
#include "ddp/error.hpp"

namespace ddp {

// One rank of an in-process group. Algorithms (no rank-0 bottleneck, no allocation per call):
//   all_reduce > small_bytes: publish pointers, barrier, each rank reduces its 64-byte-aligned slice of all
//     buffers and writes the result into every buffer (reduce-scatter and all-gather in one pass), barrier.
//   all_reduce / broadcast <= small_bytes: copy into this rank's staging buffer, one barrier, read.
// Results are bitwise identical on every rank and deterministic run to run (ranks are combined in rank
// order). Thread safety: one thread at a time issues a rank's collectives (its async work runs on the
// rank's progress thread). Buffers of different ranks must not overlap.
class ThreadsBackend : public detail::CollectiveFrontEnd<ThreadsBackend> {
 public:
  // Host memory, and device memory where the host can touch it (Thrust's CPU device systems): the transport
  // is plain loads, stores and memcpy between threads of one process.
  using accepted_spaces = HostAccessibleSpaces;
  static constexpr std::string_view backend_name = "threads";  // for logs: which backend was composed
  // Every rank is a thread of one process: a pointer one rank publishes is valid on all (SharedAddressSpace).
  static constexpr bool shares_address_space = true;
  using work_type = Work;

  ThreadsBackend(std::shared_ptr<detail::ThreadsGroup> group, int rank)
      : CollectiveFrontEnd(group->options().trace),
        group_(std::move(group)),
        rank_(rank),
        n_(group_->world_size()),
        ptrs_(std::vector<float*>(n_), std::vector<double*>(n_), std::vector<std::int32_t*>(n_),
              std::vector<std::int64_t*>(n_), std::vector<bfloat16*>(n_), std::vector<float16*>(n_)),
        queue_(group_->options().queue_capacity, group_->policy(), detail::AllReduceExecutor<ThreadsBackend>{this}) {
    if (rank < 0 || rank >= n_) {
      throw ArgumentError(detail::cat("ThreadsBackend: rank ", rank, " is outside the group of ", n_));
    }
  }
  ThreadsBackend(ThreadsBackend const&) = delete;
  ThreadsBackend& operator=(ThreadsBackend const&) = delete;
  // Finishes this rank's async work, then tells peers this rank is gone (a peer still waiting for it fails
  // at once instead of at its timeout).
  ~ThreadsBackend() {
    try {
      queue_.drain();
    } catch (...) {  // already reported by the Work handles
    }
    group_->depart(rank_);
  }

  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return n_; }
  // The ranks sharing this rank's CPUs: all of them, threads of one process.
  int ranks_on_node() const noexcept { return n_; }

  // The peers this rank knows to have left (their backend destroyed), stalled past the timeout or failed (thrown in
  // spawn), the first cause first (ObservesPeers; the group's record, the same on every rank).
  std::vector<PeerStatus> peer_failures() const {
    auto all = group_->peers().all();
    std::erase_if(all, [this](PeerStatus const& s) { return s.rank == rank_; });
    return all;
  }

  // Node groups (NodeCommunicator): every rank is one node unless ThreadsOptions::ranks_per_node cuts the group into
  // consecutive nodes of that many ranks. node_all_reduce all-reduces among this rank's node only (all-gathered in
  // process, then combined in rank order: every rank of the node gets the same bits).
  int ranks_per_node() const noexcept {
    int const k = group_->options().ranks_per_node;
    return k > 0 ? k : n_;
  }
  template <class T>
  void node_all_reduce(std::span<T> buf, ReduceOp op, CollectiveTag tag = {}) {
    int const k = ranks_per_node();
    if (k == n_) return this->all_reduce(buf, op, tag);
    std::vector<T> all(buf.size() * static_cast<std::size_t>(n_));
    this->all_gather(std::span<T const>(buf.data(), buf.size()), std::span<T>(all), tag);
    std::vector<T const*> srcs;
    for (int j = rank_ / k * k; j < rank_ / k * k + k; ++j) srcs.push_back(all.data() + j * buf.size());
    T* const dst = buf.data();
    detail::reduce_blocks(srcs.data(), k, &dst, 1, buf.size(), op);
  }

  // The collectives (all_reduce, all_reduce_async, broadcast, all_gather, reduce_scatter, gather, scatter,
  // barrier) come from CollectiveFrontEnd; all_reduce_async queues on this rank's progress thread (no
  // allocation). Below: the transport.

  // Waits for every async collective issued so far; rethrows the first error.
  void synchronize() { queue_.drain(); }

  detail::ThreadsGroup& group() noexcept { return *group_; }

 private:
  friend class detail::CollectiveFrontEnd<ThreadsBackend>;
  friend struct detail::AllReduceExecutor<ThreadsBackend>;

  template <class S>
  static constexpr void check_space() {
    static_assert(host_accessible_v<typename S::space>,
                  "ThreadsBackend takes host memory, but this buffer is a DeviceSpan (device memory the host cannot "
                  "touch: CUDA, or <ddp/tensor/device.hpp> not included): copy it into a host buffer (HostSpan / "
                  "std::vector), use Thrust's CPU device system (//:ddp_device_cpu), or use NcclBackend from "
                  "ddp/comm/nccl.hpp for device buffers");
  }

  detail::AllReduceQueue<ThreadsBackend>& progress_queue() noexcept { return queue_; }

  template <class T>
  void run_all_reduce(HostSpan<T> buf, ReduceOp op, CollectiveTag tag) {
    if (n_ == 1) {
      if (group_->failed_rank() >= 0) throw group_->failure_error(rank_, CollectiveKind::kAllReduce, tag);
      return;  // sum, avg, max and min of one rank are the identity
    }
    T* data = buf.data();
    std::size_t const count = buf.size();
    std::size_t const bytes = count * sizeof(T);
    bool const small = bytes <= group_->staging_bytes();
    std::uint64_t const seq =
        publish(detail::Publication{CollectiveKind::kAllReduce, dtype_of<T>, op, -1, count, data, nullptr, tag});
    if (small && bytes != 0) std::memcpy(group_->staging(rank_, seq), data, bytes);
    arrive(seq, CollectiveKind::kAllReduce, tag);
    auto& ptrs = pointers<T>();
    if (small) {
      for (int k = 0; k < n_; ++k) ptrs[k] = reinterpret_cast<T*>(group_->staging(k, seq));
      detail::reduce_blocks<T>(ptrs.data(), n_, &data, 1, count, op);
      return;
    }
    auto const [lo, hi] = slice(count, sizeof(T));
    for (int k = 0; k < n_; ++k) ptrs[k] = static_cast<T*>(peer(k, seq).out) + lo;
    detail::reduce_blocks<T>(ptrs.data(), n_, ptrs.data(), n_, hi - lo, op);
    arrive(++seq_, CollectiveKind::kAllReduce, tag);
  }

  template <class T>
  void run_broadcast(HostSpan<T> buf, int root, CollectiveTag tag) {
    if (n_ == 1) return;
    T* const data = buf.data();
    std::size_t const count = buf.size();
    std::size_t const bytes = count * sizeof(T);
    bool const small = bytes <= group_->staging_bytes();
    std::uint64_t const seq = publish(
        detail::Publication{CollectiveKind::kBroadcast, dtype_of<T>, ReduceOp::kSum, root, count, data, nullptr, tag});
    if (small && rank_ == root && bytes != 0) std::memcpy(group_->staging(rank_, seq), data, bytes);
    arrive(seq, CollectiveKind::kBroadcast, tag);
    if (small) {
      if (rank_ != root && bytes != 0) std::memcpy(data, group_->staging(root, seq), bytes);
      return;
    }
    auto const [lo, hi] = slice(count, sizeof(T));
    T const* const src = static_cast<T const*>(peer(root, seq).out);
    for (int k = 0; k < n_; ++k) {
      if (k != root && hi > lo) std::memcpy(static_cast<T*>(peer(k, seq).out) + lo, src + lo, (hi - lo) * sizeof(T));
    }
    arrive(++seq_, CollectiveKind::kBroadcast, tag);
  }

  template <class T>
  void run_all_gather(HostSpan<T const> src, HostSpan<T> dst, CollectiveTag tag) {
    std::size_t const m = src.size();
    std::uint64_t const seq = publish(detail::Publication{CollectiveKind::kAllGather, dtype_of<T>, ReduceOp::kSum, -1,
                                                          m, dst.data(), src.data(), tag});
    arrive(seq, CollectiveKind::kAllGather, tag);
    for (int k = 0; k < n_; ++k) copy(dst.data() + k * m, static_cast<T const*>(peer(k, seq).in), m);
    arrive(++seq_, CollectiveKind::kAllGather, tag);
  }

  template <class T>
  void run_reduce_scatter(HostSpan<T const> src, HostSpan<T> dst, ReduceOp op, CollectiveTag tag) {
    std::size_t const m = dst.size();
    std::uint64_t const seq = publish(
        detail::Publication{CollectiveKind::kReduceScatter, dtype_of<T>, op, -1, m, dst.data(), src.data(), tag});
    arrive(seq, CollectiveKind::kReduceScatter, tag);
    auto& srcs = pointers<T>();
    for (int k = 0; k < n_; ++k) srcs[k] = const_cast<T*>(static_cast<T const*>(peer(k, seq).in)) + rank_ * m;
    T* const d = dst.data();
    detail::reduce_blocks<T>(srcs.data(), n_, &d, 1, m, op);
    arrive(++seq_, CollectiveKind::kReduceScatter, tag);
  }

  template <class T>
  void run_gather(HostSpan<T const> src, HostSpan<T> dst, int root, CollectiveTag tag) {
    std::size_t const m = src.size();
    std::uint64_t const seq = publish(detail::Publication{CollectiveKind::kGather, dtype_of<T>, ReduceOp::kSum, root, m,
                                                          dst.data(), src.data(), tag});
    arrive(seq, CollectiveKind::kGather, tag);
    copy(static_cast<T*>(peer(root, seq).out) + rank_ * m, src.data(), m);
    arrive(++seq_, CollectiveKind::kGather, tag);
  }

  template <class T>
  void run_scatter(HostSpan<T const> src, HostSpan<T> dst, int root, CollectiveTag tag) {
    std::size_t const m = dst.size();
    std::uint64_t const seq = publish(detail::Publication{CollectiveKind::kScatter, dtype_of<T>, ReduceOp::kSum, root,
                                                          m, dst.data(), src.data(), tag});
    arrive(seq, CollectiveKind::kScatter, tag);
    copy(dst.data(), static_cast<T const*>(peer(root, seq).in) + rank_ * m, m);
    arrive(++seq_, CollectiveKind::kScatter, tag);
  }

  void run_barrier(CollectiveTag tag) {
    std::uint64_t const seq = publish(
        detail::Publication{CollectiveKind::kBarrier, Dtype::kInt32, ReduceOp::kSum, -1, 0, nullptr, nullptr, tag});
    arrive(seq, CollectiveKind::kBarrier, tag);
  }

  // Announces this rank's next collective in the slot for its next barrier; returns that barrier's number.
  std::uint64_t publish(detail::Publication const& p) {
    ++ops_;
    std::uint64_t const seq = ++seq_;
    group_->slot(rank_).pub[seq & 1] = p;
    published_ = seq;
    return seq;
  }

  // The first barrier of a collective (seq from publish()) also checks that every peer issued the same one;
  // the closing barrier (++seq_) only waits, so peers have finished with this rank's buffers.
  void arrive(std::uint64_t seq, CollectiveKind kind, CollectiveTag tag) {
    group_->arrive_and_wait(rank_, seq, kind, tag, ops_);
    if (published_ == seq) verify(seq);
  }

  detail::Publication const& peer(int k, std::uint64_t seq) noexcept { return group_->slot(k).pub[seq & 1]; }

  // After a barrier: every peer must have issued the same collective (kind, dtype, count, op, root).
  void verify(std::uint64_t seq) {
    detail::Publication const& me = peer(rank_, seq);
    for (int k = 0; k < n_; ++k) {
      detail::Publication const& p = peer(k, seq);
      bool const reduces = me.kind == CollectiveKind::kAllReduce || me.kind == CollectiveKind::kReduceScatter;
      if (p.kind == me.kind && p.tag.label == me.tag.label && p.tag.id == me.tag.id &&
          (me.kind == CollectiveKind::kBarrier ||
           (p.dtype == me.dtype && p.count == me.count && p.root == me.root && (!reduces || p.op == me.op)))) {
        continue;
      }
      std::string const msg = detail::cat("ddp threads: collective mismatch at collective #", ops_, ": rank ", rank_,
                                          " issued ", describe(me), " but rank ", k, " issued ", describe(p),
                                          "; every rank must issue the same collectives in the same order");
      group_->abort(rank_, msg);
      throw CommError(msg, k);
    }
  }

  static std::string describe(detail::Publication const& p) {
    return detail::cat(name(p.kind), "(count=", p.count, ", ", name(p.dtype),
                       p.kind == CollectiveKind::kAllReduce || p.kind == CollectiveKind::kReduceScatter
                           ? detail::cat(", ", name(p.op))
                           : std::string(),
                       p.root >= 0 ? detail::cat(", root=", p.root) : std::string(), ")", detail::tag_suffix(p.tag));
  }

  // Before a blocking collective: let queued async work finish (so collectives stay in issue order) and
  // fail fast when the group already failed.
  void enter(CollectiveKind kind, CollectiveTag tag) {
    if (!queue_.idle()) queue_.drain();
    if (group_->failed_rank() >= 0) throw group_->failure_error(rank_, kind, tag);
  }

  // This rank's share [lo, hi) of count elements: equal parts rounded up to whole 64-byte lines, so no
  // two ranks write the same cache line.
  std::pair<std::size_t, std::size_t> slice(std::size_t count, std::size_t elem) const noexcept {
    std::size_t const line = 64 / elem;
    std::size_t per = (count + static_cast<std::size_t>(n_) - 1) / static_cast<std::size_t>(n_);
    per = (per + line - 1) / line * line;
    std::size_t const lo = std::min(count, static_cast<std::size_t>(rank_) * per);
    return {lo, std::min(count, lo + per)};
  }

  template <class T>
  static void copy(T* dst, T const* src, std::size_t m) noexcept {
    if (m != 0 && dst != src) std::memcpy(dst, src, m * sizeof(T));
  }

  template <class T>
  std::vector<T*>& pointers() noexcept {
    return std::get<std::vector<T*>>(ptrs_);
  }

  std::shared_ptr<detail::ThreadsGroup> group_;
  int rank_;
  int n_;
  std::uint64_t ops_ = 0;        // collectives this rank has issued (their sequence numbers, from 1)
  std::uint64_t seq_ = 0;        // barriers this rank has entered
  std::uint64_t published_ = 0;  // the barrier whose publication slot was written last
  std::tuple<std::vector<float*>, std::vector<double*>, std::vector<std::int32_t*>, std::vector<std::int64_t*>,
             std::vector<bfloat16*>, std::vector<float16*>>
      ptrs_;
  detail::AllReduceQueue<ThreadsBackend> queue_;
};

static_assert(Communicator<ThreadsBackend>);
static_assert(AsyncCommunicator<ThreadsBackend>);
static_assert(ObservesPeers<ThreadsBackend>);
static_assert(NodeCommunicator<ThreadsBackend>);

// A fresh group of n in-process ranks; make one ThreadsBackend(group, r) per rank thread.
inline std::shared_ptr<detail::ThreadsGroup> make_threads_group(int world_size, ThreadsOptions const& opts = {}) {
  return std::make_shared<detail::ThreadsGroup>(world_size, opts);
}

// Runs fn(ThreadsBackend&) as ranks 0..n-1 (rank 0 on the calling thread) and returns when all finish.
// If a rank throws, the group fails: every other rank's pending and later collectives throw a CommError
// naming it, and spawn rethrows the first rank's original exception once all threads have ended.
template <class F>
requires std::invocable<F&, ThreadsBackend&>
void spawn(int world_size, F&& fn, ThreadsOptions const& opts = {}) {
  auto group = make_threads_group(world_size, opts);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world_size));
  auto body = [&](int r) {
    try {
      ThreadsBackend comm(group, r);
      try {
        fn(comm);
      } catch (...) {  // fail the group before comm's destructor reports this rank as gone
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        group->abort(r, detail::describe(errors[static_cast<std::size_t>(r)]));
      }
    } catch (...) {
      errors[static_cast<std::size_t>(r)] = std::current_exception();
      group->abort(r, detail::describe(errors[static_cast<std::size_t>(r)]));
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size - 1));
  for (int r = 1; r < world_size; ++r) threads.emplace_back(body, r);
  body(0);
  for (auto& t : threads) t.join();
  int const failed = group->failed_rank();
  if (failed >= 0 && errors[static_cast<std::size_t>(failed)])
    std::rethrow_exception(errors[static_cast<std::size_t>(failed)]);
  for (auto const& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace ddp
