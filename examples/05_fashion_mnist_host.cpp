// The main job on host tensors (examples/common/fashion_mnist_job.hpp): launch() on the backend chosen with
// --backend, run<HostSpace> on each rank. Compiled once, by g++, and linked into both fashion_mnist and its nvcc
// build fashion_mnist_cuda, whose --device cpu runs it. With --elastic (Gloo): run_elastic over the rendezvous's
// store, one GlooBackend per generation of ranks.

#include "examples/common/fashion_mnist_job.hpp"

namespace ddp::examples::fashion_mnist {

int run_host(Config const& cfg, TensorDataset<std::int32_t> const& train_set,
             TensorDataset<std::int32_t> const& test_set, int argc, char** argv) {
  if (!cfg.elastic.on)
    return launch(
        cfg.backend, cfg.world_size, argc, argv, [&](auto& comm) { run<HostSpace>(comm, cfg, train_set, test_set); },
        cfg.timeout, cfg.node);
  Generator init(static_cast<std::uint64_t>(cfg.seed));  // (the model, for its identity: parameters and shapes)
  auto const model = model_identity((cfg.model == "cnn" ? make_cnn<HostSpace>(init) : make_mlp<HostSpace>(init)).seq);
  return examples::run_elastic_job(
      cfg.elastic, {.backend = cfg.backend, .world_size = cfg.world_size, .timeout = cfg.timeout, .node = cfg.node},
      model,
      [&](GlooBackend& comm, ElasticSession& session) { run<HostSpace>(comm, cfg, train_set, test_set, &session); });
}

}  // namespace ddp::examples::fashion_mnist
