// DeterministicDataParallel<Model, Comm, Bucketer>: data parallelism whose gradients, and so whose weights
// after any number of steps, are bitwise identical for every world size that divides its number of
// micro-batches, for any bucket cap, on every host backend (threads, MPI). Guarantee and costs:
// docs/deterministic.md.
//
// How: every global batch is split into V micro-batches of equal size (V fixed by the options, not by the
// world size). Each micro-batch's gradient is computed on its own, so no GEMM ever sums over a number of
// samples that depends on the world size. The V gradients are then added exactly: each parameter gets a
// shared exponent (the max over ranks of its largest |gradient| element, one small all-reduce), every
// micro-batch gradient is rounded once to a 64-bit integer multiple of 2^(e - 62 + ceil(log2 V)), and the
// integers are summed locally and across ranks (integer addition is associative: any all-reduce algorithm,
// bucket layout or rank count gives the same sum). The mean is converted back to T once.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "ddp/autograd/backward.hpp"
#include "ddp/autograd/sample_key.hpp"
#include "ddp/bucket/plan.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "ddp/parallel/verify.hpp"

namespace ddp {

struct DeterministicOptions {
  // V: micro-batches per global batch. The world size must divide it; each rank computes V / world_size of
  // them per step, one after another. Results are identical across world sizes only for the same V.
  std::int64_t micro_batches = 8;
};

// The compile-time choice of reduction, for code that picks a data-parallel wrapper by policy:
//   data_parallel_t<Deterministic, Model, Comm>  bitwise identical across world sizes (this header)
//   data_parallel_t<Overlapped, Model, Comm>     the fast default: DistributedDataParallel (overlapped buckets)
struct Deterministic {};
struct Overlapped {};

template <nn::Model M, Communicator C, GradientBucketer B = SizeCapped>
class DeterministicDataParallel {
 public:
  using value_type = typename M::value_type;
  using space = typename M::space;
  using T = value_type;
  using S = space;
  using V = Variable<T, S>;

  static_assert(std::same_as<S, HostSpace>,
                "DeterministicDataParallel works on host (Eigen) tensors; device models use "
                "DistributedDataParallel, whose results are deterministic for a fixed world size only");
  static_assert(std::is_floating_point_v<T>, "DeterministicDataParallel: parameters must be float or double");

  DeterministicDataParallel(M& model, C& comm, DeterministicOptions opts = {}, B bucketer = {})
      : model_(&model), comm_(&comm), opts_(opts), bucketer_(std::move(bucketer)) {
    using Arena = nn::ParameterArena<T, S>;
    int const world = comm.world_size();
    if (opts_.micro_batches < 1)
      throw ArgumentError(
          detail::cat("DeterministicDataParallel: micro_batches must be at least 1, got ", opts_.micro_batches));
    if (opts_.micro_batches % world != 0)
      throw ArgumentError(detail::cat("DeterministicDataParallel: the world size ", world,
                                      " does not divide micro_batches = ", opts_.micro_batches,
                                      "; choose a number of micro-batches that every world size you run divides "
                                      "(e.g. 8 for 1, 2, 4 and 8 ranks)"));
    per_rank_ = opts_.micro_batches / world;
    auto const named = model.named_parameters();
    auto const all = Arena::unique_all(named);
    auto const params = Arena::trainable(named);
    std::vector<detail::ParamSignature> sigs;
    for (auto const& p : all) sigs.push_back({p.name, p.var.shape(), !p.var.requires_grad()});
    if (world > 1) detail::verify_parameters_match(comm, sigs);
    if (auto const* p = Arena::find_packed(params))
      throw ArgumentError(detail::cat("DeterministicDataParallel: parameter '", p->name,
                                      "' is already packed in a live ParameterArena (an optimizer built before "
                                      "wrapping the model?). Construct the optimizer after the wrapper, from "
                                      "parameters()."));
    arena_ = Arena(params);
    // The integer sums travel in buckets of the bucketer's plan (8-byte elements); any plan gives the same bits.
    std::vector<std::int64_t> numels;
    for (auto const& e : arena_.entries()) numels.push_back(e.numel);
    plan_ = bucketer_.plan(numels, sizeof(std::int64_t));
    if (world > 1) detail::verify_plan_match(comm, plan_, bucketer_.name());
    if (world > 1) {
      std::int64_t i = 0;
      for (auto const& p : all) {
        Tensor<T, S> const& v = p.var.node().value;
        comm.broadcast(std::span<T>(v.data(), static_cast<std::size_t>(v.numel())), 0, CollectiveTag{"det.param", i++});
      }
      i = 0;
      for (auto& b : model.named_buffers())
        comm.broadcast(std::span<T>(b.tensor.data(), static_cast<std::size_t>(b.tensor.numel())), 0,
                       CollectiveTag{"det.buffer", i++});
    }
    std::size_t const n = static_cast<std::size_t>(arena_.numel());
    held_.assign(static_cast<std::size_t>(per_rank_ - 1) * n, T(0));
    sums_.assign(n + static_cast<std::size_t>(opts_.micro_batches), 0);
    words_.assign(2 * arena_.count(), 0);
    // |q| <= 2^bits for each of V terms, so the sum stays within int64: V * 2^bits <= 2^62.
    bits_ = 62 - static_cast<int>(std::bit_width(static_cast<std::uint64_t>(opts_.micro_batches - 1)));
  }

  DeterministicDataParallel(DeterministicDataParallel const&) = delete;
  DeterministicDataParallel& operator=(DeterministicDataParallel const&) = delete;

  // For the optimizer (built after this wrapper).
  nn::ParameterArena<T, S>& parameters() noexcept { return arena_; }
  M& module() noexcept { return *model_; }
  C& comm() noexcept { return *comm_; }
  BucketPlan const& plan() const noexcept { return plan_; }
  std::int64_t micro_batches() const noexcept { return opts_.micro_batches; }
  std::int64_t micro_batches_per_rank() const noexcept { return per_rank_; }

  // One step's gradients. `x` holds this rank's share of the global batch: rows [r * rows, (r + 1) * rows) of
  // it for rank r, i.e. micro-batches r * V/W ... (r + 1) * V/W - 1 in order (GlobalBatchSampler gives that
  // split); `y` holds the matching targets (same first dimension). loss(out, y_rows) returns a scalar mean
  // over the micro-batch. `step` keys counter-based randomness (dropout masks depend on the step and each
  // sample's position in the global batch, not on the rank): pass the global step, the same on every rank.
  // Afterwards every parameter's gradient is the mean over the V micro-batches of their gradients, bitwise the
  // same on every rank and for every world size dividing V. Returns the mean of the V micro-batch losses (also
  // bitwise the same). Non-finite gradients raise a DdpError naming the parameters, on every rank alike.
  template <class Y, class Loss>
  double compute_gradients(std::uint64_t step, Tensor<T, S> const& x, Y const& y, Loss&& loss) {
    std::int64_t const rows = x.shape().rank() == 0 ? 0 : x.shape()[0];
    if (rows == 0 || rows % per_rank_ != 0)
      throw ShapeError(detail::cat("DeterministicDataParallel: rank ", comm_->rank(), "'s batch has ", rows,
                                   " rows (shape ", x.shape(), "), which is not ", per_rank_,
                                   " equal micro-batches (micro_batches ", opts_.micro_batches, " / world size ",
                                   comm_->world_size(), ")"));
    if (y.shape().rank() == 0 || y.shape()[0] != rows)
      throw ShapeError(
          detail::cat("DeterministicDataParallel: targets of shape ", y.shape(), " for ", rows, " input rows"));
    std::int64_t const m = rows / per_rank_;
    std::int64_t const first = comm_->rank() * rows;  // this rank's first sample within the global batch
    std::size_t const n = static_cast<std::size_t>(arena_.numel());
    std::size_t const np = arena_.count();
    std::fill(words_.begin(), words_.end(), std::numeric_limits<std::int64_t>::min());
    losses_.assign(static_cast<std::size_t>(per_rank_), 0.0);
    T* const grads = arena_.grads().data();

    // 1. Each micro-batch's gradient, on its own; all but the last are kept aside.
    for (std::int64_t j = 0; j < per_rank_; ++j) {
      arena_.zero_grad();
      {
        SampleKeyScope key({.step = step, .first_sample = first + j * m});
        V out = (*model_)(V(rows_of(x, j * m, m)));
        V l = loss(out, rows_of(y, j * m, m));
        backward(l);
        losses_[static_cast<std::size_t>(j)] = static_cast<double>(l.value().data()[0]);
      }
      arena_.materialize_grads();  // parameters this micro-batch did not reach: zeros
      if (j + 1 < per_rank_) std::copy(grads, grads + n, held_.begin() + static_cast<std::ptrdiff_t>(j * n));
      note_magnitudes(grads);
    }

    // 2. Shared exponents: the max over ranks of each parameter's exponent; non-finite flags likewise.
    comm_->all_reduce(std::span<std::int64_t>(words_), ReduceOp::kMax, CollectiveTag{"det.exponents", -1});
    std::string bad;
    for (std::size_t p = 0; p < np; ++p)
      if (words_[np + p] > 0) bad += detail::cat(bad.empty() ? "'" : ", '", arena_.entries()[p].name, "'");
    if (!bad.empty())
      throw DdpError(detail::cat("DeterministicDataParallel: non-finite gradients (NaN or Inf) at step ", step,
                                 " in parameter", bad.find(',') == std::string::npos ? " " : "s ", bad,
                                 " (on some rank); every rank raises this"));

    // 3. Exact sums: each micro-batch gradient as an integer multiple of its parameter's quantum; then 4. the
    // mean, converted back once. One micro-batch on one rank: both in one pass, nothing to add or exchange.
    if (comm_->world_size() == 1 && per_rank_ == 1) {
      for (std::size_t p = 0; p < np; ++p) {
        auto const& e = arena_.entries()[p];
        double const scale = std::ldexp(1.0, shift(p));
        double const factor = std::ldexp(1.0, -shift(p)) / static_cast<double>(opts_.micro_batches);
        T* const g = grads + e.offset;
        for (std::int64_t i = 0; i < e.numel; ++i)
          g[i] = static_cast<T>(static_cast<double>(quantize(g[i], scale)) * factor);
      }
      return mean_loss(losses_);
    }
    for (std::size_t p = 0; p < np; ++p) {
      auto const& e = arena_.entries()[p];
      // Locals and restrict: an int64 store through acc could otherwise alias e.numel, which keeps the loops
      // scalar (a reload per element).
      std::int64_t const numel = e.numel;
      double const scale = std::ldexp(1.0, shift(p));
      std::int64_t* __restrict const acc = sums_.data() + e.offset;
      T const* __restrict const last = grads + e.offset;
      for (std::int64_t i = 0; i < numel; ++i) acc[i] = quantize(last[i], scale);
      for (std::int64_t j = 0; j + 1 < per_rank_; ++j) {
        T const* __restrict const g =
            held_.data() + static_cast<std::size_t>(j) * n + static_cast<std::size_t>(e.offset);
        for (std::int64_t i = 0; i < numel; ++i) acc[i] += quantize(g[i], scale);
      }
    }
    // The losses ride along after the gradients: micro-batch m's slot holds its loss's bits on the rank that
    // computed it and 0 elsewhere, so the integer sum delivers every loss exactly.
    std::int64_t* const slots = sums_.data() + n;
    std::fill(slots, slots + opts_.micro_batches, 0);
    for (std::int64_t j = 0; j < per_rank_; ++j)
      slots[comm_->rank() * per_rank_ + j] = std::bit_cast<std::int64_t>(losses_[static_cast<std::size_t>(j)]);
    if (comm_->world_size() > 1) {
      for (std::size_t b = 0; b < plan_.buckets.size(); ++b) {
        auto const& bucket = plan_.buckets[b];
        std::int64_t const lo = bucket.params.empty() ? 0 : arena_.entries()[bucket.params.front()].offset;
        bool const last_bucket = b + 1 == plan_.buckets.size();  // it ends at the arena's end: the slots follow
        auto const count = static_cast<std::size_t>(bucket.numel + (last_bucket ? opts_.micro_batches : 0));
        comm_->all_reduce(std::span<std::int64_t>(sums_.data() + lo, count), ReduceOp::kSum,
                          CollectiveTag{"det.bucket", static_cast<std::int64_t>(b)});
      }
      if (plan_.buckets.empty())
        comm_->all_reduce(std::span<std::int64_t>(slots, static_cast<std::size_t>(opts_.micro_batches)), ReduceOp::kSum,
                          CollectiveTag{"det.bucket", 0});
    }
    for (std::size_t p = 0; p < np; ++p) {
      auto const& e = arena_.entries()[p];
      std::int64_t const numel = e.numel;
      double const factor = std::ldexp(1.0, -shift(p)) / static_cast<double>(opts_.micro_batches);
      std::int64_t const* __restrict const acc = sums_.data() + e.offset;
      T* __restrict const g = grads + e.offset;
      for (std::int64_t i = 0; i < numel; ++i) g[i] = static_cast<T>(static_cast<double>(acc[i]) * factor);
    }
    std::vector<double> all(static_cast<std::size_t>(opts_.micro_batches));
    for (std::size_t k = 0; k < all.size(); ++k) all[k] = std::bit_cast<double>(slots[k]);
    return mean_loss(all);
  }

 private:
  // The mean of the V micro-batch losses, added in micro-batch order.
  double mean_loss(std::vector<double> const& all) const {
    double total = 0;
    for (double v : all) total += v;
    return total / static_cast<double>(opts_.micro_batches);
  }

  // Exponent of the smallest quantum used for an all-zero parameter (keeps 2^shift finite in double).
  static constexpr int kFloorExponent = -200;

  // Rows [lo, lo + count) of a tensor whose first dimension indexes samples: a view, no copy.
  template <class U>
  static Tensor<U, S> rows_of(Tensor<U, S> const& t, std::int64_t lo, std::int64_t count) {
    std::vector<std::int64_t> dims;
    for (int d = 0; d < t.shape().rank(); ++d) dims.push_back(d == 0 ? count : t.shape()[d]);
    std::int64_t const per_row = t.shape().numel_from(1);
    return Tensor<U, S>::view(t.owner(), const_cast<U*>(t.data()) + lo * per_row,
                              Shape::from_range(dims.begin(), dims.end()));
  }

  // Running max of each parameter's exponent (words_[p]) and its non-finite flag (words_[np + p]). The
  // largest magnitude is found on the bit patterns (IEEE magnitudes order like unsigned integers, and NaN and
  // Inf sit above every finite value): one vectorised integer max per parameter.
  void note_magnitudes(T const* grads) {
    using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    constexpr Bits kMagnitude = ~Bits(0) >> 1;
    constexpr Bits kInfinity = std::bit_cast<Bits>(std::numeric_limits<T>::infinity());
    std::size_t const np = arena_.count();
    for (std::size_t p = 0; p < np; ++p) {
      auto const& e = arena_.entries()[p];
      T const* g = grads + e.offset;
      Bits top = 0;
      for (std::int64_t i = 0; i < e.numel; ++i) top = std::max(top, std::bit_cast<Bits>(g[i]) & kMagnitude);
      bool const finite = top < kInfinity;
      int exp = kFloorExponent;
      if (finite && top != 0) std::frexp(static_cast<double>(std::bit_cast<T>(top)), &exp);  // max < 2^exp
      words_[p] = std::max<std::int64_t>(words_[p], std::max(exp, kFloorExponent));
      words_[np + p] = std::max<std::int64_t>(words_[np + p], finite ? 0 : 1);
    }
  }

  // Quantum of parameter p: 2^-shift; every |gradient| < 2^e maps to |q| <= 2^bits_.
  int shift(std::size_t p) const noexcept { return bits_ - static_cast<int>(words_[p]); }

  // Round to nearest (ties away from zero), branch-free so the loops vectorise. x * scale is exact (scale is a
  // power of two, far from overflow); adding ±0.5 is exact below 2^52 for T's significand, and above it x is
  // already an integer that the addition leaves unchanged.
  static std::int64_t quantize(T g, double scale) noexcept {
    double const x = static_cast<double>(g) * scale;
    return static_cast<std::int64_t>(x + std::copysign(0.5, x));
  }

  M* model_;
  C* comm_;
  DeterministicOptions opts_;
  B bucketer_;
  nn::ParameterArena<T, S> arena_;
  BucketPlan plan_;
  std::int64_t per_rank_ = 1;
  int bits_ = 62;
  std::vector<T> held_;              // gradients of this step's earlier micro-batches
  std::vector<std::int64_t> sums_;   // the exact sums, laid out as the arena, then V loss slots
  std::vector<std::int64_t> words_;  // per parameter: exponent, then non-finite flag
  std::vector<double> losses_;       // this rank's micro-batch losses
};

namespace detail {
template <class Policy, class M, class C>
struct DataParallelFor;
template <class M, class C>
struct DataParallelFor<Deterministic, M, C> {
  using type = DeterministicDataParallel<M, C>;
};
template <class M, class C>
struct DataParallelFor<Overlapped, M, C> {
  using type = DistributedDataParallel<M, C>;
};
}  // namespace detail

template <class Policy, class M, class C>
using data_parallel_t = typename detail::DataParallelFor<Policy, M, C>::type;

}  // namespace ddp
