// Cross-rank checks DDP runs at construction: same parameters (count, names, shapes) and same bucket plan
// on every rank. A mismatch raises the same error on every rank instead of a hang or silent corruption.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "ddp/bucket/plan.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/tensor/shape.hpp"

namespace ddp {

namespace detail {

struct ParamSignature {
  std::string name;
  Shape shape;
  bool frozen = false;  // requires_grad false: broadcast at construction, never reduced
};

inline constexpr std::size_t kNameWords = 12;                 // 96 bytes of name per parameter
inline constexpr std::size_t kSigWords = 1 + 4 + kNameWords;  // rank, dims[4], name

inline constexpr std::int64_t kFrozenBit = 1 << 8;  // in word 0, above the rank (<= 4)

inline void encode(ParamSignature const& p, std::int64_t* out) {
  std::fill(out, out + kSigWords, std::int64_t{0});
  out[0] = p.shape.rank() + (p.frozen ? kFrozenBit : 0);
  for (int d = 0; d < p.shape.rank(); ++d) out[1 + d] = p.shape[d];
  std::memcpy(out + 5, p.name.data(), std::min(p.name.size(), kNameWords * 8));
}
inline ParamSignature decode(std::int64_t const* in) {
  ParamSignature p;
  char buf[kNameWords * 8 + 1] = {};
  std::memcpy(buf, in + 5, kNameWords * 8);
  p.name = buf;
  p.frozen = (in[0] & kFrozenBit) != 0;
  std::vector<std::int64_t> dims(in + 1, in + 1 + std::clamp<std::int64_t>(in[0] & (kFrozenBit - 1), 0, 4));
  p.shape = Shape::from_range(dims.begin(), dims.end());
  return p;
}

// All ranks exchange their parameter lists; every rank then finds the same first difference (lowest
// parameter index, then lowest rank) and throws the same DdpError naming it and both shapes.
template <Communicator C>
void verify_parameters_match(C& comm, std::vector<ParamSignature> const& mine) {
  int const n = comm.world_size();
  std::vector<std::int64_t> count{static_cast<std::int64_t>(mine.size())}, counts(static_cast<std::size_t>(n));
  host_all_gather(comm, std::span<std::int64_t const>(count), std::span<std::int64_t>(counts),
                  CollectiveTag{"ddp.param_count"});
  std::int64_t const pmax = *std::max_element(counts.begin(), counts.end());
  std::vector<std::int64_t> local(static_cast<std::size_t>(pmax) * kSigWords, 0);
  for (std::size_t i = 0; i < mine.size(); ++i) encode(mine[i], local.data() + i * kSigWords);
  std::vector<std::int64_t> all(local.size() * static_cast<std::size_t>(n));
  host_all_gather(comm, std::span<std::int64_t const>(local), std::span<std::int64_t>(all),
                  CollectiveTag{"ddp.param_shapes"});
  auto at = [&](int r, std::int64_t i) { return all.data() + (static_cast<std::size_t>(r) * pmax + i) * kSigWords; };
  for (std::int64_t i = 0; i < pmax; ++i) {
    for (int r = 1; r < n; ++r) {
      bool const has0 = i < counts[0], hasr = i < counts[static_cast<std::size_t>(r)];
      if (has0 && hasr && std::equal(at(0, i), at(0, i) + kSigWords, at(r, i))) continue;
      if (!has0 && !hasr) continue;
      std::string msg = detail::cat("DistributedDataParallel: the model differs across ranks at parameter ", i, ": ");
      auto describe = [&](int rank, bool has) {
        if (!has)
          return detail::cat("rank ", rank, " has only ", counts[static_cast<std::size_t>(rank)], " parameters");
        auto p = decode(at(rank, i));
        return detail::cat("rank ", rank, " has '", p.name, "'", p.frozen ? " (frozen)" : "", " with shape ", p.shape);
      };
      msg += describe(0, has0) + ", " + describe(r, hasr) +
             ". Every rank must build the same model (same layers, order and sizes) before wrapping it.";
      throw DdpError(msg);
    }
  }
}

// A well-formed plan (plan_defect), and the same plan everywhere (a rank with a different bucket cap would
// all-reduce different slices). One all-gather: every rank learns whether each rank's plan is well formed and
// which plan it holds, so every rank raises the same kind of error, naming the defect and the ranks.
template <Communicator C>
void verify_plan(C& comm, BucketPlan const& plan, std::span<std::int64_t const> numels, std::string const& policy) {
  std::string const defect = plan_defect(plan, numels);
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a over each bucket's (numel, parameters); unsigned wraps
  for (auto const& b : plan.buckets) {
    h = (h ^ static_cast<std::uint64_t>(b.numel)) * 1099511628211ULL;
    for (auto const p : b.params) h = (h ^ static_cast<std::uint64_t>(p)) * 1099511628211ULL;
  }
  std::vector<std::int64_t> mine{static_cast<std::int64_t>(plan.buckets.size()), static_cast<std::int64_t>(h),
                                 defect.empty() ? 0 : 1};
  int const world = comm.world_size();
  std::vector<std::int64_t> all(3 * static_cast<std::size_t>(world));
  if (world > 1)
    host_all_gather(comm, std::span<std::int64_t const>(mine), std::span<std::int64_t>(all),
                    CollectiveTag{"ddp.bucket_plan"});
  else
    all = mine;
  std::string bad;
  for (int r = 0; r < world; ++r)
    if (all[3 * r + 2]) bad += detail::cat(bad.empty() ? "" : ", ", r);
  if (!bad.empty())
    throw ArgumentError(
        detail::cat("DistributedDataParallel: the bucket plan of ", policy, " is malformed on rank(s) ", bad,
                    defect.empty() ? std::string() : ": " + defect,
                    ". Fix the GradientBucketer's plan() (bucket/plan.hpp: plan_defect says what a plan "
                    "must satisfy), or use SizeCapped."));
  for (int r = 1; r < world; ++r)
    if (all[3 * r] != all[0] || all[3 * r + 1] != all[1])
      throw DdpError(detail::cat("DistributedDataParallel: the bucket plan differs across ranks (rank 0: ", all[0],
                                 " buckets, rank ", r, ": ", all[3 * r], " buckets; this rank uses ", policy,
                                 "). Pass the same bucket configuration on every rank."));
}

// An arena made before wrapping (say, an optimizer's) would keep updating storage the model no longer reads once
// DistributedDataParallel re-packs the parameters: refused, the same on every rank (same model everywhere).
template <class T, MemorySpace S>
void refuse_packed(std::vector<nn::NamedParameter<T, S>> const& params) {
  if (auto const* p = nn::ParameterArena<T, S>::find_packed(params))
    throw ArgumentError(cat("DistributedDataParallel: parameter '", p->name,
                            "' is already packed in a live ParameterArena (an optimizer built before wrapping the "
                            "model?). Wrapping re-packs the parameters, so that optimizer would update orphaned "
                            "copies. Construct the optimizer after DistributedDataParallel, from ddp.parameters()."));
}

// The bucketer's plan for `params` (their registration order), checked well-formed and the same on every rank.
template <class Bk, class P>
BucketPlan verified_plan(Communicator auto& comm, Bk const& bucketer, std::vector<P> const& params,
                         std::size_t element_bytes) {
  std::vector<std::int64_t> numels;
  for (auto const& p : params) numels.push_back(p.var.numel());
  BucketPlan plan = bucketer.plan(numels, element_bytes);
  verify_plan(comm, plan, numels, bucketer.name());
  return plan;
}

}  // namespace detail
}  // namespace ddp
