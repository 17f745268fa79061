// NcclBackend: collectives on CUDA device buffers through NCCL, on the backend's own stream, ordered with
// the compute stream by events. The ranks find each other, and share the ncclUniqueId, over MPI (under mpirun)
// or through a rendezvous store (torchrun, srun with a file store: no MPI at run time). Depend on //:ddp_nccl.
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/detail/front_end.hpp"
#include "ddp/comm/mpi/session.hpp"
#include "ddp/comm/mpi/watch.hpp"
#include "ddp/comm/rendezvous/rendezvous.hpp"
#include "ddp/comm/rendezvous/store_watch.hpp"
#include "ddp/comm/trace.hpp"
#include "ddp/comm/watch.hpp"
#include "ddp/error.hpp"
#include "ddp/tensor/device_buffer.hpp"

namespace ddp {

struct NcclOptions {
  // CUDA device of this rank; -1: the node-local rank (from MPI or the launcher) modulo the device count.
  int device = -1;
  // The stream that produces and consumes the buffers (nullptr: the legacy default stream). Every
  // collective waits for work already queued on it, and work queued on it afterwards waits for the result.
  cudaStream_t compute_stream = nullptr;
  // Async handles in flight before events are reused (a reused event only makes an old handle wait longer).
  std::size_t max_in_flight = 256;
  // The deadline of every host wait on a collective (NcclWork::wait, barrier), and its stall warning
  // (default: $DDP_TIMEOUT seconds, else 10 minutes). On expiry the communicator is aborted (ncclCommAbort).
  TimeoutOptions timeout{};
  TraceOptions trace{};
};

namespace detail {
template <CommElement T>
inline ncclDataType_t nccl_type() noexcept {
  if constexpr (std::same_as<T, float>)
    return ncclFloat32;
  else if constexpr (std::same_as<T, double>)
    return ncclFloat64;
  else if constexpr (std::same_as<T, std::int32_t>)
    return ncclInt32;
  else if constexpr (std::same_as<T, std::int64_t>)
    return ncclInt64;
  else if constexpr (std::same_as<T, bfloat16>)
    return ncclBfloat16;  // same bits as __nv_bfloat16
  else
    return ncclFloat16;  // same bits as __half
}
inline ncclRedOp_t nccl_op(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;  // scaled inside NCCL's reduction
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}
}  // namespace detail

class NcclBackend;

// all_reduce_async's handle: an event recorded on the NCCL stream after the collective. wait() blocks the
// host until it completed (and so does all earlier work of this backend) and reports NCCL's async errors.
class NcclWork {
 public:
  NcclWork() = default;
  NcclWork(NcclBackend* owner, cudaEvent_t event, detail::CallRecord const& call) noexcept
      : owner_(owner), event_(event), call_(call) {}
  inline void wait() const;
  inline bool test() const;

 private:
  NcclBackend* owner_ = nullptr;
  cudaEvent_t event_ = nullptr;
  detail::CallRecord call_{};
};

// Collectives are stream-ordered, as in NCCL: they return once enqueued; later work on the compute stream
// (and synchronous copies on the legacy default stream) sees the result. barrier() and NcclWork::wait()
// block the host. Results of kSum/kAvg follow NCCL's algorithms: identical on every rank, deterministic for
// a fixed topology and message size (NCCL's own guarantee). One thread at a time issues collectives.
// No hangs: the host waits poll under NcclOptions::timeout, learning what the peers wait for over MPI
// (MpiWatch) or through the rendezvous store (StoreWatch, where a rank that ends also says so, and its peers
// fail at once naming it); a wait past the deadline aborts the communicator (ncclCommAbort, so kernels stuck on
// absent peers end) and throws a CommError naming the collective and the ranks; the job then ends.
class NcclBackend : public detail::CollectiveFrontEnd<NcclBackend> {
 public:
  using accepted_spaces = SpaceList<DeviceSpace>;
  static constexpr std::string_view backend_name = "nccl";  // for logs: which backend was composed
  using work_type = NcclWork;

  // Collective over MPI_COMM_WORLD: rank 0 creates the ncclUniqueId and broadcasts it with MPI.
  explicit NcclBackend(MpiSession const& session, NcclOptions const& opts = {})
      : CollectiveFrontEnd(opts.trace),
        session_(&session),
        rank_(session.rank()),
        n_(session.world_size()),
        compute_(opts.compute_stream),
        bootstrap_("MPI") {
    try {
      watch_ =
          std::make_unique<detail::MpiWatch>(MPI_COMM_WORLD, detail::resolve(opts.timeout, backend_name), backend_name);
      init(session.local_rank(), opts, [&](ncclUniqueId& id) {
        if (rank_ == 0) nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
        if (int rc = MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD); rc != MPI_SUCCESS) {
          throw CommError(detail::cat("ddp nccl: rank ", rank_,
                                      ": MPI_Bcast of the ncclUniqueId failed: ", detail::mpi_error_string(rc)),
                          rank_);
        }
      });
    } catch (...) {
      release();
      throw;
    }
  }
  // Over a job's rendezvous (ddp::rendezvous(): torchrun, env or a file store), with no MPI: rank 0 creates the
  // ncclUniqueId and shares it through the store; the GPU is the launcher's LOCAL_RANK modulo the device count.
  // Collective: every rank builds its backends in the same order (each takes its own keys in the store).
  explicit NcclBackend(Rendezvous rv, NcclOptions const& opts = {})
      : CollectiveFrontEnd(opts.trace),
        rank_(rv.launch.rank),
        n_(rv.launch.world_size),
        compute_(opts.compute_stream),
        bootstrap_(rv.describe()),
        rendezvous_(std::make_shared<Rendezvous>(std::move(rv))) {
    try {
      Store& store = *rendezvous_->store;
      std::string const prefix = detail::cat("nccl/", store.add(detail::cat("nccl/instances/", rank_), 1) - 1, "/");
      watch_ = std::make_unique<detail::StoreWatch>(
          rendezvous_->store, rank_, n_, detail::resolve(opts.timeout, backend_name), backend_name, prefix + "watch/");
      std::string const key = prefix + "unique_id",
                        root_left = std::get<std::unique_ptr<detail::StoreWatch>>(watch_)->left_key(0);
      auto make_id = [&] {
        ncclUniqueId made{};
        nccl(ncclGetUniqueId(&made), "ncclGetUniqueId");
        auto const* p = reinterpret_cast<char const*>(&made);
        return std::vector<char>(p, p + sizeof made);
      };
      // The other ranks wait for rank 0's id before touching a device, so a rank 0 that fails first (no device, a
      // CUDA error) or is killed is named at once (share_from_root), not after a device error of their own.
      std::vector<char> bytes;
      if (rank_ != 0) bytes = share_from_root(store, key, rank_, 0, rendezvous_->timeout, make_id, root_left);
      init(rendezvous_->launch.local_rank, opts, [&](ncclUniqueId& id) {
        if (rank_ == 0) bytes = share_from_root(store, key, rank_, 0, rendezvous_->timeout, make_id, root_left);
        if (bytes.size() != sizeof id)
          throw CommError(detail::cat("ddp nccl: rank ", rank_, " read a ", bytes.size(), "-byte ncclUniqueId from ",
                                      store.describe(), " (expected ", sizeof id,
                                      " bytes): the ranks were built against different NCCL versions"),
                          rank_);
        std::memcpy(&id, bytes.data(), sizeof id);
      });
    } catch (std::exception const& e) {
      leave(detail::cat("its backend failed to start: ", e.what()));  // its peers name it at once, with this
      release();
      throw;
    } catch (...) {
      leave("its backend failed to start");
      release();
      throw;
    }
  }
  NcclBackend(NcclBackend const&) = delete;
  NcclBackend& operator=(NcclBackend const&) = delete;
  ~NcclBackend() {
    release();
    leave("its backend was destroyed");
  }

  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return n_; }
  int device() const noexcept { return device_; }
  cudaStream_t stream() const noexcept { return stream_; }
  // For logs: how the ranks found each other ("MPI", "torchrun's agent store (TCP store 127.0.0.1:29500)").
  std::string const& bootstrap() const noexcept { return bootstrap_; }

  // The collectives come from CollectiveFrontEnd; all_reduce_async returns an NcclWork (an event on the
  // NCCL stream). barrier() blocks the host until every rank arrived and all earlier collectives of this
  // backend finished. Below: the transport.

  // Throws if NCCL reported an asynchronous error (a peer failed, a network error).
  void check_async(char const* op, CollectiveTag tag) const {
    if (comm_ == nullptr) {
      throw CommError(detail::cat("ddp nccl: ", op, detail::tag_suffix(tag), " on rank ", rank_, " of ", n_,
                                  ": the communicator was aborted after an earlier collective failed"),
                      rank_);
    }
    ncclResult_t async = ncclSuccess;
    nccl(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
    if (async != ncclSuccess) nccl(async, op, tag);
  }

  // Blocks until `event` (recorded after collective `call`) completed, under the deadline; see the class.
  void wait_event(cudaEvent_t event, detail::CallRecord const& call) {
    auto done = [&] {
      cudaError_t const rc = cudaEventQuery(event);
      if (rc == cudaErrorNotReady) {
        check_async(name(call.collective()).data(), call.tag());
        return false;
      }
      cuda(rc, "cudaEventQuery");
      check_async(name(call.collective()).data(), call.tag());
      return true;
    };
    try {
      std::visit([&](auto& watch) { watch->wait_until(done, call); }, watch_);
    } catch (...) {
      abort_comm();
      throw;
    }
  }

 private:
  // `share_id` fills the ncclUniqueId on every rank (rank 0 makes it).
  template <class ShareId>
  void init(int local_rank, NcclOptions const& opts, ShareId&& share_id) {
    int devices = 0;
    cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount (no usable CUDA device/driver?)");
    if (devices == 0) throw CommError(detail::cat("ddp nccl: rank ", rank_, " sees no CUDA device"), rank_);
    device_ = opts.device >= 0 ? opts.device : local_rank % devices;
    cuda(cudaSetDevice(device_), "cudaSetDevice");
    ncclUniqueId id{};
    share_id(id);
    init_comm(id);
    cuda(cudaStreamCreate(&stream_), "cudaStreamCreate");
    cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    cuda(cudaEventCreateWithFlags(&barrier_, cudaEventDisableTiming), "cudaEventCreate");
    events_.resize(std::max<std::size_t>(opts.max_in_flight, 1));
    for (auto& e : events_) cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    scratch_ = DeviceBuffer<std::int32_t>(1);
  }
  // ncclCommInitRank under the collectives' deadline: it waits in NCCL's bootstrap for every peer, without a
  // timeout of its own, so it runs on a helper thread while this one waits as for a collective (the watch names a
  // peer that left or stalls, at the deadline at the latest). On failure the helper is left behind (detached, its
  // state shared): the communicator it may still make is never used. Keeps the blocking mode, so the collectives'
  // calls keep their blocking semantics (a non-blocking config would make every later call return ncclInProgress).
  // Compiled by nvcc in CI; not yet run on a GPU.
  void init_comm(ncclUniqueId const& id) {
    struct Pending {
      std::atomic<bool> done{false};
      ncclResult_t rc = ncclSuccess;
      cudaError_t device = cudaSuccess;
      ncclComm_t comm = nullptr;
    };
    auto pending = std::make_shared<Pending>();
    std::thread([pending, id, n = n_, rank = rank_, device = device_] {
      pending->device = cudaSetDevice(device);  // the device is per host thread
      if (pending->device == cudaSuccess) pending->rc = ncclCommInitRank(&pending->comm, n, id, rank);
      pending->done.store(true, std::memory_order_release);
    }).detach();
    auto done = [&] {
      if (!pending->done.load(std::memory_order_acquire)) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        return false;
      }
      cuda(pending->device, "cudaSetDevice (ncclCommInitRank's thread)");
      nccl(pending->rc, "ncclCommInitRank");
      comm_ = pending->comm;
      return true;
    };
    auto const call = detail::CallRecord::make(calls_++, CollectiveKind::kBarrier, 0, Dtype::kInt32, ReduceOp::kSum, -1,
                                               CollectiveTag{"ncclCommInitRank"});
    std::visit([&](auto& watch) { watch->wait_until(done, call); }, watch_);
  }

  // Ends every kernel of this communicator (they may wait forever for absent peers) and poisons the backend.
  void abort_comm() noexcept {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    aborted_ = true;
    if (session_ != nullptr) session_->note_failure();
    if (auto* mpi = std::get_if<std::unique_ptr<detail::MpiWatch>>(&watch_); mpi && *mpi) (*mpi)->abandon();
    leave("its communicator was aborted after a failed collective");
  }
  // Through the store: tells the peers this rank takes part in no further collective (MPI: mpi_main ends the job).
  void leave(std::string const& why) noexcept {
    if (auto* store = std::get_if<std::unique_ptr<detail::StoreWatch>>(&watch_); store && *store) (*store)->leave(why);
  }

  void release() noexcept {
    if (!aborted_ && stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    for (auto e : events_) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (barrier_ != nullptr) cudaEventDestroy(barrier_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    comm_ = nullptr;
    stream_ = nullptr;
    ready_ = nullptr;
    barrier_ = nullptr;
    events_.clear();
  }

  friend class detail::CollectiveFrontEnd<NcclBackend>;

  template <class S>
  static constexpr void check_space() {
    static_assert(std::same_as<typename S::space, DeviceSpace>,
                  "NcclBackend needs device memory (a DeviceSpan), but this buffer is host memory: put it in a "
                  "DeviceBuffer (ddp/tensor/device_buffer.hpp), or use ThreadsBackend / MpiBackend for host "
                  "buffers");
  }

  // NCCL's reduction op for `op`. On one rank an average is the sum (x / 1 == x exactly): NCCL before 2.29.7
  // runs one-rank averages through its oneRankReduce kernel, which leaves the last count % blocks elements
  // unwritten (NVIDIA/nccl#1950). Seen on an H100 with NCCL 2.28.9, 2026-11-24: an out-of-place
  // reduce_scatter kAvg of 3001 doubles kept the output's old value at index 3000. Sum on one rank is a copy.
  ncclRedOp_t op_for(ReduceOp op) const noexcept {
    return n_ == 1 && op == ReduceOp::kAvg ? ncclSum : detail::nccl_op(op);
  }

  template <class T>
  void run_all_reduce(DeviceSpan<T> buf, ReduceOp op, CollectiveTag tag) {
    enqueue(
        [&] {
          return ncclAllReduce(buf.data(), buf.data(), buf.size(), detail::nccl_type<T>(), op_for(op), comm_, stream_);
        },
        "all_reduce", tag);
  }

  template <class T>
  NcclWork run_all_reduce_async(DeviceSpan<T> buf, ReduceOp op, CollectiveTag tag) {
    run_all_reduce(buf, op, tag);
    cudaEvent_t const e = events_[next_event_++ % events_.size()];
    cuda(cudaEventRecord(e, stream_), "cudaEventRecord");
    return NcclWork(this, e,
                    detail::CallRecord::make(calls_, CollectiveKind::kAllReduce, buf.size(), dtype_of<T>, op, -1, tag));
  }

  template <class T>
  void run_broadcast(DeviceSpan<T> buf, int root, CollectiveTag tag) {
    enqueue(
        [&] { return ncclBroadcast(buf.data(), buf.data(), buf.size(), detail::nccl_type<T>(), root, comm_, stream_); },
        "broadcast", tag);
  }

  template <class T>
  void run_all_gather(DeviceSpan<T const> src, DeviceSpan<T> dst, CollectiveTag tag) {
    enqueue([&] { return ncclAllGather(src.data(), dst.data(), src.size(), detail::nccl_type<T>(), comm_, stream_); },
            "all_gather", tag);
  }

  template <class T>
  void run_reduce_scatter(DeviceSpan<T const> src, DeviceSpan<T> dst, ReduceOp op, CollectiveTag tag) {
    enqueue(
        [&] {
          return ncclReduceScatter(src.data(), dst.data(), dst.size(), detail::nccl_type<T>(), op_for(op), comm_,
                                   stream_);
        },
        "reduce_scatter", tag);
  }

  // NCCL has no gather/scatter: grouped point-to-point. The root exchanges block k (m elements at offset
  // k * m of its whole buffer) with rank k and copies its own block on the stream.
  template <class T>
  void run_gather(DeviceSpan<T const> src, DeviceSpan<T> dst, int root, CollectiveTag tag) {
    std::size_t const m = src.size();
    grouped("gather", tag, [&](int k) {
      if (rank_ != root)
        return k == root ? ncclSend(src.data(), m, detail::nccl_type<T>(), root, comm_, stream_) : ncclSuccess;
      return k == root ? device_copy(dst.data() + k * m, src.data(), m)
                       : ncclRecv(dst.data() + k * m, m, detail::nccl_type<T>(), k, comm_, stream_);
    });
  }

  template <class T>
  void run_scatter(DeviceSpan<T const> src, DeviceSpan<T> dst, int root, CollectiveTag tag) {
    std::size_t const m = dst.size();
    grouped("scatter", tag, [&](int k) {
      if (rank_ != root)
        return k == root ? ncclRecv(dst.data(), m, detail::nccl_type<T>(), root, comm_, stream_) : ncclSuccess;
      return k == root ? device_copy(dst.data(), src.data() + k * m, m)
                       : ncclSend(src.data() + k * m, m, detail::nccl_type<T>(), k, comm_, stream_);
    });
  }

  // One NCCL group of point-to-point calls: step(k) for every rank k, stopping at the first error.
  template <class Step>
  void grouped(char const* op, CollectiveTag tag, Step&& step) {
    enqueue(
        [&] {
          ncclResult_t rc = ncclGroupStart();
          for (int k = 0; k < n_ && rc == ncclSuccess; ++k) rc = step(k);
          ncclResult_t const end = ncclGroupEnd();
          return rc != ncclSuccess ? rc : end;
        },
        op, tag);
  }

  template <class T>
  ncclResult_t device_copy(T* to, T const* from, std::size_t m) {
    if (m == 0 || to == from) return ncclSuccess;
    return cudaMemcpyAsync(to, from, m * sizeof(T), cudaMemcpyDeviceToDevice, stream_) == cudaSuccess
               ? ncclSuccess
               : ncclUnhandledCudaError;
  }

  void run_barrier(CollectiveTag tag) {
    enqueue([&] { return ncclAllReduce(scratch_.data(), scratch_.data(), 1, ncclInt32, ncclSum, comm_, stream_); },
            "barrier", tag);
    cuda(cudaEventRecord(barrier_, stream_), "cudaEventRecord(barrier)");
    wait_event(barrier_,
               detail::CallRecord::make(calls_, CollectiveKind::kBarrier, 0, Dtype::kInt32, ReduceOp::kSum, -1, tag));
  }

  // Orders the collective after the compute stream's queued work, and later compute work after it.
  template <class Launch>
  void enqueue(Launch&& launch, char const* op, CollectiveTag tag) {
    check_async(op, tag);  // fails at once after an abort
    ++calls_;
    cuda(cudaEventRecord(ready_, compute_), "cudaEventRecord(compute)");
    cuda(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
    nccl(launch(), op, tag);
    cuda(cudaEventRecord(ready_, stream_), "cudaEventRecord(nccl)");
    cuda(cudaStreamWaitEvent(compute_, ready_, 0), "cudaStreamWaitEvent(compute)");
  }

  void cuda(cudaError_t rc, char const* call) const {
    if (rc != cudaSuccess) {
      throw CommError(detail::cat("ddp nccl: rank ", rank_, ": ", call, " failed: ", cudaGetErrorName(rc), " (",
                                  cudaGetErrorString(rc), ")"),
                      rank_);
    }
  }
  void nccl(ncclResult_t rc, char const* op, CollectiveTag tag = {}) const {
    if (rc == ncclSuccess) return;
    char const* last = comm_ != nullptr ? ncclGetLastError(comm_) : ncclGetLastError(nullptr);
    throw CommError(detail::cat("ddp nccl: ", op, detail::tag_suffix(tag), " on rank ", rank_, " of ", n_, " failed: ",
                                ncclGetErrorString(rc), (last && *last) ? detail::cat(" (", last, ")") : std::string()),
                    rank_);
  }

  friend class NcclWork;

  MpiSession const* session_ = nullptr;  // the MPI bootstrap's
  int rank_;
  int n_;
  int device_ = 0;
  cudaStream_t compute_;
  std::string bootstrap_;
  std::shared_ptr<Rendezvous> rendezvous_;  // the store bootstrap's (keeps rank 0's store server up)
  // Deadlines, and what the peers wait for: over MPI, or through the rendezvous store.
  std::variant<std::unique_ptr<detail::MpiWatch>, std::unique_ptr<detail::StoreWatch>> watch_;
  std::uint64_t calls_ = 0;  // collectives enqueued (their sequence numbers)
  bool aborted_ = false;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  cudaEvent_t barrier_ = nullptr;
  std::vector<cudaEvent_t> events_;
  std::size_t next_event_ = 0;
  DeviceBuffer<std::int32_t> scratch_;
};

static_assert(Communicator<NcclBackend>);
static_assert(AsyncCommunicator<NcclBackend>);

inline void NcclWork::wait() const {
  if (owner_ == nullptr) return;
  owner_->wait_event(event_, call_);
}
inline bool NcclWork::test() const {
  if (owner_ == nullptr) return true;
  cudaError_t const rc = cudaEventQuery(event_);
  if (rc == cudaErrorNotReady) return false;
  owner_->cuda(rc, "cudaEventQuery");
  return true;
}

}  // namespace ddp
