// The policies DistributedDataParallel is composed of, besides the GradientBucketer (bucket/plan.hpp):
//  - a reduction policy: what happens to one bucket's gradients (the averaging all-reduce, the same with buckets
//    compressed to 16-bit floats, or deterministic mode's exact fixed-point sum);
//  - a batching policy: how a rank's share of a step is computed (one forward/backward, or a fixed number of
//    micro-batches).
// Each is a small value that names itself for logs; the reduction names the stage class that does the work.
// DdpPolicies (at the end) carries all three to DistributedDataParallel's constructor.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ddp/bucket/exact_reducer.hpp"
#include "ddp/bucket/plan.hpp"
#include "ddp/bucket/powersgd.hpp"
#include "ddp/bucket/reducer.hpp"
#include "ddp/error.hpp"

namespace ddp {

namespace detail {
// The name a WireReduction<W, Config> logs: a 16-bit float's "CompressedAllReduce<bfloat16>", else the tag's
// policy_name (a string, or a function of the config).
template <class W, class Config>
std::string wire_policy_name(Config const& config) {
  if constexpr (HalfFloat<W>)
    return cat("CompressedAllReduce<", W::name, ">");
  else if constexpr (requires { W::policy_name(config); })
    return W::policy_name(config);
  else
    return std::string(W::policy_name);
}
}  // namespace detail

// Reduction through a bucket wire: BucketReducer<T, S, C, W> launches each bucket's collectives as soon as backward
// completes the bucket, overlapping the rest of backward, and the wire W (bucket/wire.hpp) says what travels.
// `options` are the wire's (W's config). The bucket cap counts gradient bytes, as PyTorch's does; none of these is
// world-size-invariant. A wire of your own is a tag plus a BucketWire specialisation (examples/07_custom_wire.cpp),
// and WireReduction<YourTag> is its policy; the tag names it (static policy_name).
template <class W, class Config = NoWireConfig>
struct WireReduction {
  Config options{};
  template <class T, MemorySpace S, AsyncCommunicator C>
  using stage = BucketReducer<T, S, C, W>;
  // Bytes per gradient element the bucket plan is cut for.
  template <class T>
  static constexpr std::size_t element_bytes = sizeof(T);
  // Whether the reduced gradients are the same bits for every world size dividing the micro-batch count.
  static constexpr bool world_size_invariant = false;
  // Whether the stage leaves the reduced gradients in the arena (OwnerReduce's wire does not: the optimizer reduces).
  static constexpr bool reduces_gradients = !std::same_as<W, StatusOnly>;
  Config wire_config() const noexcept { return options; }
  std::string name() const { return detail::wire_policy_name<W>(options); }
};

// Reduction: each bucket is all-reduced with ReduceOp::kAvg in place in the gradient arena. Bitwise identical on
// every rank when the backend's all-reduce is (threads, MPI); another world size or bucket plan sums in another
// order.
using AverageAllReduce = WireReduction<InPlace>;

// Reduction: AverageAllReduce with each bucket cast to a 16-bit float on the wire (H = bfloat16 or float16;
// bucket/wire.hpp), half the bytes of float gradients: gradients scaled by 1/world, cast, summed, cast back. How
// the backends add (comm/communicator.hpp): threads and MPI's shared-memory all-reduce in float, rounded once;
// MPI_Allreduce and NCCL pairwise in H. The optimizer sees float gradients rounded to H's precision (bfloat16:
// 8 bits, float16: 11 bits, and float16 saturates to Inf past 65504 * world: NonFinite catches it). PyTorch's
// fp16_compress_hook / bf16_compress_hook.
template <HalfFloat H>
using CompressedAllReduce = WireReduction<H>;
using Bf16AllReduce = CompressedAllReduce<bfloat16>;
using Fp16AllReduce = CompressedAllReduce<float16>;

// Reduction: PowerSGD (bucket/powersgd.hpp), PyTorch's powerSGD_hook: after `options.warmup_steps` plain rounds, each
// large matrix gradient travels as rank-r factors P and Q (two all-reduces per bucket), with error feedback and warm
// start; vectors and small matrices go uncompressed in the bucket's first piece. On the main job at rank 2, 1/60
// (CNN) to 1/67 (MLP) of float's bytes per compressed round (bench/RESULTS.md). Lossy: deterministic mode refuses it.
using PowerSgd = WireReduction<LowRank, PowerSgdOptions>;

// Reduction: each bucket's gradients stay where backward wrote them and only its status words are all-reduced
// (the desync and unused-parameter checks are unchanged). The ZeroRedundancyOptimizer built from the DDP (stage 1
// or 2; required: a round without one is an error) then reduces each rank's slice of every bucket straight from
// every rank's gradients, a cache-sized chunk at a time, applies its optimizer's kernel to the chunk and writes the
// updated parameters into every rank's replica: the reduce-scatter, the update and the all-gather in one pass, so
// the averaged gradient never makes a trip through memory of its own (bench/RESULTS.md: the wide model's step).
// The reduced values are the backend's all-reduce's bit for bit (comm/detail/reduce.hpp), so the weights are
// AverageAllReduce's with the same optimizer. Needs ranks that share one address space (ThreadsBackend). After the
// step each rank's gradients hold the reduced values in its own slices and its local gradients elsewhere, so
// anything that reads whole gradients between backward and step() (clip_grad_norm, GradScaler, DdpOptions::
// non_finite, ddp::join) does not compose with it; DistributedDataParallel refuses a non-finite check.
using OwnerReduce = WireReduction<StatusOnly>;

// Reduction of deterministic mode: the round's micro-batch gradients are added exactly, as integers, once
// backward is over (ExactReducer; docs/deterministic.md). Bitwise identical for every world size that divides
// the micro-batch count, every bucket plan and every host backend; host tensors only. Inside a step, dropout
// draws its masks from the sample's place in the global batch (SampleKeyScope) instead of a generator's stream.
struct ExactSum {
  template <class T, MemorySpace S, AsyncCommunicator C>
  using stage = ExactReducer<T, S, C>;
  template <class T>
  static constexpr std::size_t element_bytes = sizeof(std::int64_t);  // the plan groups the int64 sums
  static constexpr bool world_size_invariant = true;
  std::string name() const { return "ExactSum"; }
};

template <class R>
concept ReductionPolicy = requires(R const& r) {
  { r.name() } -> std::convertible_to<std::string>;
  { R::world_size_invariant } -> std::convertible_to<bool>;
  { R::template element_bytes<float> } -> std::convertible_to<std::size_t>;
};

// Batching: one forward and backward of the rank's whole share per step (PyTorch's DDP).
struct OnePass {
  std::int64_t per_rank(int /*world_size*/) const noexcept { return 1; }
  std::string name() const { return "OnePass"; }
};

// Batching: every step's global batch is `count` micro-batches of equal size, count / world_size of them on each
// rank, each with its own forward and backward (ddp.micro_batches(...)). The reduction sees the sum of a rank's
// micro-batch gradients and DistributedDataParallel divides by the count, so the result is the global batch's
// mean gradient. A fixed count (not one per rank) is what keeps deterministic mode's results independent of
// the world size; with AverageAllReduce it is gradient accumulation at a fixed micro-batch size.
struct MicroBatches {
  std::int64_t count = 8;
  std::int64_t per_rank(int world_size) const {
    if (count < 1) throw ArgumentError(detail::cat("MicroBatches: count must be at least 1, got ", count));
    if (count % world_size != 0)
      throw ArgumentError(detail::cat("DistributedDataParallel: the world size ", world_size,
                                      " does not divide micro_batches = ", count,
                                      "; choose a number of micro-batches that every world size you run divides "
                                      "(e.g. 8 for 1, 2, 4 and 8 ranks)"));
    return count / world_size;
  }
  std::string name() const { return detail::cat("MicroBatches{", count, "}"); }
};

template <class B>
concept BatchingPolicy = requires(B const& b, int world) {
  { b.per_rank(world) } -> std::same_as<std::int64_t>;
  { b.name() } -> std::convertible_to<std::string>;
};

static_assert(ReductionPolicy<AverageAllReduce> && ReductionPolicy<ExactSum> && ReductionPolicy<Bf16AllReduce> &&
              ReductionPolicy<PowerSgd> && ReductionPolicy<OwnerReduce>);

namespace detail {
// Whether a reduction policy leaves the reduced gradients in the arena (every policy but OwnerReduce).
template <ReductionPolicy R>
inline constexpr bool reduces_gradients = [] {
  if constexpr (requires { R::reduces_gradients; })
    return static_cast<bool>(R::reduces_gradients);
  else
    return true;
}();
}  // namespace detail

namespace detail {
// The options a reduction policy gives its stage's wire (bucket/wire.hpp): PowerSgd's, or none.
template <ReductionPolicy R>
auto wire_config(R const& r) {
  if constexpr (requires { r.wire_config(); })
    return r.wire_config();
  else
    return NoWireConfig{};
}
}  // namespace detail
static_assert(BatchingPolicy<OnePass> && BatchingPolicy<MicroBatches>);

// The policies of one DistributedDataParallel, as one value with designated initializers (the ones left out keep
// their defaults):
//   DistributedDataParallel ddp(model, comm, {}, {.bucketer = SizeCapped{{.cap_bytes = 1 << 20}}});
//   DistributedDataParallel det(model, comm, {}, DdpPolicies{.reduction = ExactSum{}, .batching = MicroBatches{8}});
// (the type is deduced from a DdpPolicies{...} argument; a bare {...} initializes the defaults' types).
template <GradientBucketer B = SizeCapped, ReductionPolicy R = AverageAllReduce, BatchingPolicy Bt = OnePass>
struct DdpPolicies {
  B bucketer{};
  R reduction{};
  Bt batching{};
};

}  // namespace ddp
