// DistributedDataParallel over device tensors on NcclBackend (Thrust's CUDA system: cuBLAS, cuDNN, NCCL), under
// mpirun with one GPU per rank: N ranks on B/N equal one host process on B (MLP, and a small CNN through cuDNN).
// Compiled by nvcc (tools/cuda.bzl). Without a usable GPU it prints "SKIPPED: <why>" and exits 0 (.ci/run counts
// it as skipped), or fails under --require-gpu.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "ddp/comm/nccl.hpp"
#include "test/parallel/ddp_device_cases.hpp"

int main(int argc, char** argv) {
  bool require_gpu = false;
  for (int i = 1; i < argc; ++i) require_gpu |= std::strcmp(argv[i], "--require-gpu") == 0;
  ddp::MpiSession session(argc, argv);
  int devices = 0;
  cudaError_t const rc = cudaGetDeviceCount(&devices);
  if (rc != cudaSuccess || devices == 0) {
    if (session.rank() == 0)
      std::printf("%s: no usable CUDA device (%s); the DDP-over-NCCL tests did not run\n",
                  require_gpu ? "FAIL (--require-gpu)" : "SKIPPED",
                  rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
    return require_gpu ? 1 : 0;
  }
  try {
    ddp::NcclBackend comm(session);
    namespace dt = ddp::test::device;
    std::int64_t const B = 16;
    int const steps = 20;
    auto data = ddp::test::make_data(B * steps, 8, 4, 99);
    auto const host = dt::host_reference(data, B, steps);
    double const mlp = dt::rel_diff(dt::device_ddp(comm, data, B, steps), host);
    double const mlp_small =
        dt::rel_diff(dt::device_ddp(comm, data, B, steps, {.cap_bytes = 256, .first_cap_bytes = 64}), host);
    double const cnn = dt::cnn_equivalence(comm);
    // static_graph: the status words stay on the device after the first step; the same collectives, the same bits.
    ddp::BucketConfig const small{.cap_bytes = 256, .first_cap_bytes = 64};
    bool const static_same = dt::device_ddp(comm, data, B, steps, small, {.static_graph = true}) ==
                             dt::device_ddp(comm, data, B, steps, small);
    // cuBLAS/cuDNN sum in other orders than Eigen: agreement to float rounding, not bitwise.
    ddp::test::expect(mlp <= 1e-5, "MLP: device DDP vs host differs by " + std::to_string(mlp));
    ddp::test::expect(mlp_small <= 1e-5,
                      "MLP, small buckets: device DDP vs host differs by " + std::to_string(mlp_small));
    ddp::test::expect(cnn <= 1e-4, "CNN: device DDP vs host differs by " + std::to_string(cnn));
    ddp::test::expect(static_same, "MLP: static_graph changed the weights");
    if (comm.rank() == 0)
      std::printf(
          "ddp nccl tests passed on %d rank(s), device %d: MLP %.3g, %.3g; CNN %.3g (relative to the host run)\n",
          comm.world_size(), comm.device(), mlp, mlp_small, cnn);
  } catch (std::exception const& e) {
    session.abort(e.what());
  }
  return 0;
}
