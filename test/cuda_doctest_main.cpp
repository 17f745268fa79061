// doctest's main for test binaries built by nvcc (Thrust's CUDA system): runs the tests when a CUDA device is
// usable; otherwise prints "SKIPPED: <why>" and exits 0 (.ci/run counts the target as skipped, not passed), or
// fails when DDP_REQUIRE_GPU=1 (run_gpu_tests.sh).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  int devices = 0;
  cudaError_t const rc = cudaGetDeviceCount(&devices);
  if (rc != cudaSuccess || devices == 0) {
    char const* req = std::getenv("DDP_REQUIRE_GPU");
    bool const require = req != nullptr && std::strcmp(req, "1") == 0;
    std::printf("%s: no usable CUDA device (%s); the GPU tests did not run\n",
                require ? "FAIL (DDP_REQUIRE_GPU=1)" : "SKIPPED",
                rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
    return require ? 1 : 0;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
