// DDP with buckets compressed to bfloat16 / float16 (CompressedAllReduce), written once over any Communicator:
// run inside doctest on the threads backend and under mpirun (ddp_mpi_main.cpp). Each throws
// std::runtime_error on failure.
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "test/parallel/ddp_cases.hpp"

namespace ddp::test {

// How the backend adds 16-bit floats (comm/communicator.hpp).
enum class HalfSum {
  kFloatOnce,  // every rank's share in float, rounded once: threads, MPI's shared-memory all-reduce on one node
  kPairwise,   // rounded after each addition, in the backend's order: MPI_Allreduce across nodes, NCCL
};

// One step: every rank's DDP gradient must equal what the wire promises: each rank's own gradient g_r scaled by
// 1/world and rounded to H, summed over ranks, rounded to H, back to float. kFloatOnce: bit for bit the float sum
// in rank order rounded once. kPairwise: within one rounding of H per addition of that value (the order is the
// backend's). The own gradients come from a plain copy of the model on the same rows, gathered over the
// communicator. The bucket all-reduces must travel as H: the recorded collectives carry H's dtype, and their
// element counts are the buckets' (half the bytes of float).
template <HalfFloat H, AsyncCommunicator C>
void compressed_gradients_exact(C& inner, BucketConfig buckets, HalfSum sum = HalfSum::kFloatOnce) {
  Recording<C> comm(inner);
  int const n = comm.world_size(), r = comm.rank();
  auto data = make_data(4 * n, 8, 4, 7);
  auto model = make_mlp(8, 32, 4, 1);
  auto plain = make_mlp(8, 32, 4, 1);
  nn::ParameterArena<float> plain_params(plain);
  DistributedDataParallel<decltype(model), Recording<C>, SizeCapped, CompressedAllReduce<H>> ddp(
      model, comm, {}, {.bucketer = SizeCapped{buckets}});
  comm.clear();
  Tensor<float> const x = rows(data.x, 4 * r, 4), y = rows(data.y, 4 * r, 4);
  ddp.parameters().zero_grad();
  backward(mse_loss(ddp(Var(x)), y));
  plain_params.zero_grad();
  backward(mse_loss(plain(Var(x)), y));

  std::vector<float> const mine = [&] {
    std::vector<float> g;
    for (auto const& e : plain_params.entries())
      for (std::int64_t i = 0; i < e.numel; ++i) g.push_back(plain_params.grads().data()[e.offset + i]);
    return g;
  }();
  std::vector<float> all(mine.size() * static_cast<std::size_t>(n));
  if (n > 1)
    inner.all_gather(std::span<float const>(mine), std::span<float>(all));
  else
    all = mine;
  float const inv = 1.0f / static_cast<float>(n);
  std::size_t k = 0;
  for (auto const& e : ddp.parameters().entries()) {
    for (std::int64_t i = 0; i < e.numel; ++i, ++k) {
      float acc = 0, mag = 0;
      for (int q = 0; q < n; ++q) {
        float const share = float(H(all[static_cast<std::size_t>(q) * mine.size() + k] * inv));
        acc += share;
        mag += std::abs(share);
      }
      float const want = float(H(acc));
      float const got = ddp.parameters().grads().data()[e.offset + i];
      // Pairwise: each of the n - 1 additions rounds by at most half an ulp of a partial sum (<= mag).
      float const ulp = mag * (std::same_as<H, bfloat16> ? 0x1p-8f : 0x1p-11f);
      bool const ok = n == 1                       ? got == mine[k]
                      : sum == HalfSum::kFloatOnce ? got == want
                                                   : std::abs(got - want) <= static_cast<float>(n) * ulp;
      if (!ok)
        throw std::runtime_error(detail::cat("rank ", r, " of ", n, ": ", H::name, " gradient of '", e.name, "'[", i,
                                             "] is ", got, ", the wire's sum gives ", n == 1 ? mine[k] : want));
    }
  }
  // One all-reduce per bucket, as H, counting the bucket's gradients and status words (none on one rank).
  std::size_t reduces = 0;
  for (auto const& rec : comm.records()) {
    if (rec.op != CollectiveKind::kAllReduce || rec.tag.label != "bucket") continue;
    auto const& b = ddp.plan().buckets[static_cast<std::size_t>(rec.tag.id)];
    expect(rec.dtype == dtype_of<H>, detail::cat("bucket ", rec.tag.id, " travelled as ", name(rec.dtype)));
    expect(static_cast<std::int64_t>(rec.count) == b.numel + 2 * static_cast<std::int64_t>(b.params.size()) + n,
           detail::cat("bucket ", rec.tag.id, " moved ", rec.count, " elements"));
    ++reduces;
  }
  expect(reduces == (n > 1 ? ddp.plan().buckets.size() : 0), detail::cat(reduces, " bucket all-reduces"));
}

// 30 SGD-momentum steps of the same MLP on B/N rows per rank with reduction R and with float buckets: the mean loss
// of R's run over the last 10 steps is within `loss_rel` (relative) of the float run's. Returns the weight
// difference relative to max(1, max|w|), for the caller to bound.
template <class R, AsyncCommunicator C>
double compressed_training(C& comm, R reduction, double loss_rel = 1e-2) {
  int const n = comm.world_size(), r = comm.rank();
  std::int64_t const local = 16 / n;
  auto data = make_data(16 * 30, 8, 4, 99);
  auto run = [&](auto& ddp, auto& opt, std::vector<float>& losses) {
    for (int s = 0; s < 30; ++s) {
      std::int64_t const base = s * 16 + r * local;
      opt.zero_grad();
      auto loss = mse_loss(ddp(Var(rows(data.x, base, local))), rows(data.y, base, local));
      losses.push_back(loss.item());
      backward(loss);
      opt.step();
    }
  };
  auto m32 = make_mlp(8, 32, 4, 1);
  DistributedDataParallel d32(m32, comm);
  optim::SGD o32(d32.parameters(), {.lr = 0.05, .momentum = 0.9});
  auto m16 = make_mlp(8, 32, 4, 1);
  DistributedDataParallel<decltype(m16), C, SizeCapped, R> d16(m16, comm, {}, {.reduction = reduction});
  optim::SGD o16(d16.parameters(), {.lr = 0.05, .momentum = 0.9});
  std::vector<float> l32, l16;
  run(d32, o32, l32);
  run(d16, o16, l16);
  auto a = weights(d16.parameters()), b = weights(d32.parameters());
  double diff = 0, maxw = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, double(std::abs(a[i] - b[i])));
    maxw = std::max(maxw, double(std::abs(b[i])));
  }
  double mean16 = 0, mean32 = 0;  // the last 10 steps' mean loss (fresh rows every step)
  for (std::size_t s = 20; s < 30; ++s) mean16 += l16[s] / 10, mean32 += l32[s] / 10;
  expect(std::abs(mean16 - mean32) <= loss_rel * mean32,
         detail::cat(reduction.name(), ": mean loss of the last 10 steps ", mean16, " against float's ", mean32));
  return diff / std::max(1.0, maxw);
}

// float16 saturates past 65504 * world: a gradient that large arrives as Inf, which NonFinite::kRaise reports on
// every rank, never silently.
template <AsyncCommunicator C>
void fp16_overflow_is_reported(C& comm) {
  auto model = make_mlp(8, 32, 4, 1);
  DistributedDataParallel<decltype(model), C, SizeCapped, Fp16AllReduce> ddp(model, comm,
                                                                             {.non_finite = NonFinite::kRaise});
  auto data = make_data(4, 8, 4, 3);
  ddp.parameters().zero_grad();
  auto loss = mse_loss(ddp(Var(data.x)), data.y);
  // Scale the loss so that fc2's gradients exceed float16's range after the 1/world scaling.
  try {
    backward(scale(loss, 1e9f));
  } catch (DdpError const& e) {
    expect(std::string(e.what()).find("non-finite") != std::string::npos,
           detail::cat("unexpected message: ", e.what()));
    return;
  }
  throw std::runtime_error(detail::cat("rank ", comm.rank(), ": a float16 overflow went unreported"));
}

}  // namespace ddp::test
