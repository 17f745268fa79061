// The main job on host tensors (examples/common/fashion_mnist_job.hpp): launch() on the backend chosen with
// --backend, run<HostSpace> on each rank. Compiled once, by g++, and linked into both fashion_mnist and its nvcc
// build fashion_mnist_cuda, whose --device cpu runs it.
#include "examples/common/fashion_mnist_job.hpp"

namespace ddp::examples::fashion_mnist {

int run_host(Config const& cfg, TensorDataset<std::int32_t> const& train_set,
             TensorDataset<std::int32_t> const& test_set, int argc, char** argv) {
  return launch(
      cfg.backend, cfg.world_size, argc, argv, [&](auto& comm) { run<HostSpace>(comm, cfg, train_set, test_set); },
      cfg.timeout, cfg.node);
}

}  // namespace ddp::examples::fashion_mnist
