// The one spelling of how an example reduces gradients: --deterministic with --micro-batches (ExactSum +
// MicroBatches) and --comm-hook none|bf16|fp16|powersgd[:rank] with --powersgd-warmup (AverageAllReduce,
// CompressedAllReduce or PowerSgd), and what the optimizer makes of them (--zero, --overlap-update), their checks, and the dispatch from the flags to DistributedDataParallel's
// policies.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include <ddp/ddp.hpp>

#include "examples/common/flags.hpp"

namespace ddp::examples {

struct ReductionChoice {
  bool deterministic = false;         // --deterministic: ExactSum + MicroBatches{micro_batches}
  std::int64_t micro_batches = 8;     // --micro-batches
  std::string comm_hook = "none";     // --comm-hook: none (float buckets), bf16, fp16 or powersgd
  PowerSgdOptions powersgd{};         // --comm-hook powersgd[:rank], --powersgd-warmup
  int zero = 0;                       // --zero: ZeRO stage of the optimizer (ZeroRedundancyOptimizer)
  UpdateAt update = UpdateAt::kStep;  // --overlap-update: kBucketReduced (OverlappedOptimizer)
};

inline Flags& add_reduction_flags(Flags& f) {
  return f
      .add("deterministic", "false",
           "bitwise-identical training for every world size dividing --micro-batches (prints a digest of the "
           "final weights)")
      .add("micro-batches", "8", "with --deterministic: micro-batches per global batch (a multiple of the world size)")
      .add("comm-hook", "none",
           "how gradient buckets travel: none (float), bf16 or fp16 (cast to 16 bits, half the bytes; "
           "CompressedAllReduce), or powersgd[:rank] (rank-r factors of each large matrix; rank 1 by default; "
           "PowerSgd)")
      .add("powersgd-warmup", "100", "with --comm-hook powersgd: plain all-reduces per bucket before compressing")
      .add("zero", "0",
           "ZeRO stage: 0 (every rank keeps the whole optimizer state), 1 (each rank keeps and updates its slice "
           "of every bucket, then the parameters are all-gathered; ZeroRedundancyOptimizer) or 2 (and after each "
           "step keeps only its slices' gradients; host tensors)")
      .add("overlap-update", "false",
           "step each bucket's parameters as soon as its reduction lands, while later buckets are still in flight "
           "(OverlappedOptimizer; the same weights, bit for bit)");
}

// "powersgd" or "powersgd:R" (R >= 1): PowerSGD's rank, or nullopt for any other hook.
inline std::optional<std::int64_t> powersgd_rank(Flags const& f) {
  std::string const v = f.str("comm-hook");
  if (v == "powersgd") return 1;
  if (v.rfind("powersgd:", 0) != 0) return std::nullopt;
  std::string const r = v.substr(9);
  char* end = nullptr;
  errno = 0;
  long long const x = std::strtoll(r.c_str(), &end, 10);
  if (r.empty() || *end != '\0' || errno == ERANGE || x < 1)
    throw ArgumentError(
        detail::cat(f.program(), ": --comm-hook powersgd:RANK needs a rank of at least 1, got '", r, "'"));
  return x;
}

// Reads the flags; ArgumentError for a combination that cannot work. `world_size` 0: taken at launch (DDP checks
// the micro-batch count there, on every rank).
inline ReductionChoice reduction_choice(Flags const& f, int world_size, std::int64_t global_batch) {
  auto const rank = powersgd_rank(f);
  ReductionChoice c{.deterministic = f.boolean("deterministic"),
                    .micro_batches = f.at_least("micro-batches", 1),
                    .comm_hook = rank ? "powersgd" : f.str("comm-hook"),
                    .powersgd = {.rank = rank.value_or(1), .warmup_steps = f.at_least("powersgd-warmup", 0)}};
  if (c.comm_hook != "none" && c.comm_hook != "bf16" && c.comm_hook != "fp16" && !rank)
    throw ArgumentError(detail::cat(f.program(), ": --comm-hook must be one of none|bf16|fp16|powersgd[:rank], got '",
                                    c.comm_hook, "'"));
  std::string const zero = f.str("zero");
  if (zero == "3")
    throw ArgumentError(detail::cat(f.program(),
                                    ": --zero 3: stage 3 (parameters sharded too) is not built; stage 2 shards "
                                    "the optimizer state and keeps each rank's slices of the gradients. Use --zero 2"));
  if (zero != "0" && zero != "1" && zero != "2")
    throw ArgumentError(detail::cat(f.program(), ": --zero must be 0, 1 or 2, got '", zero, "'"));
  c.zero = zero[0] - '0';
  c.update = f.boolean("overlap-update") ? UpdateAt::kBucketReduced : UpdateAt::kStep;
  if (!rank && f.is_set("powersgd-warmup"))
    throw ArgumentError(
        detail::cat(f.program(), ": --powersgd-warmup is for --comm-hook powersgd; --comm-hook is ", c.comm_hook));
  if (c.deterministic && ((world_size != 0 && c.micro_batches % world_size != 0) || global_batch % c.micro_batches))
    throw ArgumentError(detail::cat(f.program(), ": --deterministic needs the world size (", world_size,
                                    ") to divide --micro-batches (", c.micro_batches,
                                    ") and --micro-batches to divide --batch-size (", global_batch, ")"));
  if (c.deterministic && c.comm_hook != "none")
    throw ArgumentError(detail::cat(f.program(), ": --comm-hook ", c.comm_hook, " with --deterministic: ",
                                    rank ? "PowerSGD's low-rank factors are sums in floating point, whose bits depend "
                                           "on the world size"
                                         : "its exact sums would depend on the world size once each rank's share is "
                                           "rounded to 16 bits",
                                    "; drop one of them"));
  return c;
}

// Calls fn(reduction, batching) with the policies the flags chose. kAll false: only the default composition is
// instantiated (a program's device build, which rejects the other flags at parse time and so keeps its nvcc
// translation unit at one DDP type per optimizer).
template <bool kAll, class F>
void with_reduction(ReductionChoice const& c, F&& fn) {
  if constexpr (kAll) {
    if (c.deterministic) return fn(ExactSum{}, MicroBatches{.count = c.micro_batches});
    if (c.comm_hook == "bf16") return fn(Bf16AllReduce{}, OnePass{});
    if (c.comm_hook == "fp16") return fn(Fp16AllReduce{}, OnePass{});
    if (c.comm_hook == "powersgd") return fn(PowerSgd{c.powersgd}, OnePass{});
  }
  fn(AverageAllReduce{}, OnePass{});
}

}  // namespace ddp::examples
