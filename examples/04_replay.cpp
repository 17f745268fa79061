// 04_replay: trains exactly what a PyTorch reference fixture recorded (model, loss, optimizer, steps,
// per-rank batches) and compares the final weights and every step's loss with PyTorch's. Works for any directory
// in the ddp-fixture-v2 format, on host tensors or on device tensors (the same model, optimizer and DDP code; this
// build's device system is Thrust's CPU system). Exit 0 when within the fixture's tolerance, 1 past it, 2 on bad
// input.
//   replay --fixture test/fixtures/mlp --run ws2                 (threads backend, 2 ranks, host tensors)
//   replay --fixture test/fixtures/mlp --run ws2 --tensors device
//   mpirun -n 4 replay --fixture test/fixtures/mlp --run ws4 --backend mpi [--tensors device: through HostStaging]
#include <cmath>
#include <cstdio>

#include "ddp/tensor/device.hpp"
#include "examples/common/flags.hpp"
#include "examples/common/launch.hpp"
#include "tools/fixture/fixture.hpp"

using namespace ddp;

namespace {

struct Outcome {
  double max_abs_diff = 0, max_loss_diff = 0;
  bool ok = false;
};

template <MemorySpace S, class Fwd>
std::vector<double> train(fixture::Fixture const& f, fixture::RunInfo const& run, int rank,
                          nn::ParameterArena<float, S>& params, Fwd&& forward) {
  auto opt = f.make_optimizer(params);
  auto const idx = f.batch_indices(run);
  std::vector<double> losses;
  for (std::int64_t s = 0; s < f.steps(); ++s) {
    auto ids = f.rank_batch(idx, run, rank, s);
    std::visit([](auto& o) { o.zero_grad(); }, opt);
    Variable<float, S> loss = f.loss(forward(Variable<float, S>(to_space<S>(f.batch_x(ids)))), ids);
    losses.push_back(loss.item());
    backward(loss);
    std::visit([](auto& o) { o.step(); }, opt);
  }
  return losses;
}

// One rank's replay on tensors of space S; every rank returns the same outcome (rank 0 compares and broadcasts).
template <MemorySpace S, class Comm>
Outcome replay_rank(Comm& comm, fixture::Fixture const& f, fixture::RunInfo const& run) {
  if (comm.world_size() != run.world_size)
    throw ArgumentError(detail::cat("run '", run.name, "' of fixture ", f.name(), " was recorded with world size ",
                                    run.world_size, "; this job has ", comm.world_size(), " ranks"));
  int const r = comm.rank();
  Generator gen(0);
  auto model = f.build_model<S>(gen);
  std::vector<float> weights;
  std::vector<double> losses;
  {
    nn::ParameterArena<float, S> init(model);
    f.load_init(init);
    if (!run.ddp) {
      losses = train(f, run, r, init, [&](Variable<float, S> const& x) { return model(x); });
      weights = f.gather_weights(init);
    }
  }
  if (run.ddp) {
    DistributedDataParallel ddp(model, comm);
    losses = train(f, run, r, ddp.parameters(), [&](Variable<float, S> const& x) { return ddp(x); });
    weights = f.gather_weights(ddp.parameters());
  }
  // Every rank's losses against PyTorch's, each step's difference relative to max(1, |PyTorch's loss|), judged by
  // the fixture's weight tolerance; the largest over ranks decides.
  Outcome out;
  std::vector<double> loss_diff{0, 0};  // absolute, relative
  if (!run.losses_per_rank.empty())
    for (std::size_t s = 0; s < losses.size(); ++s) {
      double const want = run.losses_per_rank.at(static_cast<std::size_t>(r)).at(s);
      double const d = std::abs(losses[s] - want);
      loss_diff[0] = std::max(loss_diff[0], d);
      loss_diff[1] = std::max(loss_diff[1], d / std::max(1.0, std::abs(want)));
    }
  host_all_reduce(comm, std::span<double>(loss_diff), ReduceOp::kMax);
  out.max_loss_diff = loss_diff[0];
  std::vector<double> summary{0, 0};
  if (r == 0) {
    auto c = f.compare(weights, run);
    bool const losses_ok = loss_diff[1] <= c.tol_weight;
    summary = {c.max_abs_diff, c.ok() && losses_ok ? 1.0 : 0.0};
    std::printf(
        "fixture %s run %s (world size %d, %s, %s tensors): max|final - ours| = %.3g (max|w| %.3g, max change %.3g; "
        "tolerance %.3g·max(1,max|w|) and %.3g·max change); max loss difference %.3g (tolerance %.3g·max(1,|loss|)) "
        "-> %s\n",
        f.name().c_str(), run.name.c_str(), run.world_size, run.ddp ? "DDP" : "plain",
        std::same_as<S, HostSpace> ? "host" : "device", c.max_abs_diff, c.max_abs_final, c.max_abs_change, c.tol_weight,
        c.tol_change, out.max_loss_diff, c.tol_weight,
        !c.ok()      ? "MISMATCH (weights)"
        : !losses_ok ? "MISMATCH (losses)"
                     : "OK");
  }
  host_broadcast(comm, std::span<double>(summary), 0);
  out.max_abs_diff = summary[0];
  out.ok = summary[1] == 1.0;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  examples::Flags flags("replay",
                        "Replays a PyTorch reference fixture run and compares the final weights and each step's loss "
                        "(exit 1 past the fixture's tolerance).");
  flags.add("fixture", "", "fixture directory (format ddp-fixture-v2; see ../shared/fixtures/pytorch/README.md)")
      .add("run", "plain", "run name in meta.json (plain, ws1, ws2, ...)")
      .add("backend", "threads", "threads (all ranks in this process) or mpi (under mpirun -n <world size>)")
      .add("tensors", "host", "host (Eigen) or device (Thrust's device system; MPI carries them through HostStaging)");
  fixture::Fixture f;
  examples::Backend backend{};
  bool device = false;
  try {
    if (!flags.parse(argc, argv)) return 0;
    if (flags.str("fixture").empty()) throw ArgumentError("replay: --fixture DIR is required (see --help)");
    backend = examples::parse_backend(flags.str("backend"));
    device = flags.choice("tensors", {"host", "device"}) == "device";
    f = fixture::Fixture::load(flags.str("fixture"));
    (void)f.run(flags.str("run"));
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  auto const& run = f.run(flags.str("run"));
  bool ok = false;
  int const rc = examples::launch(backend, backend == examples::Backend::kThreads ? run.world_size : 0, argc, argv,
                                  [&](auto& comm) {
                                    Outcome o;
                                    if (!device) {
                                      o = replay_rank<HostSpace>(comm, f, run);
                                    } else if constexpr (ThreadsBackend::accepted_spaces::contains<DeviceSpace> &&
                                                         std::same_as<std::decay_t<decltype(comm)>, ThreadsBackend>) {
                                      o = replay_rank<DeviceSpace>(comm, f, run);  // threads take device memory here
                                    } else {
                                      HostStaging<std::decay_t<decltype(comm)>> staged(comm);  // MPI: host memory only
                                      o = replay_rank<DeviceSpace>(staged, f, run);
                                    }
                                    if (comm.rank() == 0 || backend != examples::Backend::kThreads) ok = o.ok;
                                  });
  if (rc != 0) return rc;
  return ok ? 0 : 1;
}
