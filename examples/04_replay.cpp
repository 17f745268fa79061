// 04_replay: trains exactly what a PyTorch reference fixture recorded (model, loss, optimizer, steps,
// per-rank batches) and compares the final weights and every step's loss with PyTorch's. Works for any directory
// in the ddp-fixture-v2 format (MLPs, CNNs) or ddp-fixture-v3 (GPTs: per-step learning rates, clipping, gradient
// accumulation under no_sync, per-parameter weight decay; gradient norms compared too), on host tensors or on
// device tensors (the same model, optimizer and DDP code; this build's device system is Thrust's CPU system). Exit
// 0 when within the fixture's tolerance, 1 past it, 2 on bad input.
//   replay --fixture test/fixtures/mlp --run ws2                 (threads backend, 2 ranks, host tensors)
//   replay --fixture test/fixtures/mlp --run ws2 --tensors device
//   mpirun -n 4 replay --fixture test/fixtures/mlp --run ws4 --backend mpi [--tensors device: through HostStaging]
#include <cmath>
#include <cstdio>
#include <string>
#include <variant>

#include "ddp/tensor/device.hpp"
#include "examples/common/flags.hpp"
#include "examples/common/launch.hpp"
#include "tools/fixture/fixture.hpp"
#include "tools/fixture/gpt_fixture.hpp"

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

// One step of a v3 run on this rank: each micro-step's loss divided by the accumulation count, backward (all but
// the last inside no_sync under DDP), then clipping and the AdamW step. Returns {the rank's loss, the grad norm}.
template <MemorySpace S, class Fwd, class Opt, class NoSync>
std::pair<double, double> gpt_step(fixture::GptFixture const& f, fixture::GptRunInfo const& run, int rank,
                                   std::vector<std::int32_t> const& offs, std::int64_t s, Opt& opt,
                                   nn::ParameterArena<float, S>& params, Fwd&& forward, NoSync&& no_sync) {
  opt.set_lr(f.lr_per_step()[static_cast<std::size_t>(s)]);
  opt.zero_grad();
  double loss_sum = 0;
  float const inv = 1.0f / static_cast<float>(run.grad_accum_steps);
  for (std::int64_t m = 0; m < run.grad_accum_steps; ++m) {
    auto const xy = f.batch(offs, run, rank, s, m);  // not a structured binding: Clang 14 cannot capture those
    auto micro = [&] {
      Variable<float, S> loss =
          scale(nn::gpt_loss(forward(Variable<float, S>(to_space<S>(xy.first))), to_space<S>(xy.second)), inv);
      loss_sum += loss.item();
      backward(loss);
    };
    if (m + 1 < run.grad_accum_steps)
      no_sync(micro);
    else
      micro();
  }
  double const norm = f.max_norm() ? nn::clip_grad_norm(params, *f.max_norm(), {.norm_type = f.norm_type()})
                                   : nn::grad_norm(params, {.norm_type = f.norm_type()});
  opt.step();
  return {loss_sum, norm};
}

// A v3 (GPT) run on tensors of space S; every rank returns the same outcome.
template <MemorySpace S, class Comm>
Outcome replay_gpt_rank(Comm& comm, fixture::GptFixture const& f, fixture::GptRunInfo const& run) {
  if (comm.world_size() != run.world_size)
    throw ArgumentError(detail::cat("run '", run.name, "' of fixture ", f.name(), " was recorded with world size ",
                                    run.world_size, "; this job has ", comm.world_size(), " ranks"));
  int const r = comm.rank();
  Generator gen(0);
  nn::basic_gpt<float, S> model(f.config(), gen);
  auto const offs = f.offsets(run);
  std::vector<double> losses, norms;
  std::vector<float> weights;
  auto train = [&](nn::ParameterArena<float, S>& params, auto&& forward, auto&& no_sync) {
    auto opt = f.make_optimizer(params);
    for (std::int64_t s = 0; s < f.steps(); ++s) {
      auto const [l, n] = gpt_step<S>(f, run, r, offs, s, opt, params, forward, no_sync);
      losses.push_back(l);
      norms.push_back(n);
    }
    weights = f.gather_weights(params);
  };
  {
    nn::ParameterArena<float, S> init(model);
    f.load_init(init);
    if (!run.ddp)
      train(
          init, [&](Variable<float, S> const& x) { return model(x); }, [](auto&& fn) { fn(); });
  }
  if (run.ddp) {
    DistributedDataParallel ddp(model, comm);
    train(
        ddp.parameters(), [&](Variable<float, S> const& x) { return ddp(x); },
        [&](auto&& fn) {
          auto guard = ddp.no_sync();
          fn();
        });
  }
  // Losses (this rank's) and gradient norms against PyTorch's, relative; the largest over ranks decides.
  auto rel = [](double ours, double want) { return std::abs(ours - want) / std::max(1e-12, std::abs(want)); };
  std::vector<double> diff{0, 0};  // loss, grad norm
  for (std::size_t s = 0; s < losses.size(); ++s) {
    if (!run.losses_per_rank.empty())
      diff[0] = std::max(diff[0], rel(losses[s], run.losses_per_rank.at(static_cast<std::size_t>(r)).at(s)));
    if (!run.grad_norm_per_step.empty()) diff[1] = std::max(diff[1], rel(norms[s], run.grad_norm_per_step.at(s)));
  }
  host_all_reduce(comm, std::span<double>(diff), ReduceOp::kMax);
  std::vector<double> summary{0, 0};
  if (r == 0) {
    auto c = f.compare(weights, run);
    bool const losses_ok = diff[0] <= f.loss_rel(), norms_ok = diff[1] <= f.loss_rel();
    summary = {c.max_abs_diff, c.ok() && losses_ok && norms_ok ? 1.0 : 0.0};
    std::printf(
        "fixture %s run %s (world size %d, %s, %lld micro-step(s), %s tensors): max|final - ours| = %.3g (max|w| %.3g, "
        "max change %.3g; tolerance %.3g·max(1,max|w|) and %.3g·max change); max relative loss difference %.3g, grad "
        "norm %.3g (tolerance %.3g) -> %s\n",
        f.name().c_str(), run.name.c_str(), run.world_size, run.ddp ? "DDP" : "plain",
        static_cast<long long>(run.grad_accum_steps), std::same_as<S, HostSpace> ? "host" : "device", c.max_abs_diff,
        c.max_abs_final, c.max_abs_change, c.tol_weight, c.tol_change, diff[0], diff[1], f.loss_rel(),
        !c.ok()      ? "MISMATCH (weights)"
        : !losses_ok ? "MISMATCH (losses)"
        : !norms_ok  ? "MISMATCH (gradient norms)"
                     : "OK");
  }
  host_broadcast(comm, std::span<double>(summary), 0);
  return {.max_abs_diff = summary[0], .max_loss_diff = diff[0], .ok = summary[1] == 1.0};
}

// The replay of either format, on this rank's communicator, in space S.
template <MemorySpace S, class Comm>
Outcome replay_any(Comm& comm, std::variant<fixture::Fixture, fixture::GptFixture> const& f, std::string const& run) {
  if (auto const* g = std::get_if<fixture::GptFixture>(&f)) return replay_gpt_rank<S>(comm, *g, g->run(run));
  auto const& v2 = std::get<fixture::Fixture>(f);
  return replay_rank<S>(comm, v2, v2.run(run));
}

}  // namespace

int main(int argc, char** argv) {
  examples::Flags flags("replay",
                        "Replays a PyTorch reference fixture run and compares the final weights and each step's loss "
                        "(exit 1 past the fixture's tolerance).");
  flags.add("fixture", "", "fixture directory (format ddp-fixture-v2 or v3; see ../shared/fixtures/pytorch/)")
      .add("run", "plain", "run name in meta.json (plain, ws1, ws2, ...)")
      .add("backend", "threads", "threads (all ranks in this process) or mpi (under mpirun -n <world size>)")
      .add("tensors", "host", "host (Eigen) or device (Thrust's device system; MPI carries them through HostStaging)");
  std::variant<fixture::Fixture, fixture::GptFixture> f;
  examples::Backend backend{};
  bool device = false;
  int world = 1;
  std::string run;
  try {
    if (!flags.parse(argc, argv)) return 0;
    if (flags.str("fixture").empty()) throw ArgumentError("replay: --fixture DIR is required (see --help)");
    backend = examples::parse_backend(flags.str("backend"));
    device = flags.choice("tensors", {"host", "device"}) == "device";
    run = flags.str("run");
    std::string const format = fixture::GptFixture::format_of(flags.str("fixture"));
    if (format == "ddp-fixture-v3") {
      f = fixture::GptFixture::load(flags.str("fixture"));
      world = std::get<fixture::GptFixture>(f).run(run).world_size;
    } else {
      f = fixture::Fixture::load(flags.str("fixture"));  // names the format it expected when it is neither
      world = std::get<fixture::Fixture>(f).run(run).world_size;
    }
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  bool ok = false;
  int const rc =
      examples::launch(backend, backend == examples::Backend::kThreads ? world : 0, argc, argv, [&](auto& comm) {
        Outcome o;
        if (!device) {
          o = replay_any<HostSpace>(comm, f, run);
        } else if constexpr (ThreadsBackend::accepted_spaces::contains<DeviceSpace> &&
                             std::same_as<std::decay_t<decltype(comm)>, ThreadsBackend>) {
          o = replay_any<DeviceSpace>(comm, f, run);  // threads take device memory here
        } else {
          HostStaging<std::decay_t<decltype(comm)>> staged(comm);  // MPI: host memory only
          o = replay_any<DeviceSpace>(staged, f, run);
        }
        if (comm.rank() == 0 || backend != examples::Backend::kThreads) ok = o.ok;
      });
  if (rc != 0) return rc;
  return ok ? 0 : 1;
}
