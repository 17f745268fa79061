// ZeroRedundancyOptimizer<O, C>: ZeRO stages 1 and 2 (Rajbhandari et al., 2020; PyTorch's ZeroRedundancyOptimizer
// is stage 1) over DistributedDataParallel. Each rank owns one slice of every gradient bucket, keeps the optimizer
// state of its slices only (1/world_size of the unsharded state, to within a 64-byte line per bucket), updates them
// with the optimizer's own kernel, and all-gathers every bucket's parameters after the step. Stage 2 also keeps
// only its slices' gradients once the step has used them: the rest of each bucket's gradient memory goes back to
// the kernel (host_pages.hpp) until the next backward writes it.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ddp/bucket/plan.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/detail/reduce.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/optim/shard.hpp"
#include "ddp/parallel/attachment.hpp"
#include "ddp/tensor/host_pages.hpp"
#include "ddp/tensor/stream_copy.hpp"

namespace ddp {

struct ZeroOptions {
  // 0: every rank keeps the whole optimizer state (the optimizer itself); 1: each rank keeps its slices' state;
  // 2: and, after each step, its slices' gradients only (host-addressable memory: host tensors, or device tensors
  // on Thrust's CPU systems).
  int stage = 1;
};

// An optimizer that can update a shard of its arena: constructible from (arena, options, ArenaShard), and saying
// how much state it holds (ddp's SGD, Adam and AdamW).
template <class O, class T, class S>
concept ShardableOptimizer = optim::Optimizer<O> && std::constructible_from < O,
        nn::ParameterArena<T, S>,
typename O::options_type, optim::ArenaShard > &&requires(O const& o) {
  { o.state_bytes() } -> std::same_as<std::int64_t>;
};

namespace detail {
// One bucket as ZeRO cuts it: gradient elements [start, start + numel) of the arena, in world_size slices of
// `chunk` elements (whole 64-byte lines, so a slice starts where the unsharded optimizer's SIMD blocks would);
// the last slices may be short or empty.
struct ZeroBucket {
  std::int64_t start = 0, numel = 0, chunk = 0;
};

template <class T, MemorySpace S>
std::vector<ZeroBucket> zero_buckets(BucketPlan const& plan, nn::ParameterArena<T, S> const& arena, int world) {
  constexpr std::int64_t kLine = 64 / sizeof(T) > 0 ? 64 / sizeof(T) : 1;
  std::vector<ZeroBucket> out;
  for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
    auto const& bucket = plan.buckets[b];
    std::int64_t const start = arena.entries()[bucket.params.front()].offset;
    std::int64_t at = start;
    for (auto const p : bucket.params) {  // a bucket's gradients are one contiguous slice (ParameterArena)
      if (arena.entries()[p].offset != at)
        throw ArgumentError(cat("ZeroRedundancyOptimizer: bucket ", b, "'s parameter '", arena.entries()[p].name,
                                "' is not contiguous with the one before it in the arena"));
      at += arena.entries()[p].numel;
    }
    std::int64_t const per_rank = (bucket.numel + world - 1) / world;
    out.push_back({start, bucket.numel, std::max<std::int64_t>(kLine, (per_rank + kLine - 1) / kLine * kLine)});
  }
  return out;
}

// Rank `rank`'s slice of one bucket: arena elements [begin, end), empty (end <= begin) where the bucket is too
// small to reach it.
inline optim::ArenaShard::Range zero_slice(ZeroBucket const& b, int rank) noexcept {
  std::int64_t const lo = b.start + rank * b.chunk;
  return {lo, std::min(b.start + b.numel, lo + b.chunk)};
}

// The arena elements rank `rank` owns: its slice of every bucket (none of a bucket too small to reach it).
inline std::vector<optim::ArenaShard::Range> zero_ranges(std::vector<ZeroBucket> const& buckets, int rank) {
  std::vector<optim::ArenaShard::Range> ranges;
  for (auto const& b : buckets)
    if (auto const r = zero_slice(b, rank); r.begin < r.end) ranges.push_back(r);
  return ranges;
}
}  // namespace detail

// Use in place of the optimizer, built after DistributedDataParallel from it:
//   ZeroRedundancyOptimizer<optim::AdamW, ThreadsBackend> opt(ddp, {.optimizer = {.lr = 1e-3}});
// and the loop is unchanged (zero_grad, forward/backward, step). Guarantees:
//  - the parameters after step() are bitwise those of the unsharded optimizer given the same gradients, on every
//    rank (each element is updated by one rank with the same kernel, then copied); so with deterministic mode
//    (ExactSum) a sharded run is bitwise the unsharded one, at any world size;
//  - it composes with every reduction policy (the gradients are DDP's, complete on every rank: clip_grad_norm
//    and the non-finite checks see them as without sharding);
//  - state() is this rank's pieces (ParameterState::begin); consolidated_state() (collective) is the full state,
//    which is what save_checkpoint writes; load_state() takes a full state and keeps this rank's pieces, so a
//    checkpoint written at one world size (sharded or not) resumes at any other, re-cut at load;
//  - stage 2: between backward and step() the gradients are DDP's, complete (clipping, GradScaler and the
//    non-finite checks see them whole); step() then zeroes each bucket's gradients outside this rank's slice and
//    hands their pages back, so from one step's end to the next backward a rank holds 1/world_size of the
//    gradients (gradient_bytes(), to within the two pages at each end of a slice). Backward writes them all
//    again: the peak is not lowered, the memory between steps (forward, data loading, evaluation) is. Call
//    zero_grad() before each step's backward, as the loop does: accumulating into a released gradient would add
//    to zeros where stage 1 adds to the last round's average.
// Cost: one all-gather per bucket after each step (the parameters' bytes), on the caller's thread; stage 2 adds
// the madvise calls (no copies).
// Under OwnerReduce (a DDP that leaves the gradients local; ranks sharing one address space) the optimizer does
// the reduction itself: for each bucket, a cache-sized chunk at a time, it averages its slice from every rank's
// gradients (the threads backend's all-reduce arithmetic, bit for bit) into a buffer that stays in cache, runs the
// optimizer's kernel on the chunk from it and copies the updated parameters into every rank's replica; step()
// ends with a barrier, after which every replica holds the new parameters. No all-reduce, no all-gather, and the
// averaged gradient never goes to memory. The weights and state are bitwise those under AverageAllReduce. After
// the step a rank's gradients are its own local ones (stage 1), or (stage 2) the average in its slices and nothing
// elsewhere.
// Built from a DistributedDataParallel it attaches to it (attachment.hpp) for its lifetime, declaring that it shards
// the state (stage 1 or 2) and, under OwnerReduce, that it reduces the gradients: the composition rules
// (composition.hpp) then refuse what does not compose with that (ddp::join, a second reducing optimizer, stage 0).
template <class O, Communicator C>
class ZeroRedundancyOptimizer : public DdpHook {
 public:
  using value_type = typename O::value_type;
  using space = typename O::space;
  using T = value_type;
  using S = space;
  struct options_type {
    typename O::options_type optimizer{};
    ZeroOptions zero{};
  };
  static_assert(ShardableOptimizer<O, T, S>,
                "ZeroRedundancyOptimizer: the optimizer must take (arena, options, optim::ArenaShard) and report "
                "state_bytes() (optim::basic_sgd, basic_adam_l2, basic_adamw do)");

  ZeroRedundancyOptimizer(nn::ParameterArena<T, S> const& arena, BucketPlan const& plan, C& comm, options_type opt)
      : comm_(&comm),
        zero_(checked(opt.zero)),
        arena_(arena),
        buckets_(detail::zero_buckets(plan, arena, comm.world_size())),
        inner_(arena, opt.optimizer, shard(buckets_, zero_, comm.rank())) {
    if (zero_.stage == 2 && !host_accessible_v<S>)
      throw ArgumentError(
          "ZeroRedundancyOptimizer: stage 2 hands the gradient pages outside this rank's slices back to the system, "
          "which needs memory the host addresses (host tensors, or device tensors on Thrust's CPU systems). On CUDA "
          "use stage 1");
    unsharded_bytes_ = static_cast<std::int64_t>(inner_.state().buffer_names.size()) * arena_.numel() *
                       static_cast<std::int64_t>(sizeof(T));
    std::int64_t widest = 0;
    for (auto const& b : buckets_) widest = std::max(widest, b.chunk);
    if (sharded()) {
      send_ = Tensor<T, S>(Shape{widest});
      gathered_ = Tensor<T, S>(Shape{widest * comm.world_size()});
      Kernels<S>::fill(widest, T(0), send_.data());
    }
  }
  // Over a DistributedDataParallel's parameters, plan and communicator (build it after the wrapper, as any
  // optimizer).
  template <class D>
  requires requires(D& d, DdpHook& h) {
    { d.parameters() } -> std::convertible_to<nn::ParameterArena<T, S> const&>;
    { d.plan() } -> std::convertible_to<BucketPlan const&>;
    { d.comm() } -> std::same_as<C&>;
    { d.attach(h) } -> std::same_as<Attachment>;
  }
  ZeroRedundancyOptimizer(D& ddp, options_type opt)
      : ZeroRedundancyOptimizer(ddp.parameters(), ddp.plan(), ddp.comm(), opt) {
    if constexpr (requires { D::reduces_gradients; }) {
      if constexpr (!D::reduces_gradients) {
        static_assert(SharedAddressSpace<C>,
                      "ZeroRedundancyOptimizer under OwnerReduce reads every rank's gradients and writes every "
                      "rank's parameters directly: it needs ranks that share one address space (ThreadsBackend). "
                      "Across processes use AverageAllReduce (or a compressed policy) with ZeroRedundancyOptimizer");
        static_assert(host_accessible_v<S>,
                      "ZeroRedundancyOptimizer under OwnerReduce needs memory the host addresses (host tensors, or "
                      "device tensors on Thrust's CPU systems)");
        reduces_ = true;
        attachment_ = ddp.attach(*this);  // refused, the same on every rank, before any collective
        take_reduction(ddp);
        return;
      }
    }
    attachment_ = ddp.attach(*this);
  }

  ZeroRedundancyOptimizer(ZeroRedundancyOptimizer const&) = delete;
  ZeroRedundancyOptimizer& operator=(ZeroRedundancyOptimizer const&) = delete;
  ~ZeroRedundancyOptimizer() = default;

  // How it appears to the composition rules (composition.hpp).
  HookTraits traits() const override {
    Capabilities caps;
    if (zero_.stage >= 1) caps = caps | Capability::kShardsState;
    if (reduces_) caps = caps | Capability::kReducesGradients;
    return {.name = "ZeroRedundancyOptimizer", .caps = caps};
  }

  // The state kind is the optimizer's: a checkpoint of a sharded run loads into an unsharded one and back.
  static std::string name() { return O::name(); }

  // Collective when sharded (every rank, the same steps): updates this rank's slices, then all-gathers every
  // bucket's parameters.
  void step() {
    if (owner_reduces()) {
      for (auto const& z : buckets_) reduce_and_update({z.start, z.start + z.numel});
      complete_step();
      return;
    }
    inner_.step();
    if (sharded()) gather_parameters();
    release_gradients();
  }
  // step() in two parts, for OverlappedOptimizer (overlapped_update.hpp): this rank's slices of the whole
  // parameters in arena elements `window` (no communication), then, once every bucket was updated, the
  // all-gathers (collective when sharded).
  void update(optim::ArenaShard::Range window) {
    if (owner_reduces())
      reduce_and_update(window);
    else
      inner_.update(window);
  }
  void complete_step() {
    if (owner_reduces()) {
      if (comm_->world_size() > 1) comm_->barrier();  // every replica holds every slice; peers are done reading
    } else if (sharded()) {
      gather_parameters();
    }
    release_gradients();
  }
  void zero_grad() { inner_.zero_grad(); }
  double lr() const noexcept { return inner_.lr(); }
  void set_lr(double lr) { inner_.set_lr(lr); }
  O const& optimizer() const noexcept { return inner_; }
  ZeroOptions const& zero_options() const noexcept { return zero_; }
  // Whether step() shards (stage 1 or 2 on more than one rank): ddp::join refuses such an optimizer.
  bool sharded() const noexcept { return zero_.stage >= 1 && comm_->world_size() > 1; }
  // Whether this optimizer reduces the gradients itself (built from a DDP under OwnerReduce).
  bool owner_reduces() const noexcept { return !peer_grads_.empty(); }

  // Optimizer-state bytes on this rank, and what the unsharded optimizer would hold.
  std::int64_t state_bytes() const noexcept { return inner_.state_bytes(); }
  std::int64_t unsharded_state_bytes() const noexcept { return unsharded_bytes_; }
  // Gradient bytes resident on this rank (the pages of the arena's gradients in memory now: after a stage-2
  // step, its slices' and the pages at their ends; otherwise every gradient page backward wrote), and the
  // arena's gradient bytes (what stage 0 and 1 keep). Host-addressable memory only; elsewhere the whole size.
  std::int64_t gradient_bytes() const {
    auto const& g = arena_.grads();
    std::size_t const bytes = static_cast<std::size_t>(g.numel()) * sizeof(T);
    if constexpr (host_accessible_v<S>)
      return static_cast<std::int64_t>(std::min(bytes, detail::resident_bytes(g.data(), bytes)));
    else
      return static_cast<std::int64_t>(bytes);
  }
  std::int64_t unsharded_gradient_bytes() const noexcept {
    return arena_.grads().numel() * static_cast<std::int64_t>(sizeof(T));
  }
  // Parameter bytes this rank sends per step in the all-gathers (its slice of every bucket, padded).
  std::int64_t gather_bytes() const noexcept {
    std::int64_t n = 0;
    if (sharded() && !owner_reduces())
      for (auto const& b : buckets_) n += b.chunk;
    return n * static_cast<std::int64_t>(sizeof(T));
  }
  // What was composed, for logs: the stage, the state this rank holds and what the all-gathers send.
  std::string describe() const {
    if (zero_.stage == 0)
      return detail::cat("ZeRO-0 (unsharded) ", O::name(), ": optimizer state ", state_bytes(), " bytes on each rank");
    return detail::cat("ZeRO-", zero_.stage, " ", O::name(), " over ", comm_->world_size(), " ranks: optimizer state ",
                       state_bytes(), " bytes on rank ", comm_->rank(), " (unsharded: ", unsharded_state_bytes(),
                       owner_reduces() ? std::string("), its slices reduced from every rank's gradients and their "
                                                     "parameters written to every replica (OwnerReduce)")
                                       : detail::cat("), parameter all-gathers ", gather_bytes(), " bytes a step"),
                       zero_.stage == 2 && sharded() ? "; gradients outside its slices released after each step" : "");
  }

  // This rank's pieces (sharded) or the whole state.
  optim::OptimizerState<T> state() const { return inner_.state(); }
  // Collective when sharded: every rank's pieces, put together (one all-gather of host copies).
  optim::OptimizerState<T> consolidated_state() const {
    auto mine = inner_.state();
    if (!sharded()) return mine;
    int const world = comm_->world_size();
    std::size_t const nb = mine.buffer_names.size();
    std::vector<std::vector<optim::detail::StatePiece>> pieces;  // per rank
    std::size_t widest = 0;
    for (int q = 0; q < world; ++q) {
      auto const ranges = detail::zero_ranges(buckets_, q);
      pieces.push_back(optim::detail::state_pieces(arena_, ranges));
      widest = std::max(widest, static_cast<std::size_t>(optim::detail::shard_numel(ranges)) * nb);
    }
    std::vector<T> flat(widest, T(0)), all(widest * static_cast<std::size_t>(world));
    std::size_t at = 0;
    for (auto const& p : mine.parameters)
      for (auto const& b : p.buffers)
        at = static_cast<std::size_t>(std::copy(b.begin(), b.end(), flat.begin() + at) - flat.begin());
    host_all_gather(*comm_, std::span<T const>(flat), std::span<T>(all), CollectiveTag{"zero.state"});
    for (auto& p : mine.parameters) {
      p.begin = 0;
      for (auto& b : p.buffers) b.assign(static_cast<std::size_t>(optim::detail::numel_of(p.shape)), T(0));
    }
    for (int q = 0; q < world; ++q) {
      T const* src = all.data() + static_cast<std::size_t>(q) * widest;
      for (std::size_t i = 0; i < mine.parameters.size(); ++i) {
        auto const& piece = pieces[static_cast<std::size_t>(q)][i];
        for (std::size_t b = 0; b < nb; ++b, src += piece.numel)
          std::copy(src, src + piece.numel, mine.parameters[i].buffers[b].begin() + piece.begin);
      }
    }
    return mine;
  }
  // A full state (ArgumentError naming the parameter otherwise; nothing changes): this rank keeps its pieces.
  void load_state(optim::OptimizerState<T> const& st) { inner_.load_state(st); }

 private:
  static ZeroOptions checked(ZeroOptions z) {
    if (z.stage < 0 || z.stage > 2)
      throw ArgumentError(
          detail::cat("ZeroRedundancyOptimizer: stage must be 0 (unsharded), 1 (optimizer state sharded) or 2 (and the "
                      "gradients kept only for this rank's slices after each step), got ",
                      z.stage));
    return z;
  }
  static optim::ArenaShard shard(std::vector<detail::ZeroBucket> const& buckets, ZeroOptions z, int rank) {
    if (z.stage == 0) return {};
    return optim::ArenaShard(detail::zero_ranges(buckets, rank));
  }
  // Stage 2, after the step: each bucket's gradients outside this rank's slice are zeroed and their whole pages
  // handed back (nothing reads them until the next backward writes them again).
  void release_gradients() {
    if constexpr (host_accessible_v<S>) {
      if (zero_.stage != 2 || !sharded()) return;
      T* const grads = arena_.grads().data();
      for (auto const& z : buckets_) {
        auto const mine = detail::zero_slice(z, comm_->rank());
        std::int64_t const lo = z.start, hi = z.start + z.numel;
        std::int64_t const own_lo = std::clamp(mine.begin, lo, hi), own_hi = std::clamp(mine.end, own_lo, hi);
        detail::zero_and_release(grads + lo, static_cast<std::size_t>(own_lo - lo) * sizeof(T));
        detail::zero_and_release(grads + own_hi, static_cast<std::size_t>(hi - own_hi) * sizeof(T));
      }
    }
  }
  // OwnerReduce: every rank's gradient and parameter addresses (one all-gather of pointers, valid in the shared
  // address space), the micro-batch divisor, and the DDP told that this optimizer reduces.
  template <class D>
  void take_reduction(D& ddp) {
    int const world = comm_->world_size();
    std::vector<std::int64_t> mine{static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(arena_.grads().data())),
                                   static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(arena_.values().data()))};
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(world));
    if (world > 1)
      host_all_gather(*comm_, std::span<std::int64_t const>(mine), std::span<std::int64_t>(all),
                      CollectiveTag{"zero.owner_addresses"});
    else
      all = mine;
    for (std::size_t q = 0; q < static_cast<std::size_t>(world); ++q) {
      peer_grads_.push_back(reinterpret_cast<T const*>(static_cast<std::uintptr_t>(all[2 * q])));
      peer_values_.push_back(reinterpret_cast<T*>(static_cast<std::uintptr_t>(all[2 * q + 1])));
    }
    micro_batches_ = ddp.micro_batches_per_rank();
    chunk_ = Tensor<T, S>(Shape{kOwnerChunk});
  }
  // OwnerReduce: this rank's slices of the parameters in arena elements `window`, each chunk averaged from every
  // rank's gradients into a buffer that stays in cache (rank order, then the micro-batch divisor: AverageAllReduce's
  // all-reduce and reducer, bit for bit), stepped from it, and copied into every other replica. Stage 2 also keeps
  // the average in this rank's gradients (its slices are the gradients it keeps); stage 1 does not write it back,
  // the memory traffic the policy saves. Windows larger than kStreamBytes go to the peers with streaming stores:
  // the peers' lines are not in this core's cache, and a plain store would first read each one from memory.
  void reduce_and_update(optim::ArenaShard::Range window) {
    int const world = comm_->world_size(), rank = comm_->rank();
    T* const scratch = chunk_.data();
    T* const grads = arena_.grads().data();
    T* const values = arena_.values().data();
    bool const keep = zero_.stage == 2;
    bool const stream = (window.end - window.begin) * static_cast<std::int64_t>(sizeof(T)) >= kStreamBytes;
    inner_.update(window, [&](std::int64_t off, std::int64_t n, T const*, auto&& run) {
      for (std::int64_t i = 0; i < n; i += kOwnerChunk) {
        std::int64_t const o = off + i, k = std::min(kOwnerChunk, n - i);
        auto const bytes = static_cast<std::size_t>(k) * sizeof(T);
        detail::reduce_piece<detail::PlusOp, true>(scratch, peer_grads_.data(), world, static_cast<std::size_t>(o),
                                                   static_cast<std::size_t>(k));
        if (micro_batches_ > 1) Kernels<S>::axpby(k, T(1) / T(micro_batches_), scratch, T(0), scratch);
        if (keep) std::memcpy(grads + o, scratch, bytes);
        run(o, k, static_cast<T const*>(scratch));
        for (int q = 0; q < world; ++q) {
          if (q == rank) continue;
          if (stream)
            detail::stream_copy(peer_values_[static_cast<std::size_t>(q)] + o, values + o, bytes);
          else
            std::memcpy(peer_values_[static_cast<std::size_t>(q)] + o, values + o, bytes);
        }
      }
    });
    if (stream) detail::stream_fence();  // before the barrier that lets the peers read them
  }

  void gather_parameters() {
    int const world = comm_->world_size(), rank = comm_->rank();
    T* const values = arena_.values().data();
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      auto const& z = buckets_[b];
      auto const mine = detail::zero_slice(z, rank);
      std::int64_t const n = std::max<std::int64_t>(0, mine.end - mine.begin);
      if (n > 0) Kernels<S>::copy(n, values + mine.begin, send_.data());
      if (n < z.chunk) Kernels<S>::fill(z.chunk - n, T(0), send_.data() + n);
      comm_->all_gather(SpaceSpan<T const, S>(send_.data(), static_cast<std::size_t>(z.chunk)),
                        SpaceSpan<T, S>(gathered_.data(), static_cast<std::size_t>(z.chunk * world)),
                        CollectiveTag{"zero.parameters", static_cast<std::int64_t>(b)});
      Kernels<S>::copy(z.numel, gathered_.data(), values + z.start);
    }
  }

  C* comm_;
  ZeroOptions zero_;
  nn::ParameterArena<T, S> arena_;
  std::vector<detail::ZeroBucket> buckets_;
  O inner_;
  std::int64_t unsharded_bytes_ = 0;
  Tensor<T, S> send_, gathered_;  // one slice, and one bucket's world_size slices (sharded only)
  bool reduces_ = false;          // built from a DDP under OwnerReduce: it reduces the gradients
  // OwnerReduce only: every rank's gradients and parameters (rank order; empty otherwise), the divisor for a sum
  // of micro-batch gradients and one chunk of averaged gradients.
  static constexpr std::int64_t kOwnerChunk = static_cast<std::int64_t>(detail::kReduceChunk<T>);
  static constexpr std::int64_t kStreamBytes = std::int64_t{4} << 20;
  std::vector<T const*> peer_grads_;
  std::vector<T*> peer_values_;
  std::int64_t micro_batches_ = 1;
  Tensor<T, S> chunk_;
  Attachment attachment_;  // to the DDP it was built from, if any (destroyed first)
};

}  // namespace ddp
