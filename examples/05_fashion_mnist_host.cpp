// The main job on host tensors (examples/common/fashion_mnist_job.hpp): launch() on the backend chosen with
// --backend, run<HostSpace> on each rank. Compiled once, by g++, and linked into both fashion_mnist and its nvcc
// build fashion_mnist_cuda, whose --device cpu runs it. With --elastic (Gloo): run_elastic over the rendezvous's
// store, one GlooBackend per generation of ranks.
#include <ddp/comm/rendezvous/rendezvous.hpp>
#include <ddp/train/elastic_identity.hpp>
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
    // What a joiner must share with the job: the model (its parameters' names and shapes) and the flags.
    Generator init(static_cast<std::uint64_t>(cfg.seed));
    JobIdentity identity{
        model_identity((cfg.model == "cnn" ? make_cnn<HostSpace>(init) : make_mlp<HostSpace>(init)).seq)};
    identity.insert(identity.end(), cfg.identity.begin(), cfg.identity.end());
    std::string host;
    auto make = [&](std::shared_ptr<Store> store, int r, int n) {
      return std::make_unique<GlooBackend>(std::move(store), r, n, GlooOptions{.timeout = cfg.timeout}, host);
    };
    auto body = [&](GlooBackend& comm, ElasticSession& session) {
      run<HostSpace>(comm, cfg, train_set, test_set, &session);
    };
    ElasticStoreOptions const opts{.min_world_size = cfg.min_world_size,
                                   .max_world_size = cfg.max_world_size,
                                   .join_timeout = cfg.join_timeout,
                                   .regroup_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
                                       detail::resolve(cfg.timeout, GlooBackend::backend_name).timeout),
                                   .identity = identity,
                                   .log = {}};
    if (cfg.join) {  // a process joining the running job: admitted at a step boundary, then a rank like the others
      Rendezvous rv = join_rendezvous({.timeout = cfg.timeout.after});
      host = GlooBackend::default_host(rv.master_addr);
      (void)join_elastic(rv.store, make, body, rv.timeout, opts);
      return 0;
    }
    Rendezvous rv = rendezvous({.timeout = cfg.timeout.after});
    rank = rv.launch.rank;
    if (cfg.world_size != 0 && cfg.world_size != rv.launch.world_size)
      throw ArgumentError(detail::cat("--world-size ", cfg.world_size, " does not match the launcher's ",
                                      rv.launch.world_size, " ranks (WORLD_SIZE)"));
    host = GlooBackend::default_host(rv.master_addr);
    (void)run_elastic(rv.store, rv.launch.rank, rv.launch.world_size, make, body, opts);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s%s\n",
                 cfg.join    ? "joiner: "
                 : rank >= 0 ? detail::cat("rank ", rank, ": ").c_str()
                             : "",
                 e.what());
    return 1;
  }
  return 0;
}

}  // namespace ddp::examples::fashion_mnist
