// MpiBackend under mpirun -n 2 / -n 4: the same conformance suite as the threads backend, run by doctest on
// every rank; the job fails if any rank's checks fail.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/mpi.hpp"
#include "test/comm/conformance.hpp"

namespace {

ddp::MpiBackend* g_comm = nullptr;  // the job's backend, set in main (tests run on every rank)

struct Mpi {
  template <class F>
  static void run(F const& fn) {
    fn(*g_comm);
  }
};

}  // namespace

DDP_CONFORMANCE_SUITE(Mpi);

static_assert(ddp::Communicator<ddp::MpiBackend>);
static_assert(ddp::AsyncCommunicator<ddp::MpiBackend>);
static_assert(ddp::HalfCommunicator<ddp::MpiBackend>);

TEST_CASE("MpiSession knows the node-local rank from MPI, matching launch_env()") {
  auto const env = ddp::launch_env();
  CHECK(env.source == "mpich");
  CHECK(env.rank == g_comm->rank());
  CHECK(env.world_size == g_comm->world_size());
  CHECK(env.local_rank == g_comm->session().local_rank());
  CHECK(env.local_size == g_comm->session().local_size());
}

TEST_CASE("the layout names how all_reduce runs, the same on every rank") {
  std::string const layout = g_comm->layout();
  CAPTURE(layout);
  CHECK(!layout.empty());
  std::vector<std::int32_t> const mine(layout.begin(), layout.end());  // rank 0's, against this rank's
  std::vector<std::int32_t> len{static_cast<std::int32_t>(mine.size())};
  g_comm->broadcast(std::span<std::int32_t>(len), 0);
  std::vector<std::int32_t> first = mine;
  first.resize(static_cast<std::size_t>(len[0]));
  g_comm->broadcast(std::span<std::int32_t>(first), 0);
  CHECK(first == mine);
  if (g_comm->world_size() == 1) CHECK(layout == "MPI_Iallreduce over 1 rank");
}

TEST_CASE_TEMPLATE(
    "gradient_storage: slices all-reduced in place equal the serial fold and the chunked path, bit for bit", T, float,
    double, std::int32_t, std::int64_t) {
  using namespace ddp::test;
  auto& comm = *g_comm;
  int const n = comm.world_size();
  int const r = comm.rank();
  std::size_t const total = 300000;
  auto storage = comm.gradient_storage<T>(static_cast<std::int64_t>(total));
  REQUIRE(storage.numel() == static_cast<std::int64_t>(total));
  std::string const layout = comm.layout();
  CAPTURE(layout);  // in place wherever a node has a shared window: not with one rank per node, nor kMpi
  CHECK(comm.gradients_in_place() == (n > 1 && layout.find("shared memory") != std::string::npos));
  // Slices at odd offsets, below and above the small-call size (32 KiB), one of them most of the storage.
  std::pair<std::size_t, std::size_t> const slices[] = {{0, 5}, {5, 8200}, {8205, 140003}, {148208, 151792}};
  for (ddp::ReduceOp op : kOps) {
    std::vector<T> const mine = filled<T>(r, total);
    std::copy(mine.begin(), mine.end(), storage.data());
    std::vector<T> chunked = mine;
    for (auto const& [lo, len] : slices) {
      comm.all_reduce(std::span<T>(storage.data() + lo, len), op, {"in place", static_cast<std::int64_t>(lo)});
      comm.all_reduce(std::span<T>(chunked.data() + lo, len), op, {"chunked", static_cast<std::int64_t>(lo)});
      std::vector<T> const got(storage.data() + lo, storage.data() + lo + len);
      expect_equal(got, reduced<T>(n, len, op, lo),
                   where(r, n, std::string("in place ") + std::string(ddp::name(op)) + " at " + std::to_string(lo)));
    }
    CHECK_MESSAGE(std::memcmp(storage.data(), chunked.data(), total * sizeof(T)) == 0,
                  where(r, n, std::string("in place against chunked, ") + std::string(ddp::name(op))));
    std::vector<T> first(storage.data(), storage.data() + total);  // every rank holds rank 0's bits
    comm.broadcast(std::span<T>(first), 0);
    CHECK_MESSAGE(std::memcmp(storage.data(), first.data(), total * sizeof(T)) == 0,
                  where(r, n, std::string("in place, ranks alike, ") + std::string(ddp::name(op))));
  }
}

TEST_CASE("gradient_storage across nodes: a node in place and a node with private buffers all-reduce together") {
  using namespace ddp::test;
  auto& comm = *g_comm;
  std::string const layout = comm.layout();  // "2 nodes x 2 ranks (...)": nodes of K consecutive ranks
  auto const x = layout.find(" nodes x ");
  if (x == std::string::npos || !comm.gradients_in_place()) return;
  int const per_node = std::stoi(layout.substr(x + 9));
  int const n = comm.world_size();
  int const r = comm.rank();
  bool const in_place = r / per_node == 0;  // node 0 passes its gradient_storage, the others private memory
  std::size_t const total = 150001;         // above the small-call size, many 4 KiB chunks, a ragged end
  auto storage = comm.gradient_storage<float>(static_cast<std::int64_t>(total));
  std::vector<float> priv(total);
  float* const buf = in_place ? storage.data() : priv.data();
  for (ddp::ReduceOp op : kOps) {
    std::vector<float> const mine = filled<float>(r, total);
    std::copy(mine.begin(), mine.end(), buf);
    comm.all_reduce(std::span<float>(buf, total), op);
    std::vector<float> const got(buf, buf + total);
    expect_equal(got, reduced<float>(n, total, op, 0),
                 where(r, n, std::string(in_place ? "in place " : "private ") + std::string(ddp::name(op))));
    std::vector<float> first = got;  // every rank holds rank 0's bits
    comm.broadcast(std::span<float>(first), 0);
    CHECK_MESSAGE(std::memcmp(got.data(), first.data(), total * sizeof(float)) == 0,
                  where(r, n, std::string("mixed places, ranks alike, ") + std::string(ddp::name(op))));
  }
}

TEST_CASE("gradient_storage: a block no tensor views any more on any rank is reused, one in use is not") {
  auto& comm = *g_comm;
  float const* first = nullptr;
  {
    auto a = comm.gradient_storage<float>(50000);
    first = a.data();
  }
  auto b = comm.gradient_storage<float>(40000);  // fits in the freed block
  auto c = comm.gradient_storage<float>(40000);  // b holds it: a new one
  if (comm.gradients_in_place()) {
    CHECK(b.data() == first);
    CHECK(c.data() != b.data());
  }
  CHECK(b.numel() == 40000);
  CHECK(c.numel() == 40000);
}

// --node=mpi | --node=shm (default), --ranks-per-node=K, --chunk-bytes=N, --streaming-bytes=N,
// --window-stores=adaptive|streaming|plain: the all-reduce layouts under test.
ddp::MpiNodeOptions node_options(int& argc, char** argv) {
  ddp::MpiNodeOptions opts;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--node=mpi") {
      opts.all_reduce = ddp::NodeAllReduce::kMpi;
    } else if (a == "--node=shm") {
      opts.all_reduce = ddp::NodeAllReduce::kSharedMemory;
    } else if (a.rfind("--ranks-per-node=", 0) == 0) {
      opts.ranks_per_node = std::stoi(a.substr(17));
    } else if (a.rfind("--chunk-bytes=", 0) == 0) {
      opts.chunk_bytes = std::stoul(a.substr(14));
    } else if (a.rfind("--streaming-bytes=", 0) == 0) {
      opts.streaming_bytes = std::stoul(a.substr(18));
    } else if (a == "--window-stores=streaming") {
      opts.window_stores = ddp::WindowStores::kStreaming;
    } else if (a == "--window-stores=plain") {
      opts.window_stores = ddp::WindowStores::kPlain;
    } else if (a == "--window-stores=adaptive") {
      opts.window_stores = ddp::WindowStores::kAdaptive;
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
  return opts;
}

int main(int argc, char** argv) {
  return ddp::mpi_main(argc, argv, [&](ddp::MpiSession& session) {
    ddp::MpiBackend comm(session, {.node = node_options(argc, argv)});
    g_comm = &comm;
    if (comm.rank() == 0) std::printf("all_reduce layout: %s\n", comm.layout().c_str());
    doctest::Context ctx(argc, argv);
    ctx.setOption("no-version", true);
    int failed = ctx.run();
    comm.all_reduce(std::span(&failed, 1), ddp::ReduceOp::kMax);  // every rank reports the job's result
    g_comm = nullptr;
    return failed;
  });
}
