// The bucket plan: a pure function of parameter sizes and a config that groups gradients into buckets
// for all-reduce (reverse registration order, a small first bucket, a size cap: PyTorch's defaults).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ddp/error.hpp"

namespace ddp {

// A bucket is a run of parameters that are consecutive in reverse registration order, so in the
// parameter arena (laid out in that order) its gradients are one contiguous slice.
struct Bucket {
  std::vector<std::size_t> params;  // registration indices, in the order backward usually finishes them
  std::int64_t numel = 0;           // gradient elements
};

struct BucketPlan {
  std::vector<Bucket> buckets;         // launch order
  std::vector<std::size_t> bucket_of;  // registration index -> bucket
};

// PyTorch's defaults: bucket_cap_mb = 25, and a first bucket of 1 MiB so communication starts early.
inline constexpr std::size_t kDefaultBucketCapBytes = std::size_t{25} << 20;
inline constexpr std::size_t kDefaultFirstBucketBytes = std::size_t{1} << 20;

struct BucketConfig {
  std::size_t cap_bytes = kDefaultBucketCapBytes;
  std::size_t first_cap_bytes = kDefaultFirstBucketBytes;
};

// Walks parameters from last registered to first, adding each to the open bucket; the bucket closes as
// soon as its size reaches the cap (the first bucket's cap is first_cap_bytes, later ones cap_bytes).
// So a parameter larger than the cap sits alone, and cap 0 gives one bucket per parameter.
// Deterministic and backend-free: every rank computes the same plan from the same sizes.
inline BucketPlan assign_buckets(std::span<std::int64_t const> numels, std::size_t element_bytes,
                                 BucketConfig cfg = {}) {
  if (element_bytes == 0) throw ArgumentError("assign_buckets: element_bytes must be positive");
  BucketPlan plan;
  plan.bucket_of.assign(numels.size(), 0);
  Bucket open;
  std::size_t open_bytes = 0;
  for (std::size_t k = numels.size(); k-- > 0;) {
    if (numels[k] < 0)
      throw ArgumentError(detail::cat("assign_buckets: parameter ", k, " has negative size ", numels[k]));
    open.params.push_back(k);
    open.numel += numels[k];
    open_bytes += static_cast<std::size_t>(numels[k]) * element_bytes;
    std::size_t const cap = plan.buckets.empty() ? cfg.first_cap_bytes : cfg.cap_bytes;
    if (open_bytes >= cap) {
      for (auto p : open.params) plan.bucket_of[p] = plan.buckets.size();
      plan.buckets.push_back(std::move(open));
      open = Bucket{};
      open_bytes = 0;
    }
  }
  if (!open.params.empty()) {
    for (auto p : open.params) plan.bucket_of[p] = plan.buckets.size();
    plan.buckets.push_back(std::move(open));
  }
  return plan;
}

// What is wrong with `plan` as a plan for parameters of `numels` elements (registration order), or "" if
// nothing: every parameter in exactly one bucket (and bucket_of saying which), no empty bucket, each bucket's
// parameters consecutive in reverse registration order (so its gradients are one contiguous slice of the
// arena, which is laid out in that order), and each bucket's numel their sum. A plan from a user's
// GradientBucketer that breaks any of these would reduce the wrong elements.
inline std::string plan_defect(BucketPlan const& plan, std::span<std::int64_t const> numels) {
  std::size_t const np = numels.size();
  if (plan.bucket_of.size() != np)
    return detail::cat("bucket_of has ", plan.bucket_of.size(), " entries for ", np, " parameters");
  std::vector<int> seen(np, 0);
  for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
    auto const& bucket = plan.buckets[b];
    if (bucket.params.empty()) return detail::cat("bucket ", b, " is empty");
    std::int64_t numel = 0;
    for (std::size_t k = 0; k < bucket.params.size(); ++k) {
      std::size_t const p = bucket.params[k];
      if (p >= np) return detail::cat("bucket ", b, " names parameter ", p, " of ", np);
      if (seen[p]++) return detail::cat("parameter ", p, " is in more than one bucket (again in bucket ", b, ")");
      if (plan.bucket_of[p] != b)
        return detail::cat("bucket_of[", p, "] is ", plan.bucket_of[p], " but bucket ", b, " holds parameter ", p);
      if (k > 0 && p + 1 != bucket.params[k - 1])
        return detail::cat("bucket ", b, " holds parameters ", bucket.params[k - 1], " and then ", p,
                           ": a bucket's parameters must be consecutive in reverse registration order (", p + 1,
                           " follows ", bucket.params[k - 1],
                           "), so that its gradients are one contiguous slice; the plan has a gap there");
      numel += numels[p];
    }
    if (numel != bucket.numel)
      return detail::cat("bucket ", b, " says it holds ", bucket.numel, " elements, its parameters hold ", numel);
  }
  for (std::size_t p = 0; p < np; ++p)
    if (!seen[p]) return detail::cat("parameter ", p, " is in no bucket");
  return {};
}

// GradientBucketer: a policy that turns parameter sizes into a plan and can say what it is.
template <class B>
concept GradientBucketer = requires(B const& b, std::span<std::int64_t const> numels) {
  { b.plan(numels, std::size_t{4}) } -> std::same_as<BucketPlan>;
  { b.name() } -> std::convertible_to<std::string>;
};

// The default policy: size-capped buckets (PyTorch's scheme), configured at run time.
struct SizeCapped {
  BucketConfig config{};
  BucketPlan plan(std::span<std::int64_t const> numels, std::size_t element_bytes) const {
    return assign_buckets(numels, element_bytes, config);
  }
  std::string name() const {
    return detail::cat("SizeCapped{cap=", config.cap_bytes, "B, first=", config.first_cap_bytes, "B}");
  }
};

// One bucket per parameter (most all-reduces, earliest start); the same as SizeCapped with cap 0.
struct PerParameter {
  BucketPlan plan(std::span<std::int64_t const> numels, std::size_t element_bytes) const {
    return assign_buckets(numels, element_bytes, {.cap_bytes = 0, .first_cap_bytes = 0});
  }
  std::string name() const { return "PerParameter"; }
};

// Everything in one bucket (fewest all-reduces, no overlap with backward).
struct SingleBucket {
  BucketPlan plan(std::span<std::int64_t const> numels, std::size_t element_bytes) const {
    std::size_t const inf = ~std::size_t{0};
    return assign_buckets(numels, element_bytes, {.cap_bytes = inf, .first_cap_bytes = inf});
  }
  std::string name() const { return "SingleBucket"; }
};

static_assert(GradientBucketer<SizeCapped> && GradientBucketer<PerParameter> && GradientBucketer<SingleBucket>);

}  // namespace ddp
