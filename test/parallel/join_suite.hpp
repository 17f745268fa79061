// The scenarios of join_cases.hpp as one run over a backend whose ranks are processes: join_mpi_main.cpp (mpirun)
// and gloo_main.cpp (no MPI) call it. Expected errors are caught and their messages checked on each rank; throws
// (via expect) on the first scenario that fails.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "test/parallel/join_cases.hpp"

namespace ddp::test {

template <class C>
void join_suite(C& comm) {
  double const by_world = ddp::test::join_equivalence(comm, {});
  ddp::test::expect(by_world <= 1e-5, "join equivalence (divide by world size): " + std::to_string(by_world));
  double const by_active = ddp::test::join_equivalence(comm, {.divide_by_initial_world_size = false});
  ddp::test::expect(by_active <= 1e-5, "join equivalence (divide by active ranks): " + std::to_string(by_active));
  ddp::test::join_buffers(comm);
  ddp::test::join_throw_on_early_termination(comm);
  ddp::test::uneven_without_join(comm);
  ddp::test::trainer_uneven(comm);
  ddp::test::non_finite_raise(comm);
  ddp::test::non_finite_skip(comm);
  ddp::test::trainer_skips_non_finite(comm);
  auto const recs = ddp::test::join_collective_order(comm);
  std::uint64_t h = 0;  // unsigned: the hash wraps by design
  for (auto const& r : recs)
    h = h * 1000003u + static_cast<std::uint64_t>(r.op) * 7919u + static_cast<std::uint64_t>(r.count) * 31u +
        static_cast<std::uint64_t>(r.tag.id) + static_cast<std::uint64_t>(r.root + 1) * 131u;
  std::vector<std::int64_t> mine{static_cast<std::int64_t>(h)}, all(static_cast<std::size_t>(comm.world_size()));
  comm.all_gather(mine, all);
  for (auto x : all) ddp::test::expect(x == all[0], "collective sequences under join differ across ranks");
  if (comm.rank() == 0)
    std::printf("join %s tests passed on %d ranks (equivalence %.3g by world size, %.3g by active ranks)\n",
                std::string(C::backend_name).c_str(), comm.world_size(), by_world, by_active);
}

}  // namespace ddp::test
