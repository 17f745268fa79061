// MpiBackend: collectives over MPI (MPICH), blocking ones on the caller's thread and async all-reduces on a
// per-rank progress thread, in issue order. Include explicitly and depend on //:ddp_mpi.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/detail/front_end.hpp"
#include "ddp/comm/detail/progress.hpp"
#include "ddp/comm/detail/reduce.hpp"
#include "ddp/comm/env.hpp"
#include "ddp/comm/mpi_session.hpp"
#include "ddp/comm/trace.hpp"
#include "ddp/error.hpp"

namespace ddp {

struct MpiOptions {
  // The ranks taking part; the backend works on its own duplicate, so its collectives never match the
  // user's on this communicator.
  MPI_Comm comm = MPI_COMM_WORLD;
  // Async collectives in flight before all_reduce_async blocks.
  std::size_t queue_capacity = 1024;
  TraceOptions trace{};
};

namespace detail {
template <CommElement T>
inline MPI_Datatype mpi_type() noexcept {
  if constexpr (std::same_as<T, float>)
    return MPI_FLOAT;
  else if constexpr (std::same_as<T, double>)
    return MPI_DOUBLE;
  else if constexpr (std::same_as<T, std::int32_t>)
    return MPI_INT32_T;
  else
    return MPI_INT64_T;
}
inline MPI_Op mpi_op(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
    default:
      return MPI_SUM;  // kAvg: sum, then one scaling pass (MPI has no average)
  }
}
}  // namespace detail

// Guarantees: the results of MPI_Allreduce on the same inputs (MPICH's algorithms are deterministic for a
// fixed world size and message size, and give every rank the same bits). kAvg costs one extra pass over
// the buffer after the sum. Thread safety: one thread at a time issues this backend's collectives.
class MpiBackend : public detail::CollectiveFrontEnd<MpiBackend> {
 public:
  using accepted_spaces = SpaceList<HostSpace>;
  static constexpr std::string_view backend_name = "mpi";  // for logs: which backend was composed
  using work_type = Work;

  // Collective over opts.comm: every rank of it constructs its backend (MPI_Comm_dup).
  explicit MpiBackend(MpiSession const& session, MpiOptions const& opts = {})
      : CollectiveFrontEnd(opts.trace),
        session_(&session),
        queue_(opts.queue_capacity, idle_policy(), detail::AllReduceExecutor<MpiBackend>{this}) {
    check(MPI_Comm_dup(opts.comm, &comm_), "MPI_Comm_dup", {});
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &n_);
  }
  MpiBackend(MpiBackend const&) = delete;
  MpiBackend& operator=(MpiBackend const&) = delete;
  ~MpiBackend() {
    try {
      queue_.drain();
    } catch (...) {  // already reported by the Work handles
    }
    queue_.stop();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return n_; }
  MpiSession const& session() const noexcept { return *session_; }
  MPI_Comm comm() const noexcept { return comm_; }

  // The collectives come from CollectiveFrontEnd; all_reduce_async runs MPI_Allreduce on this rank's
  // progress thread, in issue order. Below: the transport.

  // Waits for every async collective issued so far; rethrows the first error.
  void synchronize() { queue_.drain(); }

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
  void enter(CollectiveKind, CollectiveTag) {
    if (!queue_.idle()) queue_.drain();
  }

  template <class T>
  void run_all_reduce(HostSpan<T> buf, ReduceOp op, CollectiveTag tag) {
    std::size_t off = 0;
    do {  // MPI counts are int: chunk, and still call once for an empty buffer
      std::size_t const m = std::min(kMaxChunk, buf.size() - off);
      check(MPI_Allreduce(MPI_IN_PLACE, buf.data() + off, static_cast<int>(m), detail::mpi_type<T>(),
                          detail::mpi_op(op), comm_),
            "all_reduce", tag);
      off += m;
    } while (off < buf.size());
    if (op == ReduceOp::kAvg) detail::average(buf.data(), buf.size(), n_);
  }

  template <class T>
  void run_broadcast(HostSpan<T> buf, int root, CollectiveTag tag) {
    std::size_t off = 0;
    do {  // as in run_all_reduce
      std::size_t const m = std::min(kMaxChunk, buf.size() - off);
      check(MPI_Bcast(buf.data() + off, static_cast<int>(m), detail::mpi_type<T>(), root, comm_), "broadcast", tag);
      off += m;
    } while (off < buf.size());
  }

  template <class T>
  void run_all_gather(HostSpan<T const> src, HostSpan<T> dst, CollectiveTag tag) {
    int const m = block(src.size(), CollectiveKind::kAllGather);
    void const* send = src.data() == dst.data() + static_cast<std::size_t>(rank_) * src.size() && m > 0
                           ? MPI_IN_PLACE
                           : static_cast<void const*>(src.data());
    check(MPI_Allgather(send, m, detail::mpi_type<T>(), dst.data(), m, detail::mpi_type<T>(), comm_), "all_gather",
          tag);
  }

  template <class T>
  void run_reduce_scatter(HostSpan<T const> src, HostSpan<T> dst, ReduceOp op, CollectiveTag tag) {
    int const m = block(dst.size(), CollectiveKind::kReduceScatter);
    check(MPI_Reduce_scatter_block(src.data(), dst.data(), m, detail::mpi_type<T>(), detail::mpi_op(op), comm_),
          "reduce_scatter", tag);
    if (op == ReduceOp::kAvg) detail::average(dst.data(), dst.size(), n_);
  }

  template <class T>
  void run_gather(HostSpan<T const> src, HostSpan<T> dst, int root, CollectiveTag tag) {
    int const m = block(src.size(), CollectiveKind::kGather);
    bool const in_place =
        rank_ == root && m > 0 && src.data() == dst.data() + static_cast<std::size_t>(root) * src.size();
    check(MPI_Gather(in_place ? MPI_IN_PLACE : static_cast<void const*>(src.data()), m, detail::mpi_type<T>(),
                     dst.data(), m, detail::mpi_type<T>(), root, comm_),
          "gather", tag);
  }

  template <class T>
  void run_scatter(HostSpan<T const> src, HostSpan<T> dst, int root, CollectiveTag tag) {
    int const m = block(dst.size(), CollectiveKind::kScatter);
    bool const in_place =
        rank_ == root && m > 0 && dst.data() == src.data() + static_cast<std::size_t>(root) * dst.size();
    check(MPI_Scatter(src.data(), m, detail::mpi_type<T>(), in_place ? MPI_IN_PLACE : static_cast<void*>(dst.data()), m,
                      detail::mpi_type<T>(), root, comm_),
          "scatter", tag);
  }

  void run_barrier(CollectiveTag tag) { check(MPI_Barrier(comm_), "barrier", tag); }

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
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int n_ = 1;
  detail::AllReduceQueue<MpiBackend> queue_;
};

static_assert(Communicator<MpiBackend>);
static_assert(AsyncCommunicator<MpiBackend>);

}  // namespace ddp
