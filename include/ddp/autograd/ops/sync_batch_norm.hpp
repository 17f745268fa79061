// sync_batch_norm2d: batch_norm2d whose training statistics are those of every rank's batch together (one
// all-gather in forward, one all-reduce in backward), through a BatchStatsExchange hook.
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <span>
#include <vector>

#include "ddp/autograd/ops/batch_norm.hpp"
#include "ddp/autograd/variable.hpp"
#include "ddp/error.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

// How sync_batch_norm2d reaches the other ranks: two collectives over small host buffers of doubles, issued in
// the same order on every rank. The autograd knows nothing of communicators (they sit above it); the layer
// nn::SyncBatchNorm2d binds one. A cheap copyable handle: the backward closure keeps a copy, so whatever it
// refers to must outlive the graph.
template <class X>
concept BatchStatsExchange = std::copyable<X> &&
    requires(X const& x, std::span<double const> in, std::span<double> out) {
  { x.world_size() } -> std::same_as<int>;
  x.all_gather(in, out);  // out.size() == world_size() * in.size(); rank r's block at offset r * in.size()
  x.all_reduce_sum(out);  // in place
};

namespace detail {

// Per-channel statistics of one or more ranks' values: count, mean and M2 = Σ (x - mean)².
struct ChannelMoments {
  double count = 0;
  std::vector<double> mean, m2;
};

// Every rank's (count, mean[C], M2[C]) block, merged in rank order with Chan et al.'s pairwise update (exact in
// exact arithmetic, no cancellation of large sums of squares). Every rank merges the same gathered words in the
// same order, so every rank gets bitwise the same statistics. Ranks with no values drop out.
inline ChannelMoments merge_moments(std::span<double const> blocks, int world, std::int64_t C) {
  ChannelMoments g{0, std::vector<double>(static_cast<std::size_t>(C), 0.0),
                   std::vector<double>(static_cast<std::size_t>(C), 0.0)};
  std::size_t const stride = 1 + 2 * static_cast<std::size_t>(C);
  for (int r = 0; r < world; ++r) {
    double const* b = blocks.data() + static_cast<std::size_t>(r) * stride;
    double const nr = b[0];
    if (nr == 0) continue;
    double const n = g.count + nr;
    for (std::int64_t c = 0; c < C; ++c) {
      double const delta = b[1 + c] - g.mean[c];
      g.mean[c] += delta * (nr / n);
      g.m2[c] += b[1 + C + c] + delta * delta * (g.count * nr / n);
    }
    g.count = n;
  }
  return g;
}

template <class T, MemorySpace S>
Tensor<T, S> channel_tensor(std::vector<T> const& host) {
  Tensor<T, S> t(Shape{static_cast<std::int64_t>(host.size())});
  Kernels<S>::from_host(static_cast<std::int64_t>(host.size()), host.data(), t.data());
  return t;
}
template <class T, MemorySpace S>
std::vector<T> host_copy(Tensor<T, S> const& t) {
  std::vector<T> h(static_cast<std::size_t>(t.numel()));
  Kernels<S>::to_host(t.numel(), t.data(), h.data());
  return h;
}

}  // namespace detail

// x:(N,C,H,W) on each rank, N may differ between ranks (0 too) -> (N,C,H,W). gamma, beta: (C) parameters;
// running_mean, running_var: (C) buffers, updated in place in training.
//
// Training: per channel, over the count = Σ_r N_r·H·W values of all ranks, y = gamma (x - mean) / sqrt(var + eps)
// + beta with the biased variance; the running estimates move by `momentum` towards the mean and the unbiased
// variance (PyTorch's BatchNorm2d/SyncBatchNorm semantics). Forward: each rank computes its count, mean and M2
// (two passes, in double) and one all-gather of 2C+1 doubles per rank carries them; every rank merges them
// identically (merge_moments), so statistics, outputs' normalisation and running estimates are bitwise the same
// on every rank. Backward: one all-reduce (sum) of [Σ dy | Σ dy·x̂] (2C doubles), then the usual input gradient
// with the global count. gamma/beta receive this rank's own sums, as in PyTorch: summed (or, under DDP,
// averaged) over ranks they are the global batch's gradients; see nn::SyncBatchNorm2d.
// Evaluation: batch_norm2d with the running statistics; no communication.
//
// Every rank must call it with the same C and, in training, run backward through it when any rank does (the
// collectives must match); a global count below 2 is a ShapeError on every rank.
template <class T, MemorySpace S, BatchStatsExchange X>
Variable<T, S> sync_batch_norm2d(Variable<T, S> const& x, Variable<T, S> const& gamma, Variable<T, S> const& beta,
                                 Tensor<T, S> const& running_mean, Tensor<T, S> const& running_var, Mode mode,
                                 X const& exchange, BatchNormArgs args = {}) {
  if (mode != Mode::kTrain) return batch_norm2d(x, gamma, beta, running_mean, running_var, mode, args);
  using K = Kernels<S>;
  Shape const& xs = x.shape();
  if (xs.rank() != 4) throw ShapeError(detail::cat("sync_batch_norm2d: input must be (N,C,H,W), got ", xs));
  std::int64_t const N = xs[0], C = xs[1], HW = xs[2] * xs[3];
  Shape const cs{C};
  if (!(gamma.shape() == cs) || !(beta.shape() == cs) || !(running_mean.shape() == cs) || !(running_var.shape() == cs))
    throw ShapeError(detail::cat("sync_batch_norm2d: input has ", C,
                                 " channels but gamma/beta/running stats have shapes ", gamma.shape(), ", ",
                                 beta.shape(), ", ", running_mean.shape(), ", ", running_var.shape()));
  int const world = exchange.world_size();
  auto const uC = static_cast<std::size_t>(C);

  // This rank's moments: batchnorm_fwd_train's two passes (in double) give the mean and the unbiased variance
  // (y is scratch here, overwritten below).
  Tensor<T, S> y(xs);
  std::int64_t const count = N * HW;
  std::vector<double> mine(1 + 2 * uC), all(static_cast<std::size_t>(world) * (1 + 2 * uC));
  {
    Tensor<T, S> local_mean(cs), local_invstd(cs), local_var(cs);
    K::batchnorm_fwd_train(N, C, HW, x.value().data(), static_cast<T const*>(nullptr), static_cast<T const*>(nullptr),
                           T(args.eps), y.data(), local_mean.data(), local_invstd.data(), local_var.data());
    auto const m = detail::host_copy(local_mean), v = detail::host_copy(local_var);
    mine[0] = double(count);
    for (std::size_t c = 0; c < uC; ++c) {
      mine[1 + c] = double(m[c]);
      mine[1 + uC + c] = count > 1 ? double(v[c]) * double(count - 1) : 0.0;
    }
  }
  exchange.all_gather(std::span<double const>(mine), std::span<double>(all));
  detail::ChannelMoments const g = detail::merge_moments(all, world, C);
  if (g.count < 2)
    throw ShapeError(detail::cat("sync_batch_norm2d: training needs more than one value per channel over all ", world,
                                 " ranks, got ", std::int64_t(g.count), " (this rank's input ", xs, ")"));

  std::vector<T> mean_h(uC), invstd_h(uC), varu_h(uC);
  for (std::size_t c = 0; c < uC; ++c) {
    mean_h[c] = T(g.mean[c]);
    invstd_h[c] = T(1.0 / std::sqrt(g.m2[c] / g.count + args.eps));
    varu_h[c] = T(g.m2[c] / (g.count - 1));
  }
  auto const mean = detail::channel_tensor<T, S>(mean_h), invstd = detail::channel_tensor<T, S>(invstd_h),
             var_unbiased = detail::channel_tensor<T, S>(varu_h);
  K::batchnorm_fwd_eval(N, C, HW, x.value().data(), gamma.value().data(), beta.value().data(), mean.data(),
                        invstd.data(), y.data());
  T const mo = T(args.momentum);
  K::axpby(C, mo, mean.data(), T(1) - mo, running_mean.data());
  K::axpby(C, mo, var_unbiased.data(), T(1) - mo, running_var.data());

  double const total = g.count;
  return detail::record(
      "sync_batch_norm2d", std::move(y),
      [x, gamma, beta, mean, invstd, invstd_h, exchange, N, C, uC, HW, total](Node<T, S>& self) {
        // This rank's Σ dy and Σ dy·x̂ per channel: its gamma/beta gradients and its share of the global sums.
        Tensor<T, S> sum_g(Shape{C}), sum_gxhat(Shape{C});
        K::batchnorm_bwd(true, N, C, HW, x.value().data(), gamma.value().data(), mean.data(), invstd.data(),
                         self.grad.data(), T(0), static_cast<T*>(nullptr), T(0), sum_gxhat.data(), T(0), sum_g.data());
        if (gamma.requires_grad()) {
          T const b = detail::grad_beta(gamma.node());
          K::axpby(C, T(1), sum_gxhat.data(), b, gamma.node().grad.data());
        }
        if (beta.requires_grad()) {
          T const b = detail::grad_beta(beta.node());
          K::axpby(C, T(1), sum_g.data(), b, beta.node().grad.data());
        }
        if (!x.requires_grad()) return;
        std::vector<double> sums(2 * uC);
        {
          auto const sg = detail::host_copy(sum_g), sgx = detail::host_copy(sum_gxhat);
          for (std::size_t c = 0; c < uC; ++c) sums[c] = double(sg[c]), sums[uC + c] = double(sgx[c]);
        }
        exchange.all_reduce_sum(std::span<double>(sums));
        // dx = gamma·is/n · (n·dy − Σdy − x̂·Σdy·x̂) = A·dy + P·(x − mean) + Q per channel, with
        // A = gamma·is, P = −gamma·is²·Σdy·x̂/n, Q = −gamma·is·Σdy/n (global sums and count).
        auto const gm = detail::host_copy(gamma.value());
        std::vector<T> a(uC), p(uC), q(uC);
        for (std::size_t c = 0; c < uC; ++c) {
          double const ais = double(gm[c]) * double(invstd_h[c]);
          a[c] = T(ais);
          p[c] = T(-ais * double(invstd_h[c]) * sums[uC + c] / total);
          q[c] = T(-ais * sums[c] / total);
        }
        auto const A = detail::channel_tensor<T, S>(a), P = detail::channel_tensor<T, S>(p),
                   Q = detail::channel_tensor<T, S>(q);
        auto& xn = x.node();
        T const bx = detail::grad_beta(xn);
        Tensor<T, S> part = bx == T(0) ? xn.grad : Tensor<T, S>(x.shape());
        // part = P·x + (Q − P·mean), then part += A·dy (batchnorm's evaluation kernels with gamma = 1).
        K::batchnorm_fwd_eval(N, C, HW, x.value().data(), static_cast<T const*>(nullptr), Q.data(), mean.data(),
                              P.data(), part.data());
        K::batchnorm_bwd(false, N, C, HW, x.value().data(), static_cast<T const*>(nullptr), mean.data(), A.data(),
                         self.grad.data(), T(1), part.data(), T(0), static_cast<T*>(nullptr), T(0),
                         static_cast<T*>(nullptr));
        if (bx != T(0)) K::axpby(x.numel(), T(1), part.data(), T(1), xn.grad.data());
      },
      x, gamma, beta);
}

}  // namespace ddp
