// ZeroRedundancyOptimizer (parallel/zero_redundancy.hpp) written once over any Communicator: run inside doctest on
// the threads backend and under mpirun (ddp_mpi_main.cpp). Each throws std::runtime_error on failure.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "test/parallel/ddp_cases.hpp"

namespace ddp::test {

enum class ZeroOpt { kSgdMomentum, kAdamW };

// Trains the MLP 8-48-4 for `steps` steps under reduction R, twice in lockstep on this rank: with the optimizer
// itself and with ZeroRedundancyOptimizer stage 1 over it (both from the same start, on the same rows). Checks,
// on every rank:
//  - the sharded run's weights are bitwise the unsharded run's after every step (each element is updated by
//    its owner with the same kernel, then copied);
//  - the shards partition the parameters' elements: their state elements add up to the parameters' (all
//    ranks), and each rank's state bytes are 1/world of the unsharded optimizer's, within one 64-byte line per
//    bucket and state buffer;
//  - consolidated_state() is bitwise the unsharded optimizer's state(), and loads back;
//  - the collectives: one "zero.parameters" all-gather per bucket after each step (Recording).
template <AsyncCommunicator C, ReductionPolicy R = AverageAllReduce>
void zero_matches_unsharded(C& comm, ZeroOpt which, BucketConfig buckets, int steps = 4, R reduction = {}) {
  int const n = comm.world_size(), r = comm.rank();
  std::int64_t const local = 4;
  auto data = make_data(local * n * steps, 8, 4, 31);
  auto plain_model = make_mlp(8, 48, 4, 5);
  auto zero_model = make_mlp(8, 48, 4, 5);
  Recording<C> rec(comm);
  DistributedDataParallel<Mlp, C, SizeCapped, R> plain_ddp(plain_model, comm, {},
                                                           {.bucketer = SizeCapped{buckets}, .reduction = reduction});
  DistributedDataParallel<Mlp, Recording<C>, SizeCapped, R> zero_ddp(
      zero_model, rec, {}, {.bucketer = SizeCapped{buckets}, .reduction = reduction});
  auto run = [&]<class O>(std::type_identity<O>, typename O::options_type const& o) {
    O plain(plain_ddp.parameters(), o);
    ZeroRedundancyOptimizer<O, Recording<C>> zero(zero_ddp, {.optimizer = o});
    std::size_t const buckets_n = zero_ddp.plan().buckets.size();
    for (int s = 0; s < steps; ++s) {
      Tensor<float> const x = rows(data.x, (s * n + r) * local, local);
      Tensor<float> const y = rows(data.y, (s * n + r) * local, local);
      plain.zero_grad();
      backward(mse_loss(plain_ddp(Var(x)), y));
      plain.step();
      zero.zero_grad();
      backward(mse_loss(zero_ddp(Var(x)), y));
      rec.clear();
      zero.step();
      std::size_t gathers = 0;
      for (auto const& c : rec.records())
        gathers += c.op == CollectiveKind::kAllGather && c.tag.label == "zero.parameters";
      expect(gathers == (n > 1 ? buckets_n : 0), detail::cat("rank ", r, ": step ", s, " issued ", gathers,
                                                             " parameter all-gathers for ", buckets_n, " buckets"));
      expect(weights(zero_ddp.parameters()) == weights(plain_ddp.parameters()),
             detail::cat("rank ", r, ": after step ", s, " the ZeRO-1 weights differ from the unsharded optimizer's"));
    }
    // State: a partition of the parameters' elements, 1/world each within a line per bucket and buffer.
    auto const mine = zero.state();
    std::int64_t elements = 0, buffers = static_cast<std::int64_t>(mine.buffer_names.size());
    for (auto const& p : mine.parameters)
      for (auto const& b : p.buffers) elements += static_cast<std::int64_t>(b.size());
    std::vector<std::int64_t> all(static_cast<std::size_t>(n));
    host_all_gather(comm, std::span<std::int64_t const>(&elements, 1), std::span<std::int64_t>(all));
    std::int64_t total = 0;
    for (auto e : all) total += e;
    expect(total == zero_ddp.parameters().parameter_numel() * buffers,
           detail::cat("rank ", r, ": the ranks' state holds ", total, " elements, the parameters ",
                       zero_ddp.parameters().parameter_numel(), " x ", buffers, " buffers"));
    std::int64_t const line = 64 / sizeof(float), slack = line * buffers * std::int64_t(buckets_n) * 4;
    expect(zero.state_bytes() == elements * 4, detail::cat("rank ", r, ": state_bytes ", zero.state_bytes()));
    expect(zero.state_bytes() <= zero.unsharded_state_bytes() / n + slack,
           detail::cat("rank ", r, ": ", zero.state_bytes(), " state bytes, unsharded ", zero.unsharded_state_bytes(),
                       " over ", n, " ranks"));
    auto const full = zero.consolidated_state();
    expect(full == plain.state(), detail::cat("rank ", r, ": consolidated_state() differs from the unsharded state"));
    zero.load_state(full);
    expect(zero.state() == mine, detail::cat("rank ", r, ": the state reloaded from the consolidated one differs"));
  };
  if (which == ZeroOpt::kSgdMomentum)
    run(std::type_identity<optim::SGD>{}, {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
  else
    run(std::type_identity<optim::AdamW>{}, {.lr = 1e-2, .weight_decay = 0.01});
}

// ZeRO-2 on an MLP 64-2048-64 (1 MB of gradients, buckets of 256 KB): trained in lockstep with stage 1 for
// `steps` SGD-momentum steps. Checks, on every rank:
//  - the weights are bitwise stage 1's after every step, and so is the consolidated state at the end;
//  - after backward every gradient page is resident (gradient_bytes() is the whole arena, less a page at each end);
//  - after step() a rank holds its slices' gradients only: 1/world of the arena, within the partial pages at the
//    ends of its slices and the status words after each bucket (6 pages a bucket, and 2 for the arena's ends);
//  - a stage-2 optimizer on one rank releases nothing (it owns everything).
template <AsyncCommunicator C>
void zero2_keeps_its_slices(C& comm, int steps = 3) {
  int const n = comm.world_size(), r = comm.rank();
  std::int64_t const local = 4;
  auto data = make_data(local * n * steps, 64, 64, 37);
  auto one_model = make_mlp(64, 2048, 64, 7);
  auto two_model = make_mlp(64, 2048, 64, 7);
  SizeCapped const buckets{{.cap_bytes = 256 << 10, .first_cap_bytes = 64 << 10}};
  DistributedDataParallel<Mlp, C> one_ddp(one_model, comm, {}, {.bucketer = buckets});
  DistributedDataParallel<Mlp, C> two_ddp(two_model, comm, {}, {.bucketer = buckets});
  using Zero = ZeroRedundancyOptimizer<optim::SGD, C>;
  optim::SgdOptions const o{.lr = 0.05, .momentum = 0.9};
  Zero one(one_ddp, {.optimizer = o, .zero = {.stage = 1}});
  Zero two(two_ddp, {.optimizer = o, .zero = {.stage = 2}});
  std::int64_t const total = two.unsharded_gradient_bytes(), page = static_cast<std::int64_t>(detail::host_page_size());
  std::int64_t const nb = static_cast<std::int64_t>(two_ddp.plan().buckets.size());
  expect(nb >= 2, detail::cat("rank ", r, ": expected several buckets, got ", nb));
  for (int s = 0; s < steps; ++s) {
    Tensor<float> const x = rows(data.x, (s * n + r) * local, local);
    Tensor<float> const y = rows(data.y, (s * n + r) * local, local);
    one.zero_grad();
    backward(mse_loss(one_ddp(Var(x)), y));
    one.step();
    two.zero_grad();
    backward(mse_loss(two_ddp(Var(x)), y));
    std::int64_t const written = two.gradient_bytes();
    expect(written >= total - 2 * page, detail::cat("rank ", r, ": step ", s, ": after backward only ", written, " of ",
                                                    total, " gradient bytes are resident"));
    two.step();
    expect(weights(two_ddp.parameters()) == weights(one_ddp.parameters()),
           detail::cat("rank ", r, ": after step ", s, " the ZeRO-2 weights differ from ZeRO-1's"));
    std::int64_t const kept = two.gradient_bytes();
    std::int64_t const bound = n == 1 ? total + 2 * page : total / n + (6 * nb + 2) * page;
    expect(kept <= bound, detail::cat("rank ", r, ": step ", s, ": ", kept, " gradient bytes kept of ", total, " on ",
                                      n, " ranks (bound ", bound, ")"));
    if (n > 1)
      expect(kept < total / 2 + (6 * nb + 2) * page,
             detail::cat("rank ", r, ": step ", s, ": ZeRO-2 kept ", kept, " of ", total, " gradient bytes"));
  }
  expect(two.consolidated_state() == one.consolidated_state(),
         detail::cat("rank ", r, ": the ZeRO-2 state differs from ZeRO-1's"));
  expect(two.describe().find(n > 1 ? "gradients outside its slices released after each step" : "ZeRO-2") !=
             std::string::npos,
         "ZeRO-2's describe()");
}

// OwnerReduce (ranks sharing one address space): the MLP 8-`hidden`-4 trained in lockstep under AverageAllReduce with
// the optimizer itself and under OwnerReduce with ZeroRedundancyOptimizer (stage `stage`, UpdateAt `at` through
// OverlappedOptimizer), each step `micro` micro-batches per rank of 4 rows. Checks, on every rank:
//  - the weights are bitwise AverageAllReduce's after every step;
//  - stage 2: in this rank's slices the gradients are AverageAllReduce's reduced gradients, bit for bit;
//  - the consolidated state is the unsharded optimizer's;
//  - only status words crossed the wire (wire_bytes), and describe() names the composition.
template <SharedAddressSpace C>
void owner_reduce_matches(C& comm, ZeroOpt which, BucketConfig buckets, int stage, UpdateAt at, std::int64_t micro,
                          int steps = 4, std::int64_t hidden = 48) {
  int const n = comm.world_size(), r = comm.rank();
  std::int64_t const local = 4 * micro;
  auto data = make_data(local * n * steps, 8, 4, 41);
  auto plain_model = make_mlp(8, hidden, 4, 5);
  auto owner_model = make_mlp(8, hidden, 4, 5);
  using Plain = DistributedDataParallel<Mlp, C, SizeCapped, AverageAllReduce, MicroBatches>;
  using Owner = DistributedDataParallel<Mlp, C, SizeCapped, OwnerReduce, MicroBatches>;
  MicroBatches const mb{.count = micro * n};
  Plain plain_ddp(plain_model, comm, {}, {.bucketer = SizeCapped{buckets}, .batching = mb});
  Owner owner_ddp(owner_model, comm, {}, {.bucketer = SizeCapped{buckets}, .batching = mb});
  expect(owner_ddp.plan().buckets.size() == plain_ddp.plan().buckets.size(), "the same bucket plan");
  auto run = [&]<class O>(std::type_identity<O>, typename O::options_type const& o) {
    using Zero = ZeroRedundancyOptimizer<O, C>;
    O plain(plain_ddp.parameters(), o);
    OverlappedOptimizer<Zero> owner(
        owner_ddp, {.optimizer = {.optimizer = o, .zero = {.stage = stage}}, .overlap = {.update_at = at}});
    expect(owner.optimizer().owner_reduces(), "the ZeRO optimizer reduces under OwnerReduce");
    std::vector<detail::ZeroBucket> const zb = detail::zero_buckets(owner_ddp.plan(), owner_ddp.parameters(), n);
    for (int s = 0; s < steps; ++s) {
      Tensor<float> const x = rows(data.x, (s * n + r) * local, local);
      Tensor<float> const y = rows(data.y, (s * n + r) * local, local);
      plain.zero_grad();
      for (auto const& m : plain_ddp.micro_batches(x, y, {.step = static_cast<std::uint64_t>(s)}))
        backward(mse_loss(plain_ddp(m), m.y));
      plain.step();
      owner.zero_grad();
      for (auto const& m : owner_ddp.micro_batches(x, y, {.step = static_cast<std::uint64_t>(s)}))
        backward(mse_loss(owner_ddp(m), m.y));
      owner.step();
      expect(weights(owner_ddp.parameters()) == weights(plain_ddp.parameters()),
             detail::cat("rank ", r, ": after step ", s, " the OwnerReduce weights differ from AverageAllReduce's"));
      if (stage == 2) {
        float const* a = owner_ddp.parameters().grads().data();
        float const* b = plain_ddp.parameters().grads().data();
        for (auto const& z : zb) {
          auto const mine = detail::zero_slice(z, r);
          for (std::int64_t i = mine.begin; i < std::min(mine.end, z.start + z.numel); ++i)
            if (std::memcmp(a + i, b + i, sizeof(float)) != 0)
              throw std::runtime_error(detail::cat("rank ", r, ": step ", s,
                                                   ": the averaged gradient at arena element ", i, " is ", a[i],
                                                   ", AverageAllReduce's ", b[i]));
        }
      }
    }
    expect(owner.consolidated_state() == plain.state(),
           detail::cat("rank ", r, ": the OwnerReduce state differs from the unsharded optimizer's"));
    expect(owner.describe().find("(OwnerReduce)") != std::string::npos, "describe() names OwnerReduce");
    expect(owner_ddp.describe().find("OwnerReduce") != std::string::npos, "the DDP's describe() names OwnerReduce");
  };
  if (which == ZeroOpt::kSgdMomentum)
    run(std::type_identity<optim::SGD>{}, {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
  else
    run(std::type_identity<optim::AdamW>{}, {.lr = 1e-2, .weight_decay = 0.01});
}

}  // namespace ddp::test
