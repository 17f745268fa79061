// NcclBackend: the conformance suite on device buffers (run on a GPU machine by run_gpu_tests.sh, world size
// 1 per GPU). Without a usable GPU it checks that construction fails with a CommError naming the rank.
// Under mpirun the ranks meet over MPI; with --rendezvous, through ddp::rendezvous()'s store (torchrun, a file
// store, or one process with nothing set), with no MPI.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ddp/comm/nccl.hpp"
#include "ddp/tensor/device_buffer.hpp"
#include "test/comm/conformance.hpp"
#include "test/comm/delay_kernels.h"

namespace ddp::test {
// Device buffers for the suite: filled from and read back to the host.
template <class T>
struct TestBuffer<DeviceSpace, T> {
  DeviceBuffer<T> data;
  explicit TestBuffer(std::vector<T> const& init) : data(std::span<T const>(init)) {}
  DeviceSpan<T> span() { return data.span(); }
  DeviceSpan<T> sub(std::size_t off, std::size_t n) { return span().subspan(off, n); }
  std::vector<T> host() const { return data.to_host(); }
};
}  // namespace ddp::test

namespace {

ddp::NcclBackend* g_comm = nullptr;             // the job's backend, set in main
ddp::MpiSession* g_session = nullptr;           // how the job's ranks met: over MPI,
std::optional<ddp::Rendezvous> g_rendezvous{};  // or through the rendezvous store

// Another backend over the job's ranks, met the way the job's backend was (collective).
ddp::NcclBackend another_backend(ddp::NcclOptions const& opts) {
  if (g_rendezvous) return ddp::NcclBackend(*g_rendezvous, opts);
  return ddp::NcclBackend(*g_session, opts);
}

struct Nccl {
  template <class F>
  static void run(F const& fn) {
    fn(*g_comm);
  }
};

}  // namespace

DDP_CONFORMANCE_SUITE(Nccl);

static_assert(ddp::Communicator<ddp::NcclBackend>);
static_assert(ddp::AsyncCommunicator<ddp::NcclBackend>);
static_assert(ddp::HalfCommunicator<ddp::NcclBackend>);

TEST_CASE("collectives order with the compute stream through events") {
  cudaStream_t compute = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  int const n = g_comm->world_size();
  std::vector<float> ones(1 << 20, 1.0f);
  ddp::DeviceBuffer<float> buf(ones.size());
  // The upload is queued on the compute stream; the all-reduce must wait for it.
  REQUIRE(cudaMemcpyAsync(buf.data(), ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice, compute) ==
          cudaSuccess);
  {
    ddp::NcclBackend comm = another_backend(ddp::NcclOptions{.compute_stream = compute});
    comm.all_reduce(buf.span(), ddp::ReduceOp::kSum);
    std::vector<float> back(ones.size());
    REQUIRE(cudaMemcpyAsync(back.data(), buf.data(), back.size() * sizeof(float), cudaMemcpyDeviceToHost, compute) ==
            cudaSuccess);
    REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
    CHECK(back.front() == static_cast<float>(n));
    CHECK(back.back() == static_cast<float>(n));
  }
  cudaStreamDestroy(compute);
}

TEST_CASE("an all-reduce waits for a slow kernel queued before it on the compute stream") {
  cudaStream_t compute = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  int const n = g_comm->world_size();
  long long const count = 1 << 22;
  ddp::DeviceBuffer<float> buf(static_cast<std::size_t>(count));
  REQUIRE(cudaMemsetAsync(buf.data(), 0, count * sizeof(float), compute) == cudaSuccess);
  // ~10^8 cycles (tens of ms) before the fill: without event ordering NCCL would reduce the zeros.
  REQUIRE(ddp_test_delayed_fill(buf.data(), count, 3.0f, 100'000'000LL, compute) == cudaSuccess);
  {
    ddp::NcclBackend comm = another_backend(ddp::NcclOptions{.compute_stream = compute});
    comm.all_reduce(buf.span(), ddp::ReduceOp::kSum);
    std::vector<float> back(static_cast<std::size_t>(count));
    REQUIRE(cudaMemcpyAsync(back.data(), buf.data(), count * sizeof(float), cudaMemcpyDeviceToHost, compute) ==
            cudaSuccess);
    REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
    CHECK(back.front() == 3.0f * static_cast<float>(n));
    CHECK(back[static_cast<std::size_t>(count / 2)] == 3.0f * static_cast<float>(n));
    CHECK(back.back() == 3.0f * static_cast<float>(n));
  }
  cudaStreamDestroy(compute);
}

// Without a usable GPU the backend must refuse with a CommError that names this rank, not crash.
template <class Build>
int check_refusal(int rank, Build&& build) {
  try {
    ddp::NcclBackend comm = build();
    std::fprintf(stderr, "FAIL: NcclBackend constructed without a usable GPU\n");
    return 1;
  } catch (ddp::CommError const& e) {
    std::string const what = e.what();
    bool const ok = what.find("rank " + std::to_string(rank)) != std::string::npos &&
                    what.find("cudaGetDeviceCount") != std::string::npos;
    std::printf("no usable GPU; NcclBackend reported: %s\n%s\n", e.what(), ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
  }
}

bool usable_gpu(bool require_gpu) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) return true;
  if (require_gpu) std::fprintf(stderr, "FAIL: --require-gpu but no usable CUDA device\n");
  return false;
}

int main(int argc, char** argv) {
  bool require_gpu = false;  // --require-gpu: a missing GPU is a failure (the GPU-machine test)
  bool store = false;        // --rendezvous: meet through ddp::rendezvous(), not MPI
  for (int i = 1; i < argc; ++i) {
    require_gpu = require_gpu || std::string(argv[i]) == "--require-gpu";
    store = store || std::string(argv[i]) == "--rendezvous";
  }
  if (store) {
    try {
      g_rendezvous.emplace(ddp::rendezvous());
      int const rank = g_rendezvous->launch.rank;
      if (!usable_gpu(require_gpu))
        return require_gpu ? 1 : check_refusal(rank, [&] { return ddp::NcclBackend(*g_rendezvous); });
      ddp::NcclBackend comm(*g_rendezvous);
      std::printf("rank %d: ranks met through %s\n", rank, comm.bootstrap().c_str());
      g_comm = &comm;
      doctest::Context ctx(argc, argv);
      ctx.setOption("no-version", true);
      int failed = ctx.run();
      // Every rank's verdict: a failed rank fails the job (the launcher reports the first non-zero status).
      g_comm = nullptr;
      return failed;
    } catch (std::exception const& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }
  return ddp::mpi_main(argc, argv, [&](ddp::MpiSession& session) {
    g_session = &session;
    if (!usable_gpu(require_gpu))
      return require_gpu ? 1 : check_refusal(session.rank(), [&] { return ddp::NcclBackend(session); });
    ddp::NcclBackend comm(session);
    g_comm = &comm;
    doctest::Context ctx(argc, argv);
    ctx.setOption("no-version", true);
    int failed = ctx.run();
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    g_comm = nullptr;
    return failed;
  });
}
