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
  if constexpr (std::same_as<T, float>) return MPI_FLOAT;
  else if constexpr (std::same_as<T, double>) return MPI_DOUBLE;
  else if constexpr (std::same_as<T, std::int32_t>) return MPI_INT32_T;
  else return MPI_INT64_T;
}
inline MPI_Op mpi_op(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
    default: return MPI_SUM;  // kAvg: sum, then one scaling pass (MPI has no average)
  }
}
}  // namespace detail

// Guarantees: the results of MPI_Allreduce on the same inputs (MPICH's algorithms are deterministic for a
// fixed world size and message size, and give every rank the same bits). kAvg costs one extra pass over
// the buffer after the sum. Thread safety: one thread at a time issues this backend's collectives.
class MpiBackend {
 public:
  using accepted_spaces = SpaceList<HostSpace>;
  static constexpr std::string_view backend_name = "mpi";  // for logs: which backend was composed
  using work_type = Work;

  // Collective over opts.comm: every rank of it constructs its backend (MPI_Comm_dup).
  explicit MpiBackend(MpiSession const& session, MpiOptions const& opts = {})
      : session_(&session), tracer_(opts.trace), queue_(opts.queue_capacity, idle_policy(), Executor{this}) {
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

  template <detail::BufferLike B>
  void all_reduce(B&& buf, ReduceOp op, CollectiveTag tag = {}) {
    auto s = detail::as_space_span(buf);
    check_buffer<decltype(s)>();
    detail::check_writable<decltype(s)>();
    using T = std::remove_cv_t<typename decltype(s)::element_type>;
    trace(CollectiveKind::kAllReduce, s.size(), dtype_of<T>, op, -1, tag, false);
    enter();
    run_all_reduce(s.data(), s.size(), op, tag);
  }

  template <detail::BufferLike B>
  work_type all_reduce_async(B&& buf, ReduceOp op, CollectiveTag tag = {}) {
    auto s = detail::as_space_span(buf);
    check_buffer<decltype(s)>();
    detail::check_writable<decltype(s)>();
    using T = std::remove_cv_t<typename decltype(s)::element_type>;
    trace(CollectiveKind::kAllReduce, s.size(), dtype_of<T>, op, -1, tag, true);
    return queue_.submit(Request{dtype_of<T>, op, s.data(), s.size(), tag});
  }

  template <detail::BufferLike B>
  void broadcast(B&& buf, int root, CollectiveTag tag = {}) {
    auto s = detail::as_space_span(buf);
    check_buffer<decltype(s)>();
    detail::check_writable<decltype(s)>();
    using T = std::remove_cv_t<typename decltype(s)::element_type>;
    trace(CollectiveKind::kBroadcast, s.size(), dtype_of<T>, ReduceOp::kSum, root, tag, false);
    check_root(root, CollectiveKind::kBroadcast);
    enter();
    std::size_t off = 0;
    do {  // MPI counts are int: chunk, and still call once for an empty buffer
      std::size_t const m = std::min(kMaxChunk, s.size() - off);
      check(MPI_Bcast(s.data() + off, static_cast<int>(m), detail::mpi_type<T>(), root, comm_), "broadcast", tag);
      off += m;
    } while (off < s.size());
  }

  template <detail::BufferLike I, detail::BufferLike O>
  void all_gather(I&& in, O&& out, CollectiveTag tag = {}) {
    auto [src, dst] = pair_of(in, out);
    using T = std::remove_cv_t<typename decltype(dst)::element_type>;
    trace(CollectiveKind::kAllGather, src.size(), dtype_of<T>, ReduceOp::kSum, -1, tag, false);
    int const m = block(src.size(), CollectiveKind::kAllGather);
    check_size(dst.size(), src.size() * n_, CollectiveKind::kAllGather, "out", "world_size * in.size()");
    enter();
    void const* send = src.data() == dst.data() + static_cast<std::size_t>(rank_) * src.size() && m > 0
                           ? MPI_IN_PLACE
                           : static_cast<void const*>(src.data());
    check(MPI_Allgather(send, m, detail::mpi_type<T>(), dst.data(), m, detail::mpi_type<T>(), comm_), "all_gather", tag);
  }

  template <detail::BufferLike I, detail::BufferLike O>
  void reduce_scatter(I&& in, O&& out, ReduceOp op, CollectiveTag tag = {}) {
    auto [src, dst] = pair_of(in, out);
    using T = std::remove_cv_t<typename decltype(dst)::element_type>;
    trace(CollectiveKind::kReduceScatter, src.size(), dtype_of<T>, op, -1, tag, false);
    int const m = block(dst.size(), CollectiveKind::kReduceScatter);
    check_size(src.size(), dst.size() * n_, CollectiveKind::kReduceScatter, "in", "world_size * out.size()");
    enter();
    check(MPI_Reduce_scatter_block(src.data(), dst.data(), m, detail::mpi_type<T>(), detail::mpi_op(op), comm_),
          "reduce_scatter", tag);
    if (op == ReduceOp::kAvg) detail::average(dst.data(), dst.size(), n_);
  }

  template <detail::BufferLike I, detail::BufferLike O>
  void gather(I&& in, O&& out, int root, CollectiveTag tag = {}) {
    auto [src, dst] = pair_of(in, out);
    using T = std::remove_cv_t<typename decltype(dst)::element_type>;
    trace(CollectiveKind::kGather, src.size(), dtype_of<T>, ReduceOp::kSum, root, tag, false);
    check_root(root, CollectiveKind::kGather);
    int const m = block(src.size(), CollectiveKind::kGather);
    if (rank_ == root) check_size(dst.size(), src.size() * n_, CollectiveKind::kGather, "out", "world_size * in.size()");
    enter();
    bool const in_place = rank_ == root && m > 0 && src.data() == dst.data() + static_cast<std::size_t>(root) * src.size();
    check(MPI_Gather(in_place ? MPI_IN_PLACE : static_cast<void const*>(src.data()), m, detail::mpi_type<T>(), dst.data(),
                     m, detail::mpi_type<T>(), root, comm_),
          "gather", tag);
  }

  template <detail::BufferLike I, detail::BufferLike O>
  void scatter(I&& in, O&& out, int root, CollectiveTag tag = {}) {
    auto [src, dst] = pair_of(in, out);
    using T = std::remove_cv_t<typename decltype(dst)::element_type>;
    trace(CollectiveKind::kScatter, dst.size(), dtype_of<T>, ReduceOp::kSum, root, tag, false);
    check_root(root, CollectiveKind::kScatter);
    int const m = block(dst.size(), CollectiveKind::kScatter);
    if (rank_ == root) check_size(src.size(), dst.size() * n_, CollectiveKind::kScatter, "in", "world_size * out.size()");
    enter();
    bool const in_place = rank_ == root && m > 0 && dst.data() == src.data() + static_cast<std::size_t>(root) * dst.size();
    check(MPI_Scatter(src.data(), m, detail::mpi_type<T>(), in_place ? MPI_IN_PLACE : static_cast<void*>(dst.data()), m,
                      detail::mpi_type<T>(), root, comm_),
          "scatter", tag);
  }

  void barrier(CollectiveTag tag = {}) {
    trace(CollectiveKind::kBarrier, 0, Dtype::kInt32, ReduceOp::kSum, -1, tag, false);
    enter();
    check(MPI_Barrier(comm_), "barrier", tag);
  }

  // Waits for every async collective issued so far; rethrows the first error.
  void synchronize() { queue_.drain(); }

 private:
  static constexpr std::size_t kMaxChunk = INT_MAX / 64 * 64;  // MPI-3 counts are int

  struct Request {
    Dtype dtype;
    ReduceOp op;
    void* data;
    std::size_t count;
    CollectiveTag tag;
  };
  struct Executor {
    MpiBackend* self;
    void operator()(Request const& r) const {
      switch (r.dtype) {
        case Dtype::kFloat32: return self->run_all_reduce(static_cast<float*>(r.data), r.count, r.op, r.tag);
        case Dtype::kFloat64: return self->run_all_reduce(static_cast<double*>(r.data), r.count, r.op, r.tag);
        case Dtype::kInt32: return self->run_all_reduce(static_cast<std::int32_t*>(r.data), r.count, r.op, r.tag);
        case Dtype::kInt64: return self->run_all_reduce(static_cast<std::int64_t*>(r.data), r.count, r.op, r.tag);
      }
    }
  };

  // MPICH's blocking calls busy-poll; the idle progress thread itself sleeps after a short spin.
  static detail::WaitPolicy idle_policy() noexcept {
    return detail::WaitPolicy{.spin = std::chrono::microseconds(10), .yields = 4};
  }

  template <class T>
  void run_all_reduce(T* data, std::size_t count, ReduceOp op, CollectiveTag tag) {
    std::size_t off = 0;
    do {  // MPI counts are int: chunk, and still call once for an empty buffer
      std::size_t const m = std::min(kMaxChunk, count - off);
      check(MPI_Allreduce(MPI_IN_PLACE, data + off, static_cast<int>(m), detail::mpi_type<T>(), detail::mpi_op(op), comm_),
            "all_reduce", tag);
      off += m;
    } while (off < count);
    if (op == ReduceOp::kAvg) detail::average(data, count, n_);
  }

  template <class S>
  static constexpr void check_buffer() {
    static_assert(std::same_as<typename S::space, HostSpace>,
                  "MpiBackend takes host memory, but this buffer is a DeviceSpan (device memory): copy it into a "
                  "host buffer (HostSpan / std::vector), or use NcclBackend from ddp/comm/nccl.hpp for device "
                  "buffers");
    detail::check_element<S>();
  }

  template <class I, class O>
  static auto pair_of(I&& in, O&& out) {
    check_buffer<detail::span_of_t<I>>();
    check_buffer<detail::span_of_t<O>>();
    return detail::span_pair(in, out);
  }

  void enter() {
    if (!queue_.idle()) queue_.drain();
  }

  void check(int rc, char const* op, CollectiveTag tag) const {
    if (rc == MPI_SUCCESS) return;
    throw CommError(detail::cat("ddp mpi: ", op, tag_suffix(tag), " on rank ", rank_, " of ", n_,
                                " failed: ", detail::mpi_error_string(rc)),
                    rank_);
  }
  static std::string tag_suffix(CollectiveTag tag) {
    if (tag.empty()) return {};
    return tag.id >= 0 ? detail::cat(" [", tag.label, tag.label.empty() ? "" : ":", tag.id, "]")
                       : detail::cat(" [", tag.label, "]");
  }
  int block(std::size_t m, CollectiveKind kind) const {
    if (m > static_cast<std::size_t>(INT_MAX)) {
      throw ArgumentError(detail::cat("ddp mpi: ", name(kind), " on rank ", rank_, ": block of ", m,
                                      " elements exceeds MPI's int count; split the call"));
    }
    return static_cast<int>(m);
  }
  void check_root(int root, CollectiveKind kind) const {
    if (root < 0 || root >= n_) {
      throw ArgumentError(detail::cat("ddp mpi: ", name(kind), " on rank ", rank_, ": root ", root, " is outside [0, ", n_, ")"));
    }
  }
  void check_size(std::size_t got, std::size_t want, CollectiveKind kind, char const* what, char const* rule) const {
    if (got != want) {
      throw ArgumentError(detail::cat("ddp mpi: ", name(kind), " on rank ", rank_, ": ", what, ".size() is ", got,
                                      " but must be ", rule, " = ", want));
    }
  }
  void trace(CollectiveKind kind, std::size_t count, Dtype dt, ReduceOp op, int root, CollectiveTag tag,
             bool async) const noexcept {
    if (tracer_.enabled()) tracer_(CollectiveRecord{rank_, kind, count, dt, op, root, tag, async});
  }

  MpiSession const* session_;
  detail::Tracer tracer_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int n_ = 1;
  detail::ProgressQueue<Request, Executor> queue_;
};

static_assert(Communicator<MpiBackend>);
static_assert(AsyncCommunicator<MpiBackend>);

}  // namespace ddp
