// GlooBackend with one rank per process, launched without MPI (test/tools/gloo_launch.sh on one host,
// tools/cluster/glooexec.sh across namespace hosts): the same conformance suite as every backend, run by doctest
// on every rank; the job fails if any rank's checks fail.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "ddp/comm/gloo.hpp"
#include "test/comm/conformance.hpp"

namespace {

ddp::GlooBackend* g_comm = nullptr;  // the job's backend, set in main (tests run on every rank)

struct GlooProcesses {
  template <class F>
  static void run(F const& fn) {
    fn(*g_comm);
  }
};

}  // namespace

DDP_CONFORMANCE_SUITE(GlooProcesses);

TEST_CASE("the launcher's ranks, and the layout, the same on every rank") {
  auto const env = ddp::launch_env();
  CHECK(env.rank == g_comm->rank());
  CHECK(env.world_size == g_comm->world_size());
  std::string const layout = g_comm->layout();
  CAPTURE(layout);
  CHECK(layout.find("Gloo TCP over " + std::to_string(g_comm->world_size()) + " ranks from ") == 0);
  std::vector<std::int32_t> const mine(layout.begin(), layout.end());
  std::vector<std::int32_t> len{static_cast<std::int32_t>(mine.size())};
  g_comm->all_reduce(std::span<std::int32_t>(len), ddp::ReduceOp::kMax);
  std::vector<std::int32_t> all(static_cast<std::size_t>(len[0]) * static_cast<std::size_t>(g_comm->world_size()));
  std::vector<std::int32_t> padded = mine;
  padded.resize(static_cast<std::size_t>(len[0]));
  g_comm->all_gather(std::span<std::int32_t const>(padded), std::span<std::int32_t>(all));
  // Every rank listens on its own address but meets at the same store: the text after "rendezvous at" agrees.
  std::string const store = layout.substr(layout.find("rendezvous at"));
  std::string const first(all.begin(), all.begin() + len[0]);
  CHECK(first.substr(first.find("rendezvous at")).substr(0, store.size()) == store);
}

int main(int argc, char** argv) {
  int rank = -1;
  try {
    ddp::Rendezvous rv = ddp::rendezvous();
    rank = rv.launch.rank;
    ddp::GlooBackend comm(std::move(rv));
    g_comm = &comm;
    if (comm.rank() == 0) std::printf("%s\n", comm.layout().c_str());
    doctest::Context ctx(argc, argv);
    ctx.setOption("no-version", true);
    int failed = ctx.run();
    comm.all_reduce(std::span(&failed, 1), ddp::ReduceOp::kMax);  // every rank reports the job's result
    g_comm = nullptr;
    return failed != 0 ? 1 : 0;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: rank %d: %s\n", rank, e.what());
    return 1;
  }
}
