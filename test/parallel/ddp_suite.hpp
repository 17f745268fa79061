// The DDP scenarios of ddp_cases.hpp (and the compressed, PowerSGD, ZeRO, overlapped, tied-parameter and local SGD
// ones) as one run over a backend whose ranks are processes: ddp_mpi_main.cpp (mpirun) and gloo_main.cpp (no MPI)
// call it. Throws (via expect) on the first scenario that fails on this rank.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "test/parallel/compressed_cases.hpp"
#include "test/parallel/ddp_cases.hpp"
#include "test/parallel/local_sgd_cases.hpp"
#include "test/parallel/overlapped_cases.hpp"
#include "test/parallel/powersgd_cases.hpp"
#include "test/parallel/tied_cases.hpp"

namespace ddp::test {

// `sum`: how the backend adds 16-bit floats (kFloatOnce: every rank's values in float, rounded once, as the
// threads backend and MPI's shared-memory all-reduce; kPairwise: rounded after each addition, as MPI_Allreduce,
// NCCL and Gloo).
template <class C>
void ddp_suite(C& comm, HalfSum sum) {
  double const eq = ddp::test::equivalence(comm, 16, 20);
  ddp::test::expect(eq <= ddp::test::kEquivalenceTolerance,
                    "equivalence: relative max difference " + std::to_string(eq));
  double const eq_small = ddp::test::equivalence(comm, 16, 20, {.cap_bytes = 0, .first_cap_bytes = 0});
  ddp::test::expect(eq_small <= ddp::test::kEquivalenceTolerance,
                    "equivalence (one bucket per parameter): " + std::to_string(eq_small));
  ddp::test::shape_mismatch(comm);
  ddp::test::unused_parameter(comm);
  double const ns = ddp::test::no_sync_accumulation(comm);
  ddp::test::expect(ns <= ddp::test::kEquivalenceTolerance, "no_sync accumulation differs by " + std::to_string(ns));
  ddp::test::buffer_broadcast(comm);
  for (bool find_unused : {false, true}) {
    double const ub = ddp::test::unrelated_backward(comm, {.find_unused_parameters = find_unused});
    ddp::test::expect(ub <= 1e-6, "GAN-style step: gradients differ from the reference by " + std::to_string(ub));
  }
  ddp::test::globally_unused_is_skipped(comm);
  ddp::test::optimizer_before_wrap(comm);
  ddp::test::frozen_and_hooks(comm);
  ddp::test::bucket_fingerprint(comm);
  ddp::test::plan_with_gap(comm);
  // Buckets compressed to 16-bit floats: on one node MPI's shared-memory all-reduce adds in float and rounds
  // once, as the threads backend does; across nodes (the namespace cluster) MPI_Allreduce adds pairwise.
  for (ddp::BucketConfig cfg : {ddp::BucketConfig{}, ddp::BucketConfig{.cap_bytes = 256, .first_cap_bytes = 64}}) {
    ddp::test::compressed_gradients_exact<ddp::bfloat16>(comm, cfg, sum);
    ddp::test::compressed_gradients_exact<ddp::float16>(comm, cfg, sum);
  }
  double const bf = ddp::test::compressed_training(comm, ddp::Bf16AllReduce{});
  double const fp = ddp::test::compressed_training(comm, ddp::Fp16AllReduce{});
  ddp::test::expect(bf <= 2e-3 && fp <= 4e-4, "compressed training drifted from float: bf16 " + std::to_string(bf) +
                                                  ", fp16 " + std::to_string(fp));
  ddp::test::fp16_overflow_is_reported(comm);
  // PowerSGD: the reference's gradients round by round (P and Q summed by MPI in its own order: within 2e-4).
  for (std::int64_t rank : {1, 2})
    ddp::test::powersgd_matches_reference(comm, {.rank = rank, .warmup_steps = 2, .min_compression_rate = 1.0},
                                          ddp::BucketConfig{.cap_bytes = 256, .first_cap_bytes = 64}, 5, 2e-4);
  // ZeRO-1: bitwise the unsharded optimizer's weights, the state cut 1/world and put back together.
  for (auto which : {ddp::test::ZeroOpt::kSgdMomentum, ddp::test::ZeroOpt::kAdamW})
    ddp::test::zero_matches_unsharded(comm, which, ddp::BucketConfig{.cap_bytes = 512, .first_cap_bytes = 128});
  // ZeRO-2: ZeRO-1's weights, keeping 1/world of the gradient pages between steps (MPI: its shared-memory window).
  ddp::test::zero2_keeps_its_slices(comm);
  // The update overlapped with the reductions: bitwise step(), alone, over ZeRO-1 and with compressed buckets.
  {
    ddp::BucketConfig const cfg{.cap_bytes = 512, .first_cap_bytes = 128};
    ddp::test::overlapped_matches_step(comm, ddp::test::ZeroOpt::kSgdMomentum, cfg);
    ddp::test::overlapped_matches_step(comm, ddp::test::ZeroOpt::kAdamW, cfg, 4, ddp::AverageAllReduce{}, 1);
    ddp::test::overlapped_matches_step(comm, ddp::test::ZeroOpt::kSgdMomentum, cfg, 4, ddp::AverageAllReduce{}, 2);
    ddp::test::overlapped_matches_step(comm, ddp::test::ZeroOpt::kAdamW, cfg, 4, ddp::Bf16AllReduce{}, 1);
    ddp::test::overlapped_matches_step(comm, ddp::test::ZeroOpt::kSgdMomentum, cfg, 4,
                                       ddp::PowerSgd{{.rank = 2, .warmup_steps = 1, .min_compression_rate = 1.0}});
  }
  // A tied parameter (the token table of the embedding and the output head) in every composition above, and in
  // deterministic mode and through a checkpoint: the reference step, the table held and verified once.
  ddp::test::tied_suite(comm);
  auto recs = ddp::test::collective_order(comm, {.cap_bytes = 1024, .first_cap_bytes = 256});
  // Every rank's sequence must equal rank 0's: compare a fingerprint.
  std::uint64_t h = 0;  // unsigned: the hash wraps by design
  for (auto const& r : recs)
    h = h * 1000003u + static_cast<std::uint64_t>(r.op) * 7919u + static_cast<std::uint64_t>(r.count) * 31u +
        static_cast<std::uint64_t>(r.tag.id);
  std::vector<std::int64_t> mine{static_cast<std::int64_t>(h)}, all(static_cast<std::size_t>(comm.world_size()));
  comm.all_gather(mine, all);
  for (auto x : all) ddp::test::expect(x == all[0], "collective sequences differ across ranks");
  // Local SGD, post-local SGD and DiLoCo (parallel/local_sgd.hpp) against replicas trained by hand.
  ddp::test::local_sgd_matches_replicas(comm, 3, 0, 7);
  ddp::test::local_sgd_matches_replicas(comm, 2, 3, 8);
  ddp::test::local_sgd_averages_state(comm);
  // Virtual replicas: 4 of them at any world size dividing 4, against replicas trained by hand.
  if (4 % comm.world_size() == 0) {
    ddp::test::virtual_replicas_match_hand(comm, false);
    ddp::test::virtual_replicas_match_hand(comm, true);
  }
  ddp::test::diloco_matches_replicas(comm, 3, 7);
  // Hierarchical local SGD over the backend's own nodes (one host: every average is over all ranks).
  if constexpr (ddp::NodeCommunicator<C>) ddp::test::local_sgd_hierarchical(comm);
  if (comm.rank() == 0)
    std::printf("ddp %s tests passed on %d ranks (equivalence %.3g, %.3g; no_sync %.3g)\n",
                std::string(C::backend_name).c_str(), comm.world_size(), eq, eq_small, ns);
}

}  // namespace ddp::test
