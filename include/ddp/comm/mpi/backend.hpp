// MpiBackend: collectives over MPI (MPICH), blocking ones on the caller's thread and async all-reduces on a
// per-rank progress thread, in issue order. Include explicitly and depend on //:ddp_mpi.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/detail/front_end.hpp"
#include "ddp/comm/detail/progress.hpp"
#include "ddp/comm/detail/reduce.hpp"
#include "ddp/comm/env.hpp"
#include "ddp/comm/mpi/node.hpp"
#include "ddp/comm/mpi/session.hpp"
#include "ddp/comm/mpi/types.hpp"
#include "ddp/comm/mpi/watch.hpp"
#include "ddp/comm/trace.hpp"
#include "ddp/comm/watch.hpp"
#include "ddp/error.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp {

struct MpiOptions {
  // The ranks taking part; the backend works on its own duplicate, so its collectives never match the
  // user's on this communicator.
  MPI_Comm comm = MPI_COMM_WORLD;
  // Async collectives in flight before all_reduce_async blocks.
  std::size_t queue_capacity = 1024;
  // Each collective's deadline and stall warning (default: $DDP_TIMEOUT seconds, else 10 minutes).
  TimeoutOptions timeout{};
  // Unset: $DDP_DEBUG=DETAIL selects kEvery, else kOnStall.
  std::optional<CollectiveChecks> checks{};
  // How all_reduce combines the ranks of one node (default: a shared-memory window, hierarchical across nodes).
  MpiNodeOptions node{};
  TraceOptions trace{};
};

// all_reduce, by default: ranks that share a node reduce through an MPI-3 shared window (each reduces one
// slice of every rank's data, in rank order), and across nodes the slices' owners all-reduce them over MPI
// (MpiNodeOptions; detail::NodeAllReduce). The other collectives, and all-reduces across nodes up to
// MpiNodeOptions::small_bytes, are the MPI library's. Guarantees: every rank gets the same bits, and the
// same inputs give the same bits for a fixed layout of ranks on nodes (and MPICH's algorithms are
// deterministic for a fixed world size and message size). kAvg costs one extra pass over the buffer. Thread safety: one thread at a time issues this backend's collectives.
// No hangs: every collective is nonblocking MPI under a deadline (MpiOptions::timeout); one that waits too
// long warns, then throws a CommError naming itself (operation, sequence number, tag) and the ranks that did
// not arrive, or both sides when ranks diverged. The backend is then unusable, and the job must end:
// mpi_main and MpiSession's destructor call MPI_Abort.
class MpiBackend : public detail::CollectiveFrontEnd<MpiBackend> {
 public:
  using accepted_spaces = SpaceList<HostSpace>;
  static constexpr std::string_view backend_name = "mpi";  // for logs: which backend was composed
  using work_type = Work;

  // Collective over opts.comm: every rank of it constructs its backend (MPI_Comm_dup).
  explicit MpiBackend(MpiSession const& session, MpiOptions const& opts = {})
      : CollectiveFrontEnd(opts.trace),
        session_(&session),
        checks_(detail::resolve(opts.checks)),
        queue_(opts.queue_capacity, idle_policy(), detail::AllReduceExecutor<MpiBackend>{this}) {
    detail::Deadlines deadlines = detail::resolve(opts.timeout, backend_name);
    check(MPI_Comm_dup(opts.comm, &comm_), "MPI_Comm_dup", {});
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &n_);
    watch_ = std::make_unique<detail::MpiWatch>(comm_, std::move(deadlines), backend_name);
    if (opts.node.all_reduce == NodeAllReduce::kSharedMemory && n_ > 1) {
      node_ = std::make_unique<detail::NodeAllReduce>(comm_, opts.node, *watch_, half_ops_);
    }
    gradient_storage_ = opts.node.gradient_storage;
    ranks_per_node_ = opts.node.ranks_per_node;
  }
  MpiBackend(MpiBackend const&) = delete;
  MpiBackend& operator=(MpiBackend const&) = delete;
  ~MpiBackend() {
    try {
      queue_.drain();
    } catch (...) {  // already reported by the Work handles
    }
    queue_.stop();
    // A collective still pending on comm_, or an exception on its way to mpi_main's MPI_Abort while the peers
    // wait in a collective: freeing the window (collective) would wait for them forever. Leave it to the abort.
    if (broken_.load() || std::uncaught_exceptions() > unwinding_at_start_) {
      if (node_) node_->abandon();
      watch_->abandon();
      return;
    }
    node_.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && node_group_ != MPI_COMM_NULL) MPI_Comm_free(&node_group_);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return n_; }
  // The job's ranks sharing this rank's node, and so its CPUs (MpiSession::local_size: MPI_COMM_TYPE_SHARED).
  int ranks_on_node() const noexcept { return session_->local_size(); }
  MpiSession const& session() const noexcept { return *session_; }
  MPI_Comm comm() const noexcept { return comm_; }
  CollectiveChecks checks() const noexcept { return checks_; }
  // The deadline each collective runs under (resolved from MpiOptions::timeout and $DDP_TIMEOUT).
  std::chrono::nanoseconds timeout() const noexcept { return watch_->deadlines().timeout; }
  // How all_reduce runs: "1 node x 4 ranks (shared memory)", "2 nodes x 2 ranks (shared memory, striped MPI
  // across nodes)", or "MPI_Iallreduce over 4 ranks".
  std::string layout() const {
    return node_ ? node_->layout() : detail::cat("MPI_Iallreduce over ", n_, n_ == 1 ? " rank" : " ranks");
  }

  // The collectives come from CollectiveFrontEnd; all_reduce_async runs MPI_Allreduce on this rank's
  // progress thread, in issue order. Below: the transport.

  // Memory for `numel` elements that all_reduce can reduce in place: with the shared-memory path and
  // MpiNodeOptions::gradient_storage = kShared (the default), a block of a shared window at the same place on
  // every rank of a node, so an all-reduce of any slice of it (the same slice on every rank) moves no bytes
  // into or out of the window (across nodes: in the hierarchical all-reduce's node phase); with one rank per
  // node, or otherwise, ordinary private memory. DistributedDataParallel keeps its gradients
  // here. Collective: every rank calls it, in the same order, with the same numel. A block stays with this
  // backend: once no tensor views it on any rank (DDP and the model's parameters gone), a later call reuses it.
  template <class T>
  Tensor<T, HostSpace> gradient_storage(std::int64_t numel) {
    if (numel < 0) throw ArgumentError(detail::cat("MpiBackend::gradient_storage: numel must be >= 0, got ", numel));
    if (node_ && gradient_storage_ == GradientStorage::kShared) {
      auto [block, lease] = node_->shared_block(static_cast<std::size_t>(numel) * sizeof(T));
      if (block != nullptr) return Tensor<T, HostSpace>::view(std::move(lease), static_cast<T*>(block), Shape{numel});
    }
    return Tensor<T, HostSpace>(Shape{numel});
  }
  // Whether gradient_storage gives shared memory that all_reduce reduces in place (the shared-memory path with
  // more than one rank on a node, kShared).
  bool gradients_in_place() const noexcept {
    return node_ && node_->reduces_in_place() && gradient_storage_ == GradientStorage::kShared;
  }

  // Waits for every async collective issued so far; rethrows the first error.
  void synchronize() { queue_.drain(); }

  // Node groups (NodeCommunicator): this rank's node is MpiNodeOptions::ranks_per_node consecutive ranks, or else
  // the ranks that share its memory (MPI_COMM_TYPE_SHARED). node_all_reduce all-reduces among them only, over a
  // communicator of the node (made at the first call, collectively; MPICH moves it through shared memory), under
  // the same deadline as every collective.
  int ranks_per_node() const noexcept {
    return ranks_per_node_ > 0 ? std::min(ranks_per_node_, n_) : session_->local_size();
  }
  template <class T>
  void node_all_reduce(std::span<T> buf, ReduceOp op, CollectiveTag tag = {}) {
    enter(CollectiveKind::kAllReduce, tag);
    if (node_group_ == MPI_COMM_NULL) {
      int const rc = ranks_per_node_ > 0
                         ? MPI_Comm_split(comm_, rank_ / ranks_per_node_, rank_, &node_group_)
                         : MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_group_);
      check(rc, "MPI_Comm_split (node group)", tag);
      MPI_Comm_set_errhandler(node_group_, MPI_ERRORS_RETURN);
      MPI_Comm_size(node_group_, &node_n_);
    }
    auto const call = record(CollectiveKind::kAllReduce, buf.size(), dtype_of<T>, op, -1, tag);
    std::size_t off = 0;
    do {  // as in run_all_reduce
      std::size_t const m = std::min(kMaxChunk, buf.size() - off);
      run(call, "node all_reduce", tag, [&](MPI_Request* r) {
        return MPI_Iallreduce(MPI_IN_PLACE, buf.data() + off, static_cast<int>(m), detail::mpi_type<T>(),
                              half_ops_.op<T>(op), node_group_, r);
      });
      off += m;
    } while (off < buf.size());
    if (op == ReduceOp::kAvg) detail::average(buf.data(), buf.size(), node_n_);
  }

 private:
  friend class detail::CollectiveFrontEnd<MpiBackend>;
  friend struct detail::AllReduceExecutor<MpiBackend>;

  static constexpr std::size_t kMaxChunk = INT_MAX / 64 * 64;  // MPI-3 counts are int

  template <class S>
  static constexpr void check_space() {
    static_assert(std::same_as<typename S::space, HostSpace>,
                  "MpiBackend takes host memory, but this buffer is a DeviceSpan (device memory): name a staging "
                  "adapter, HostStaging<MpiBackend> from ddp/comm/host_staging.hpp, which copies through host "
                  "memory; or copy it into a host buffer (HostSpan / std::vector); or use NcclBackend from "
                  "ddp/comm/nccl.hpp for device buffers");
  }

  // MPICH's blocking calls busy-poll; the idle progress thread itself sleeps after a short spin.
  static detail::WaitPolicy idle_policy() noexcept {
    return detail::WaitPolicy{.spin = std::chrono::microseconds(10), .yields = 4};
  }

  detail::AllReduceQueue<MpiBackend>& progress_queue() noexcept { return queue_; }

  // Blocking collectives wait for queued async work, so the communicator runs one collective at a time.
  void enter(CollectiveKind kind, CollectiveTag tag) {
    if (!queue_.idle()) queue_.drain();
    if (broken_.load(std::memory_order_acquire)) {
      throw CommError(detail::cat("ddp mpi: ", name(kind), detail::tag_suffix(tag), " on rank ", rank_, " of ", n_,
                                  ": an earlier collective of this backend failed; it is out of step with its peers "
                                  "and cannot be used (end the job: mpi_main does)"),
                      rank_);
    }
  }

  // Starts one nonblocking collective (start(&request) returns its MPI code) and waits for it under the
  // deadline. With CollectiveChecks::kEvery the ranks first compare the call. A failure marks the backend
  // broken and the session failed (so it aborts instead of finalizing).
  template <class Start>
  void run(detail::CallRecord const& call, char const* op, CollectiveTag tag, Start&& start) {
    try {
      MPI_Request req = MPI_REQUEST_NULL;
      check(start(&req), op, tag);
      watch_->wait(req, call);
    } catch (...) {
      broken_.store(true, std::memory_order_release);
      session_->note_failure();
      throw;
    }
  }

  detail::CallRecord record(CollectiveKind kind, std::size_t count, Dtype dt, ReduceOp op, int root,
                            CollectiveTag tag) {
    auto const call = detail::CallRecord::make(++calls_, kind, count, dt, op, root, tag);
    if (checks_ == CollectiveChecks::kEvery && n_ > 1) verify(call);
    return call;
  }

  // kEvery: the ranks agree on a digest of the call (max of d and of -d: equal exactly when every rank's d
  // is the same), and on a mismatch gather the calls and raise the same error on every rank.
  void verify(detail::CallRecord const& call) {
    std::int64_t d[2] = {call.digest(), -call.digest()};
    run(call, "collective check", {},
        [&](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, d, 2, MPI_INT64_T, MPI_MAX, comm_, r); });
    if (d[0] == -d[1]) return;
    std::vector<detail::CallRecord> all(static_cast<std::size_t>(n_));
    run(call, "collective check", {}, [&](MPI_Request* r) {
      return MPI_Iallgather(&call, sizeof call, MPI_BYTE, all.data(), sizeof call, MPI_BYTE, comm_, r);
    });
    std::string sides;
    std::vector<char> told(all.size(), 0);
    for (std::size_t k = 0; k < all.size(); ++k) {
      if (told[k]) continue;
      std::vector<int> same;
      for (std::size_t j = k; j < all.size(); ++j) {
        if (!told[j] && all[j].same_call(all[k])) {
          told[j] = 1;
          same.push_back(static_cast<int>(j));
        }
      }
      sides += detail::cat(sides.empty() ? "" : "; ", detail::rank_list(same), " issued ", detail::describe(all[k]));
    }
    broken_.store(true, std::memory_order_release);
    session_->note_failure();
    throw CommError(detail::cat("ddp mpi: collective mismatch at #", call.seq, " (seen by rank ", rank_, " of ", n_,
                                "): ", sides, "; every rank must issue the same collectives in the same order"),
                    rank_);
  }

  template <class T>
  void run_all_reduce(HostSpan<T> buf, ReduceOp op, CollectiveTag tag) {
    auto const call = record(CollectiveKind::kAllReduce, buf.size(), dtype_of<T>, op, -1, tag);
    if (node_ && node_->takes(buf.size_bytes())) {
      try {
        node_->all_reduce(buf.data(), buf.size(), op, call);
      } catch (...) {
        broken_.store(true, std::memory_order_release);
        session_->note_failure();
        throw;
      }
      return;
    }
    std::size_t off = 0;
    do {  // MPI counts are int: chunk, and still call once for an empty buffer
      std::size_t const m = std::min(kMaxChunk, buf.size() - off);
      run(call, "all_reduce", tag, [&](MPI_Request* r) {
        return MPI_Iallreduce(MPI_IN_PLACE, buf.data() + off, static_cast<int>(m), detail::mpi_type<T>(),
                              half_ops_.op<T>(op), comm_, r);
      });
      off += m;
    } while (off < buf.size());
    if (op == ReduceOp::kAvg) detail::average(buf.data(), buf.size(), n_);
  }

  template <class T>
  void run_broadcast(HostSpan<T> buf, int root, CollectiveTag tag) {
    auto const call = record(CollectiveKind::kBroadcast, buf.size(), dtype_of<T>, ReduceOp::kSum, root, tag);
    std::size_t off = 0;
    do {  // as in run_all_reduce
      std::size_t const m = std::min(kMaxChunk, buf.size() - off);
      run(call, "broadcast", tag, [&](MPI_Request* r) {
        return MPI_Ibcast(buf.data() + off, static_cast<int>(m), detail::mpi_type<T>(), root, comm_, r);
      });
      off += m;
    } while (off < buf.size());
  }

  template <class T>
  void run_all_gather(HostSpan<T const> src, HostSpan<T> dst, CollectiveTag tag) {
    int const m = block(src.size(), CollectiveKind::kAllGather);
    auto const call = record(CollectiveKind::kAllGather, src.size(), dtype_of<T>, ReduceOp::kSum, -1, tag);
    void const* send = src.data() == dst.data() + static_cast<std::size_t>(rank_) * src.size() && m > 0
                           ? MPI_IN_PLACE
                           : static_cast<void const*>(src.data());
    run(call, "all_gather", tag, [&](MPI_Request* r) {
      return MPI_Iallgather(send, m, detail::mpi_type<T>(), dst.data(), m, detail::mpi_type<T>(), comm_, r);
    });
  }

  template <class T>
  void run_reduce_scatter(HostSpan<T const> src, HostSpan<T> dst, ReduceOp op, CollectiveTag tag) {
    int const m = block(dst.size(), CollectiveKind::kReduceScatter);
    auto const call = record(CollectiveKind::kReduceScatter, src.size(), dtype_of<T>, op, -1, tag);
    run(call, "reduce_scatter", tag, [&](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(src.data(), dst.data(), m, detail::mpi_type<T>(), half_ops_.op<T>(op), comm_, r);
    });
    if (op == ReduceOp::kAvg) detail::average(dst.data(), dst.size(), n_);
  }

  template <class T>
  void run_gather(HostSpan<T const> src, HostSpan<T> dst, int root, CollectiveTag tag) {
    int const m = block(src.size(), CollectiveKind::kGather);
    auto const call = record(CollectiveKind::kGather, src.size(), dtype_of<T>, ReduceOp::kSum, root, tag);
    bool const in_place =
        rank_ == root && m > 0 && src.data() == dst.data() + static_cast<std::size_t>(root) * src.size();
    run(call, "gather", tag, [&](MPI_Request* r) {
      return MPI_Igather(in_place ? MPI_IN_PLACE : static_cast<void const*>(src.data()), m, detail::mpi_type<T>(),
                         dst.data(), m, detail::mpi_type<T>(), root, comm_, r);
    });
  }

  template <class T>
  void run_scatter(HostSpan<T const> src, HostSpan<T> dst, int root, CollectiveTag tag) {
    int const m = block(dst.size(), CollectiveKind::kScatter);
    auto const call = record(CollectiveKind::kScatter, dst.size(), dtype_of<T>, ReduceOp::kSum, root, tag);
    bool const in_place =
        rank_ == root && m > 0 && dst.data() == src.data() + static_cast<std::size_t>(root) * dst.size();
    run(call, "scatter", tag, [&](MPI_Request* r) {
      return MPI_Iscatter(src.data(), m, detail::mpi_type<T>(),
                          in_place ? MPI_IN_PLACE : static_cast<void*>(dst.data()), m, detail::mpi_type<T>(), root,
                          comm_, r);
    });
  }

  void run_barrier(CollectiveTag tag) {
    auto const call = record(CollectiveKind::kBarrier, 0, Dtype::kInt32, ReduceOp::kSum, -1, tag);
    run(call, "barrier", tag, [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
  }

  void check(int rc, char const* op, CollectiveTag tag) const {
    if (rc == MPI_SUCCESS) return;
    throw CommError(detail::cat("ddp mpi: ", op, detail::tag_suffix(tag), " on rank ", rank_, " of ", n_,
                                " failed: ", detail::mpi_error_string(rc)),
                    rank_);
  }
  // MPI counts are int: a block (the per-rank part of a gather/scatter-like call) must fit.
  int block(std::size_t m, CollectiveKind kind) const {
    if (m > static_cast<std::size_t>(INT_MAX)) {
      throw ArgumentError(detail::cat("ddp mpi: ", name(kind), " on rank ", rank_, ": block of ", m,
                                      " elements exceeds MPI's int count; split the call"));
    }
    return static_cast<int>(m);
  }

  MpiSession const* session_;
  CollectiveChecks checks_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int n_ = 1;
  int ranks_per_node_ = 0;               // MpiNodeOptions::ranks_per_node
  MPI_Comm node_group_ = MPI_COMM_NULL;  // node_all_reduce's communicator, made at its first call
  int node_n_ = 1;
  std::uint64_t calls_ = 0;  // collectives issued (their sequence numbers); touched by one thread at a time
  std::atomic<bool> broken_{false};
  int unwinding_at_start_ = std::uncaught_exceptions();  // more in the destructor: destroyed by unwinding
  std::unique_ptr<detail::MpiWatch> watch_;
  detail::MpiHalfOps half_ops_;                                  // bfloat16/float16 reductions (before node_)
  std::unique_ptr<detail::NodeAllReduce> node_;                  // null: every all_reduce is MPI_Iallreduce on comm_
  GradientStorage gradient_storage_ = GradientStorage::kShared;  // MpiNodeOptions::gradient_storage
  detail::AllReduceQueue<MpiBackend> queue_;
};

static_assert(Communicator<MpiBackend>);
static_assert(AsyncCommunicator<MpiBackend>);
static_assert(NodeCommunicator<MpiBackend>);

}  // namespace ddp
