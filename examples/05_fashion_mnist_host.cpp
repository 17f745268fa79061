// The main job on host tensors (examples/common/fashion_mnist_job.hpp): launch() on the backend chosen with
// --backend, run<HostSpace> on each rank. Compiled once, by g++, and linked into both fashion_mnist and its nvcc
// build fashion_mnist_cuda, whose --device cpu runs it. With --elastic (Gloo): run_elastic over the rendezvous's
// store, one GlooBackend per generation of ranks.
#include <ddp/train/elastic_store.hpp>

#include "examples/common/fashion_mnist_job.hpp"

namespace ddp::examples::fashion_mnist {

int run_host(Config const& cfg, TensorDataset<std::int32_t> const& train_set,
             TensorDataset<std::int32_t> const& test_set, int argc, char** argv) {
  if (!cfg.elastic)
    return launch(
        cfg.backend, cfg.world_size, argc, argv, [&](auto& comm) { run<HostSpace>(comm, cfg, train_set, test_set); },
        cfg.timeout, cfg.node);
  int rank = -1;
  try {
    Rendezvous rv = rendezvous({.timeout = cfg.timeout.after});
    rank = rv.launch.rank;
    if (cfg.world_size != 0 && cfg.world_size != rv.launch.world_size)
      throw ArgumentError(detail::cat("--world-size ", cfg.world_size, " does not match the launcher's ",
                                      rv.launch.world_size, " ranks (WORLD_SIZE)"));
    std::string const host = GlooBackend::default_host(rv.master_addr);
    auto const report = run_elastic(
        rv.store, rv.launch.rank, rv.launch.world_size,
        [&](std::shared_ptr<Store> store, int r, int n) {
          return std::make_unique<GlooBackend>(std::move(store), r, n, GlooOptions{.timeout = cfg.timeout}, host);
        },
        [&](GlooBackend& comm, ElasticSession& session) { run<HostSpace>(comm, cfg, train_set, test_set, &session); },
        {.min_world_size = cfg.min_world_size,
         .regroup_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
             detail::resolve(cfg.timeout, GlooBackend::backend_name).timeout)});
    (void)report;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s%s\n", rank >= 0 ? detail::cat("rank ", rank, ": ").c_str() : "", e.what());
    return 1;
  }
  return 0;
}

}  // namespace ddp::examples::fashion_mnist
