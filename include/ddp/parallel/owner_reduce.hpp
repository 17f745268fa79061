// OwnerReduceExchange: the step of ZeroRedundancyOptimizer under the OwnerReduce policy (parallel/policies.hpp), for
// ranks that share one address space. DDP then leaves each rank's gradients local (only the status words cross), and
// the optimizer does the reduction itself: for each bucket, a cache-sized chunk at a time, it averages its slice from
// every rank's gradients (shared_average: the threads backend's all-reduce arithmetic, bit for bit) into a buffer
// that stays in cache, runs the optimizer's kernel on the chunk from it and copies the updated parameters into every
// rank's replica; the step ends with a barrier, after which every replica holds the new parameters. No all-reduce,
// no all-gather, and the averaged gradient never goes to memory. The weights and state are bitwise those under
// AverageAllReduce. After the step a rank's gradients are its own local ones (stage 1), or (stage 2) the average in
// its slices and nothing elsewhere.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/comm/shared_reduce.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/optim/shard.hpp"
#include "ddp/parallel/attachment.hpp"
#include "ddp/parallel/zero_exchange.hpp"
#include "ddp/tensor/memory_space.hpp"
#include "ddp/tensor/stream_copy.hpp"

namespace ddp::detail {

template <class O, Communicator C>
class OwnerReduceExchange final : public ZeroExchange<O> {
  using T = typename O::value_type;
  using S = typename O::space;
  static_assert(SharedAddressSpace<C>,
                "ZeroRedundancyOptimizer under OwnerReduce reads every rank's gradients and writes every rank's "
                "parameters directly: it needs ranks that share one address space (ThreadsBackend). Across processes "
                "use AverageAllReduce (or a compressed policy) with ZeroRedundancyOptimizer");
  static_assert(host_accessible_v<S>,
                "ZeroRedundancyOptimizer under OwnerReduce needs memory the host addresses (host tensors, or device "
                "tensors on Thrust's CPU systems)");

 public:
  // Collective: every rank's gradient and parameter addresses (one all-gather of pointers, valid in the shared
  // address space). `micro_batches`: the divisor of a sum of micro-batch gradients; ZeRO `stage` 2 also writes the
  // average back into this rank's slices.
  OwnerReduceExchange(C& comm, nn::ParameterArena<T, S> const& arena, std::vector<ZeroBucket> buckets,
                      std::int64_t micro_batches, int stage)
      : comm_(&comm),
        arena_(arena),
        buckets_(std::move(buckets)),
        micro_batches_(micro_batches),
        keep_(stage == 2),
        chunk_(Shape{kChunk}) {
    int const world = comm.world_size();
    std::vector<std::int64_t> mine{static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(arena_.grads().data())),
                                   static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(arena_.values().data()))};
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(world));
    if (world > 1)
      host_all_gather(comm, std::span<std::int64_t const>(mine), std::span<std::int64_t>(all),
                      CollectiveTag{"zero.owner_addresses"});
    else
      all = mine;
    for (std::size_t q = 0; q < static_cast<std::size_t>(world); ++q) {
      grads_.push_back(reinterpret_cast<T const*>(static_cast<std::uintptr_t>(all[2 * q])));
      values_.push_back(reinterpret_cast<T*>(static_cast<std::uintptr_t>(all[2 * q + 1])));
    }
  }

  void step(O& inner) override {
    for (auto const& z : buckets_) update(inner, {z.start, z.start + z.numel});
    complete();
  }
  // This rank's slices of the parameters in `window`, each chunk averaged from every rank's gradients into a buffer
  // that stays in cache (rank order, then the micro-batch divisor: AverageAllReduce's all-reduce and reducer, bit for
  // bit), stepped from it, and copied into every other replica. Stage 2 also keeps the average in this rank's
  // gradients (its slices are the gradients it keeps); stage 1 does not write it back, the memory traffic the policy
  // saves. Windows larger than kStreamBytes go to the peers with streaming stores: the peers' lines are not in this
  // core's cache, and a plain store would first read each one from memory.
  void update(O& inner, optim::ArenaShard::Range window) override {
    int const world = comm_->world_size(), rank = comm_->rank();
    T* const scratch = chunk_.data();
    T* const grads = arena_.grads().data();
    T* const values = arena_.values().data();
    bool const stream = (window.end - window.begin) * static_cast<std::int64_t>(sizeof(T)) >= kStreamBytes;
    inner.update(window, [&](std::int64_t off, std::int64_t n, T const*, auto&& run) {
      for (std::int64_t i = 0; i < n; i += kChunk) {
        std::int64_t const o = off + i, k = std::min(kChunk, n - i);
        auto const bytes = static_cast<std::size_t>(k) * sizeof(T);
        shared_average(scratch, std::span<T const* const>(grads_), static_cast<std::size_t>(o),
                       static_cast<std::size_t>(k));
        if (micro_batches_ > 1) Kernels<S>::axpby(k, T(1) / T(micro_batches_), scratch, T(0), scratch);
        if (keep_) std::memcpy(grads + o, scratch, bytes);
        run(o, k, static_cast<T const*>(scratch));
        for (int q = 0; q < world; ++q) {
          if (q == rank) continue;
          if (stream)
            stream_copy(values_[static_cast<std::size_t>(q)] + o, values + o, bytes);
          else
            std::memcpy(values_[static_cast<std::size_t>(q)] + o, values + o, bytes);
        }
      }
    });
    if (stream) stream_fence();  // before the barrier that lets the peers read them
  }
  // Every replica holds every slice; the peers are done reading.
  void complete() override {
    if (comm_->world_size() > 1) comm_->barrier();
  }
  std::int64_t sent_bytes() const noexcept override { return 0; }
  std::string describe() const override {
    return "its slices reduced from every rank's gradients and their parameters written to every replica "
           "(OwnerReduce)";
  }
  Capabilities caps() const noexcept override { return Capability::kReducesGradients; }

 private:
  static constexpr std::int64_t kChunk = static_cast<std::int64_t>(kSharedAverageChunk<T>);
  static constexpr std::int64_t kStreamBytes = std::int64_t{4} << 20;

  C* comm_;
  nn::ParameterArena<T, S> arena_;
  std::vector<ZeroBucket> buckets_;
  std::int64_t micro_batches_;
  bool keep_;
  Tensor<T, S> chunk_;           // one chunk of averaged gradients
  std::vector<T const*> grads_;  // every rank's gradients, rank order
  std::vector<T*> values_;       // every rank's parameters
};

}  // namespace ddp::detail
