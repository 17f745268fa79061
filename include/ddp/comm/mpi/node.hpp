// NodeAllReduce: MpiBackend's all-reduce for ranks that share a node. The node's ranks reduce through an
// MPI-3 shared window (MPI_Win_allocate_shared) with the threads backend's sliced algorithm; with several
// nodes it is hierarchical and striped: local rank k reduces slice k on its node, all-reduces it with the
// ranks of local rank k on the other nodes over MPI, and publishes the result on its node.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/detail/reduce.hpp"
#include "ddp/comm/detail/wait.hpp"
#include "ddp/comm/mpi/store_chooser.hpp"
#include "ddp/comm/mpi/types.hpp"
#include "ddp/comm/mpi/watch.hpp"
#include "ddp/error.hpp"
#include "ddp/tensor/stream_copy.hpp"

namespace ddp {

// How MpiBackend::all_reduce combines the ranks of one node.
enum class NodeAllReduce {
  kSharedMemory,  // through an MPI-3 shared window; across nodes hierarchical (node, then MPI, then node)
  kMpi,           // MPI_Iallreduce over all ranks, as the MPI library does it
};

enum class GradientStorage { kShared, kPrivate };

struct MpiNodeOptions {
  NodeAllReduce all_reduce = NodeAllReduce::kSharedMemory;
  // Large all-reduces go through the window in chunks of this many bytes per rank (two chunks in flight).
  std::size_t chunk_bytes = 512 * 1024;
  // On one node, all-reduces up to this size take one barrier (copy in, every rank reduces all of it); across
  // nodes they go to MPI_Iallreduce, whose latency-bound algorithms suit them better.
  std::size_t small_bytes = 32 * 1024;
  // 0: a node is the ranks that share memory (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)). k > 0: consecutive
  // groups of k ranks count as nodes, to run the hierarchical algorithm on one host (tests, studies); each
  // group must still share memory.
  int ranks_per_node = 0;
  // How all-reduces of at least streaming_bytes write the window's chunk areas (copy-in and the reduced slice),
  // and, in place (gradient_storage), the reduced slice into the peers' buffers:
  // kPlain, plain stores; kStreaming, non-temporal stores (x86 SSE2; elsewhere plain), which invalidate the
  // peers' cached copies of those lines without fetching them first; kAdaptive, each rank takes whichever its
  // recent all-reduces ran faster with (detail::StoreChooser). A peer read each line of an area in the round
  // before, so a plain store fetches it back across cores: cheap where the ranks share a cache, slow where they
  // do not. Which wins depends on how the host maps the ranks' cores to caches, and that can change while a
  // job runs (a VM's vCPUs moved between cache domains), so kAdaptive measures instead of guessing; both
  // cases' rates are in bench/RESULTS.md (shared-memory all-reduce). Smaller all-reduces always use plain
  // stores (latency-bound: the window's lines stay in cache).
  WindowStores window_stores = WindowStores::kAdaptive;
  std::size_t streaming_bytes = std::size_t{1} << 16;
  // Where MpiBackend::gradient_storage puts a gradient buffer (DistributedDataParallel asks for one): kShared,
  // a block of a shared window at the same place in every segment of the node's ranks, which all_reduce then
  // reduces in place: each rank reduces its slice straight from the peers' buffers into all of them, with no
  // copy into or out of the window (half the memory traffic of the chunked path); across nodes the node phase
  // of the hierarchical all-reduce is in place the same way. kPrivate: the rank's own memory, through the
  // window's chunks. With one rank per node the storage is always private (MPI all-reduces it directly).
  GradientStorage gradient_storage = GradientStorage::kShared;
};

namespace detail {

// The head of each rank's segment in the window: its barrier count and its current call (for the checks).
struct alignas(64) NodeSlot {
  std::atomic<std::uint64_t> arrived{0};
  alignas(64) CallRecord pub[2];  // by the parity of the rank's all-reduce count
  // Where the rank's buffer of that call lives: -1 private memory; else shared block b, byte offset o, as
  // b * 2^40 + o (all ranks must agree: the in-place and chunked paths take different barriers).
  std::int64_t place[2] = {-1, -1};
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "cross-process atomics must be lock-free");

class NodeAllReduce {
 public:
  // Collective over `comm` (the backend's communicator). Throws CommError on every rank if any rank could
  // not set up its window (the ranks agree on the outcome first).
  NodeAllReduce(MPI_Comm comm, MpiNodeOptions const& opts, MpiWatch& watch, MpiHalfOps const& half_ops)
      : watch_(&watch), half_ops_(&half_ops) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &n_);
    if (opts.ranks_per_node < 0) {
      throw ArgumentError(cat("ddp mpi: MpiNodeOptions::ranks_per_node must be >= 0, got ", opts.ranks_per_node));
    }
    if (opts.chunk_bytes < 4096) {
      throw ArgumentError(cat("ddp mpi: MpiNodeOptions::chunk_bytes must be >= 4096, got ", opts.chunk_bytes));
    }
    chunk_bytes_ = opts.chunk_bytes / 64 * 64;
    stores_ = StoreChooser(opts.window_stores, opts.streaming_bytes);
    in_place_stores_ = StoreChooser(opts.window_stores, opts.streaming_bytes);
    small_bytes_ = (std::max<std::size_t>(opts.small_bytes, 64) + 63) / 64 * 64;
    if (opts.ranks_per_node == 0) {
      MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_);
    } else {
      MPI_Comm_split(comm, rank_ / opts.ranks_per_node, rank_, &node_);
    }
    MPI_Comm_set_errhandler(node_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(node_, &local_rank_);
    MPI_Comm_size(node_, &local_n_);
    node_ranks_.resize(static_cast<std::size_t>(local_n_));
    MPI_Allgather(&rank_, 1, MPI_INT, node_ranks_.data(), 1, MPI_INT, node_);

    // The layout: how many nodes, and whether every node has the same number of ranks (then striped).
    int const leader = local_rank_ == 0 ? 1 : 0;
    int sizes[2] = {local_n_, -local_n_};
    MPI_Allreduce(&leader, &nodes_, 1, MPI_INT, MPI_SUM, comm);
    MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MAX, comm);
    uniform_ = sizes[0] == -sizes[1];
    alone_ = sizes[0] == 1;  // every node has one rank
    stripes_ = nodes_ == 1 || uniform_ ? local_n_ : 1;
    if (nodes_ > 1) {
      int const color = local_rank_ < stripes_ ? local_rank_ : MPI_UNDEFINED;
      MPI_Comm_split(comm, color, rank_, &cross_);
      if (cross_ != MPI_COMM_NULL) MPI_Comm_set_errhandler(cross_, MPI_ERRORS_RETURN);
    }

    // The window: per rank a slot, two small areas and two chunk halves.
    head_bytes_ = (sizeof(NodeSlot) + 63) / 64 * 64;
    segment_bytes_ = head_bytes_ + 2 * small_bytes_ + 2 * chunk_bytes_;
    int const rc = allocate_window(segment_bytes_, win_, segments_);
    int failed = rc == MPI_SUCCESS ? 0 : 1;
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, comm);
    if (failed) {
      std::string const why = rc == MPI_SUCCESS ? "a peer's window failed" : mpi_error_string(rc);
      segments_.clear();  // not locked yet: release() must not unlock it
      release();
      throw CommError(cat("ddp mpi: the shared-memory window for all_reduce (", segment_bytes_,
                          " bytes per rank) could not be set up on rank ", rank_, " of ", n_, ": ", why,
                          "; free space in /dev/shm, lower MpiNodeOptions::chunk_bytes, or choose "
                          "MpiNodeOptions{.all_reduce = NodeAllReduce::kMpi}"),
                      rank_);
    }
    MPI_Win_lock_all(MPI_MODE_NOCHECK, win_);
    new (segments_[static_cast<std::size_t>(local_rank_)]) NodeSlot();
    MPI_Barrier(node_);  // every slot is constructed before any rank reads one
  }
  NodeAllReduce(NodeAllReduce const&) = delete;
  NodeAllReduce& operator=(NodeAllReduce const&) = delete;
  ~NodeAllReduce() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && !abandoned_) release();
  }

  // After a failed collective: leave the window and communicators alone (freeing them is collective).
  void abandon() noexcept { abandoned_ = true; }

  int nodes() const noexcept { return nodes_; }
  int local_rank() const noexcept { return local_rank_; }
  int local_size() const noexcept { return local_n_; }
  // "2 nodes x 2 ranks (shared memory, striped MPI across nodes)"
  std::string layout() const {
    if (nodes_ == 1) return cat("1 node x ", local_n_, " ranks (shared memory)");
    if (alone_) return cat(nodes_, " nodes x 1 rank (MPI_Iallreduce)");
    return cat(nodes_, " nodes", uniform_ ? cat(" x ", local_n_, " ranks") : std::string(" (uneven)"),
               " (shared memory, ", uniform_ ? "striped" : "leaders'", " MPI across nodes)");
  }

  // Whether this path takes an all-reduce of `bytes` (else MPI_Iallreduce over all ranks does).
  // Every rank decides alike. With one rank per node the window gains nothing: MPI all-reduces directly.
  bool takes(std::size_t bytes) const noexcept { return !alone_ && (nodes_ == 1 || bytes > small_bytes_); }

  template <class T>
  void all_reduce(T* data, std::size_t count, ReduceOp op, CallRecord const& call) {
    std::size_t const bytes = count * sizeof(T);
    std::uint64_t const op_seq = ++ops_;
    self().pub[op_seq & 1] = call;
    std::int64_t const place = bytes > small_bytes_ ? place_of(data, bytes) : -1;
    self().place[op_seq & 1] = place;
    if (nodes_ == 1 && bytes <= small_bytes_) return small(data, count, op, call, op_seq);
    if (place >= 0) return in_place<T>(count, op, call, op_seq, place);
    auto& srcs = pointers<T>();
    // Chunks of whole cache lines per stripe, so no two ranks write one line.
    std::size_t const line = 64 / sizeof(T);
    std::size_t const chunk = std::max(line, chunk_bytes_ / sizeof(T) / line * line);
    int const mine = local_rank_ < stripes_ ? local_rank_ : -1;
    ReduceOp const node_op = nodes_ > 1 && op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    Stores const stores = stores_.choose(bytes);  // this rank's choice: the bytes are the same either way
    std::size_t off = 0;
    bool first = true;
    std::chrono::steady_clock::time_point since{};
    do {
      std::size_t const m = std::min(chunk, count - off);
      std::size_t const half = chunks_++ & 1;
      T* const own = data + off;
      for (int k = 0; k < stripes_; ++k) {  // copy in every slice but the one this rank reduces
        if (k == mine) continue;
        auto const [lo, hi] = slice(m, line, k);
        copy_to_window(area<T>(local_rank_, half) + lo, own + lo, hi - lo, stores);
      }
      if (stores == Stores::kStreaming) stream_fence();
      arrive(call);
      if (first) verify(call, op_seq), since = std::chrono::steady_clock::now();
      first = false;
      if (mine >= 0) {
        auto const [lo, hi] = slice(m, line, mine);
        for (int k = 0; k < local_n_; ++k) {
          srcs[static_cast<std::size_t>(k)] = k == local_rank_ ? own + lo : area<T>(k, half) + lo;
        }
        T* const result = area<T>(local_rank_, half) + lo;
        if (nodes_ == 1 && stores == Stores::kStreaming) {
          T* dst = own + lo;  // reduce in this rank's own buffer, then stream the slice into the window
          reduce_blocks<T>(srcs.data(), local_n_, &dst, 1, hi - lo, op);
          copy_to_window(result, dst, hi - lo, stores);
          stream_fence();
        } else if (nodes_ == 1) {
          T* dsts[2] = {result, own + lo};
          reduce_blocks<T>(srcs.data(), local_n_, dsts, 2, hi - lo, op);
        } else {
          reduce_blocks<T>(srcs.data(), local_n_, &result, 1, hi - lo, node_op);
          across_nodes(result, hi - lo, node_op, call);
          if (op == ReduceOp::kAvg) average(result, hi - lo, n_);
          copy(own + lo, result, hi - lo);
        }
      }
      arrive(call);
      for (int k = 0; k < stripes_; ++k) {  // copy out the slices the other ranks reduced
        if (k == mine) continue;
        auto const [lo, hi] = slice(m, line, k);
        copy(own + lo, area<T>(k, half) + lo, hi - lo);
      }
      off += m;
    } while (off < count);
    // The rate from the first barrier on (entry skew between the ranks left out), for kAdaptive.
    stores_.record(stores, bytes, std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count());
  }

  // Whether shared_block gives memory that all_reduce reduces in place: every layout but one rank per node
  // (whose all-reduces go straight to MPI_Iallreduce).
  bool reduces_in_place() const noexcept { return !alone_; }

  // A block of at least `bytes` at the same place in every node rank's segment of a shared window, for a
  // buffer that all_reduce reduces in place (MpiNodeOptions::gradient_storage), and the lease that marks it in
  // use: a block whose lease has expired on every rank of the node (no tensor views it any more) is reused,
  // else a new window is made. Null with one rank per node (the window would gain nothing), or when any rank
  // of the node could not make the window (every rank of the node then gets null). Collective over the
  // backend's communicator; freed with this object.
  std::pair<void*, std::shared_ptr<void>> shared_block(std::size_t bytes) {
    if (alone_ || bytes == 0) return {};
    std::vector<int> reusable(blocks_.size());  // the same count on every rank: blocks are made collectively
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      reusable[b] = blocks_[b].lease.expired() && blocks_[b].bytes >= bytes ? 1 : 0;
    }
    if (!reusable.empty()) {
      MPI_Allreduce(MPI_IN_PLACE, reusable.data(), static_cast<int>(reusable.size()), MPI_INT, MPI_MIN, node_);
    }
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      if (reusable[b] != 0) return blocks_[b].hand_out(local_rank_);
    }
    SharedBlock block{MPI_WIN_NULL, {}, bytes, {}};
    int failed = allocate_window(bytes, block.win, block.bases) == MPI_SUCCESS ? 0 : 1;
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, node_);
    if (failed) {
      if (block.win != MPI_WIN_NULL) MPI_Win_free(&block.win);
      return {};
    }
    blocks_.push_back(std::move(block));
    return blocks_.back().hand_out(local_rank_);
  }

 private:
  // A shared window over the node with `bytes` per rank, and every rank's segment, each starting on a cache
  // line (64 bytes more: MPICH may place a one-rank window on the heap, 16-byte aligned). `bases` is filled
  // only on success. Returns MPI's code.
  int allocate_window(std::size_t bytes, MPI_Win& win, std::vector<std::byte*>& bases) const {
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    void* base = nullptr;
    int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes + 64), 1, info, node_, &base, &win);
    MPI_Info_free(&info);
    std::vector<std::byte*> found;
    for (int k = 0; k < local_n_ && rc == MPI_SUCCESS; ++k) {
      MPI_Aint size = 0;
      int disp = 0;
      void* at = nullptr;
      rc = MPI_Win_shared_query(win, k, &size, &disp, &at);
      found.push_back(reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(at) + 63) / 64 * 64));
    }
    if (rc == MPI_SUCCESS) bases = std::move(found);
    return rc;
  }

  struct SharedBlock {
    MPI_Win win = MPI_WIN_NULL;
    std::vector<std::byte*> bases;  // by local rank
    std::size_t bytes = 0;
    std::weak_ptr<void> lease;  // alive while a tensor views the block on this rank

    // This rank's part of the block, with a new lease.
    std::pair<void*, std::shared_ptr<void>> hand_out(int local_rank) {
      auto fresh = std::make_shared<char>('\0');
      lease = fresh;
      return {bases[static_cast<std::size_t>(local_rank)], std::move(fresh)};
    }
  };

  // NodeSlot::place: block b, byte offset o as b * 2^40 + o.
  static constexpr int kPlaceShift = 40;
  static constexpr std::int64_t place_block(std::int64_t place) noexcept { return place >> kPlaceShift; }
  static constexpr std::int64_t place_offset(std::int64_t place) noexcept {
    return place & ((std::int64_t{1} << kPlaceShift) - 1);
  }

  // The place code of [data, data + bytes) if it lies in one of this rank's shared blocks, else -1.
  std::int64_t place_of(void const* data, std::size_t bytes) const noexcept {
    auto const* p = static_cast<std::byte const*>(data);
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      std::byte const* base = blocks_[b].bases[static_cast<std::size_t>(local_rank_)];
      if (p >= base && p + bytes <= base + blocks_[b].bytes) {
        return static_cast<std::int64_t>(b << kPlaceShift) + static_cast<std::int64_t>(p - base);
      }
    }
    return -1;
  }

  // In place, in a shared block: one barrier (every rank's buffer is ready), each rank reduces its slice from
  // all ranks' buffers into all of them (rank order: every rank gets the same bits; into the peers' buffers
  // with streaming stores when in_place_stores_ says so), one barrier (no rank touches its buffer again before
  // every slice is written). Across nodes see in_place_across.
  template <class T>
  void in_place(std::size_t count, ReduceOp op, CallRecord const& call, std::uint64_t op_seq, std::int64_t place) {
    arrive(call);
    verify(call, op_seq);
    SharedBlock const& block = blocks_[static_cast<std::size_t>(place_block(place))];
    std::size_t const offset = static_cast<std::size_t>(place_offset(place));
    auto const buffer = [&](int k) { return reinterpret_cast<T*>(block.bases[static_cast<std::size_t>(k)] + offset); };
    if (nodes_ > 1) {
      in_place_across<T>(count, op, call, buffer);
      arrive(call);
      return;
    }
    auto const since = std::chrono::steady_clock::now();
    std::size_t const bytes = count * sizeof(T);
    Stores const stores = in_place_stores_.choose(bytes);  // this rank's choice: the bytes are the same either way
    auto const [lo, hi] = slice(count, 64 / sizeof(T), local_rank_);
    auto& srcs = pointers<T>();
    auto& dsts = targets<T>();
    for (int k = 0; k < local_n_; ++k) {
      srcs[static_cast<std::size_t>(k)] = buffer(k) + lo;
      dsts[static_cast<std::size_t>(k)] = buffer(k) + lo;
    }
    if (stores == Stores::kStreaming) {
      std::swap(dsts[0], dsts[static_cast<std::size_t>(local_rank_)]);  // this rank's buffer first
      reduce_blocks_streaming<T>(srcs.data(), local_n_, dsts.data(), local_n_, hi - lo, op);
    } else {
      reduce_blocks<T>(srcs.data(), local_n_, dsts.data(), local_n_, hi - lo, op);
    }
    arrive(call);
    in_place_stores_.record(stores, bytes,
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count());
  }

  // The node phase of the hierarchical all-reduce, in place: for each chunk of the chunked path's size, the
  // rank of stripe k reduces slice k of the chunk from the node's buffers into its own, all-reduces it across
  // nodes, and writes the result into the other buffers of the node. The chunks, stripes and MPI calls across
  // nodes are the chunked path's, so the bits are the same, and a node whose ranks pass private buffers (the
  // chunked path) all-reduces alongside one whose ranks pass gradient_storage. No barrier between chunks: a
  // rank reads and writes only its own stripes.
  template <class T, class Buffer>
  void in_place_across(std::size_t count, ReduceOp op, CallRecord const& call, Buffer const& buffer) {
    if (local_rank_ >= stripes_) return;  // uneven nodes: the leader does the node's part
    std::size_t const line = 64 / sizeof(T);
    std::size_t const chunk = std::max(line, chunk_bytes_ / sizeof(T) / line * line);
    ReduceOp const node_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    auto& srcs = pointers<T>();
    T* const own = buffer(local_rank_);
    for (std::size_t off = 0; off < count;) {
      std::size_t const m = std::min(chunk, count - off);
      auto const [lo, hi] = slice(m, line, local_rank_);
      for (int k = 0; k < local_n_; ++k) srcs[static_cast<std::size_t>(k)] = buffer(k) + off + lo;
      T* result = own + off + lo;
      reduce_blocks<T>(srcs.data(), local_n_, &result, 1, hi - lo, node_op);
      across_nodes(result, hi - lo, node_op, call);
      if (op == ReduceOp::kAvg) average(result, hi - lo, n_);
      for (int k = 0; k < local_n_; ++k) {
        if (k != local_rank_) copy(buffer(k) + off + lo, result, hi - lo);
      }
      off += m;
    }
  }

  NodeSlot& slot(int k) const noexcept { return *reinterpret_cast<NodeSlot*>(segments_[static_cast<std::size_t>(k)]); }
  NodeSlot& self() const noexcept { return slot(local_rank_); }
  std::byte* bytes_of(int k) const noexcept { return segments_[static_cast<std::size_t>(k)]; }
  template <class T>
  T* small_area(int k, std::uint64_t barrier) const noexcept {
    return reinterpret_cast<T*>(bytes_of(k) + head_bytes_ + (barrier & 1) * small_bytes_);
  }
  template <class T>
  T* area(int k, std::size_t half) const noexcept {
    return reinterpret_cast<T*>(bytes_of(k) + head_bytes_ + 2 * small_bytes_ + half * chunk_bytes_);
  }

  // One barrier: copy in, then every rank reduces all of it from the peers' areas (double-buffered by the
  // barrier's parity: a rank rewrites an area only after every peer passed the next barrier).
  template <class T>
  void small(T* data, std::size_t count, ReduceOp op, CallRecord const& call, std::uint64_t op_seq) {
    std::uint64_t const b = barrier_ + 1;
    copy(small_area<T>(local_rank_, b), data, count);
    arrive(call);
    verify(call, op_seq);
    auto& srcs = pointers<T>();
    for (int k = 0; k < local_n_; ++k) srcs[static_cast<std::size_t>(k)] = small_area<T>(k, b);
    reduce_blocks<T>(srcs.data(), local_n_, &data, 1, count, op);
  }

  // Stripe k of m elements: equal parts rounded up to whole cache lines.
  std::pair<std::size_t, std::size_t> slice(std::size_t m, std::size_t line, int k) const noexcept {
    std::size_t per = (m + static_cast<std::size_t>(stripes_) - 1) / static_cast<std::size_t>(stripes_);
    per = (per + line - 1) / line * line;
    std::size_t const lo = std::min(m, static_cast<std::size_t>(k) * per);
    return {lo, std::min(m, lo + per)};
  }

  template <class T>
  void across_nodes(T* buf, std::size_t m, ReduceOp op, CallRecord const& call) {
    MPI_Request req = MPI_REQUEST_NULL;
    int const rc =
        MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(m), mpi_type<T>(), half_ops_->op<T>(op), cross_, &req);
    if (rc != MPI_SUCCESS) {
      throw CommError(cat("ddp mpi: ", describe(call), " on rank ", rank_, " of ", n_,
                          " failed across nodes: ", mpi_error_string(rc)),
                      rank_);
    }
    watch_->wait(req, call);
  }

  // The node barrier: arrive, spin briefly, yield, then wait under the backend's deadline (answering peers'
  // questions and naming the ranks that do not arrive, as every MPI collective of the backend does).
  void arrive(CallRecord const& call) {
    std::uint64_t const b = ++barrier_;
    self().arrived.store(b, std::memory_order_seq_cst);
    auto const all = [&] {
      for (int k = 0; k < local_n_; ++k) {
        if (slot(k).arrived.load(std::memory_order_acquire) < b) return false;
      }
      return true;
    };
    for (int i = 0; i < 128; ++i) {
      if (all()) return;
      cpu_relax();
    }
    for (int i = 0; i < 16; ++i) {
      if (all()) return;
      std::this_thread::yield();
    }
    watch_->wait_until(all, call);
  }

  // After an all-reduce's first barrier: every rank of the node issued the same call at this position. A
  // mismatch raises the same error on every rank of the node, listing each group of ranks and its call.
  void verify(CallRecord const& call, std::uint64_t op_seq) const {
    auto const pub = [&](int k) -> CallRecord const& { return slot(k).pub[op_seq & 1]; };
    bool agree = true;
    for (int k = 0; k < local_n_; ++k) agree = agree && pub(k).seq == call.seq && pub(k).same_call(call);
    if (agree) return verify_places(call, op_seq);
    std::string sides;
    std::vector<char> told(static_cast<std::size_t>(local_n_), 0);
    for (int i = 0; i < local_n_; ++i) {
      if (told[static_cast<std::size_t>(i)]) continue;
      std::vector<int> same;
      for (int j = i; j < local_n_; ++j) {
        if (!told[static_cast<std::size_t>(j)] && pub(j).seq == pub(i).seq && pub(j).same_call(pub(i))) {
          told[static_cast<std::size_t>(j)] = 1;
          same.push_back(node_ranks_[static_cast<std::size_t>(j)]);
        }
      }
      sides += cat(sides.empty() ? "" : "; ", rank_list(same), " issued ", describe(pub(i)));
    }
    throw CommError(cat("ddp mpi: collective mismatch at #", call.seq, " (seen by rank ", rank_, " of ", n_,
                        "): ", sides, "; every rank must issue the same collectives in the same order"),
                    rank_);
  }

  // The same call on every rank, but the buffers must be alike too: all in one shared block at one offset (in
  // place), or all elsewhere (chunked). Same error on every rank otherwise.
  void verify_places(CallRecord const& call, std::uint64_t op_seq) const {
    auto const place = [&](int k) { return slot(k).place[op_seq & 1]; };
    bool agree = true;
    for (int k = 1; k < local_n_; ++k) agree = agree && place(k) == place(0);
    if (agree) return;
    std::string sides;
    for (int k = 0; k < local_n_; ++k) {
      std::int64_t const p = place(k);
      sides += cat(k == 0 ? "" : "; ", "rank ", node_ranks_[static_cast<std::size_t>(k)],
                   p < 0 ? std::string(" a buffer outside the shared gradient storage")
                         : cat(" shared gradient block ", place_block(p), " at byte ", place_offset(p)));
    }
    throw CommError(cat("ddp mpi: ", describe(call), " (seen by rank ", rank_, " of ", n_,
                        ") got buffers in different places: ", sides,
                        "; every rank must all-reduce the same slice of its MpiBackend::gradient_storage, or none"),
                    rank_);
  }

  template <class T>
  std::vector<T*>& targets() {
    auto& v = std::get<std::vector<T*>>(targets_);
    v.resize(static_cast<std::size_t>(local_n_));
    return v;
  }

  template <class T>
  std::vector<T const*>& pointers() {
    auto& v = std::get<std::vector<T const*>>(ptrs_);
    v.resize(static_cast<std::size_t>(local_n_));
    return v;
  }

  template <class T>
  static void copy(T* dst, T const* src, std::size_t m) noexcept {
    if (m != 0 && dst != src) std::memcpy(dst, src, m * sizeof(T));
  }
  template <class T>
  static void copy_to_window(T* dst, T const* src, std::size_t m, Stores stores) noexcept {
    if (stores == Stores::kStreaming)
      stream_copy(dst, src, m * sizeof(T));
    else
      copy(dst, src, m);
  }
  void release() noexcept {
    for (auto& block : blocks_) MPI_Win_free(&block.win);
    blocks_.clear();
    if (win_ != MPI_WIN_NULL) {
      if (!segments_.empty()) MPI_Win_unlock_all(win_);
      MPI_Win_free(&win_);
    }
    if (cross_ != MPI_COMM_NULL) MPI_Comm_free(&cross_);
    if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
  }

  MpiWatch* watch_;
  MpiHalfOps const* half_ops_;
  int rank_ = 0;
  int n_ = 1;
  int local_rank_ = 0;
  int local_n_ = 1;
  int nodes_ = 1;
  int stripes_ = 1;
  std::size_t chunk_bytes_ = 0;
  std::size_t small_bytes_ = 0;
  std::size_t head_bytes_ = 0;
  std::size_t segment_bytes_ = 0;
  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Comm cross_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  std::vector<std::byte*> segments_;  // by local rank, each on a cache line
  std::vector<int> node_ranks_;       // the node's ranks, by local rank, as ranks of the backend's communicator
  std::tuple<std::vector<float const*>, std::vector<double const*>, std::vector<std::int32_t const*>,
             std::vector<std::int64_t const*>, std::vector<bfloat16 const*>, std::vector<float16 const*>>
      ptrs_;
  std::tuple<std::vector<float*>, std::vector<double*>, std::vector<std::int32_t*>, std::vector<std::int64_t*>,
             std::vector<bfloat16*>, std::vector<float16*>>
      targets_;
  std::vector<SharedBlock> blocks_;               // shared_block's, in the order the ranks made them
  std::uint64_t ops_ = 0;                         // all-reduces through this path (the parity of the published call)
  std::uint64_t barrier_ = 0;                     // node barriers passed
  std::uint64_t chunks_ = 0;                      // chunks through the window (the parity of the half in use)
  StoreChooser stores_{WindowStores::kPlain, 0};  // MpiNodeOptions::window_stores, streaming_bytes
  StoreChooser in_place_stores_{WindowStores::kPlain, 0};  // the same options, for the in-place path's rates
  bool alone_ = false;
  bool uniform_ = true;  // every node has the same number of ranks (the same on every rank, as layout() must be)
  bool abandoned_ = false;
};

}  // namespace detail
}  // namespace ddp
