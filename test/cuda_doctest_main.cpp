// doctest's main for test binaries built by nvcc (Thrust's CUDA system): runs the tests when a CUDA device is
// usable; otherwise says so and exits 0 (the tests are skipped), or 1 when DDP_REQUIRE_GPU=1 (run_gpu_tests.sh).
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
    std::printf("no usable CUDA device (%s): GPU tests skipped%s\n",
                rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices",
                require ? " (DDP_REQUIRE_GPU=1: failing)" : "");
    return require ? 1 : 0;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
