// The main job's one rank (examples/05_fashion_mnist.cpp): its Config, and run<S>(comm, cfg, data), which builds the
// model, its trainer (DDP with the chosen bucket cap and reduction, the chosen optimizer) and trains it.
// A header of its own so that the job on host tensors is compiled once, by g++ (05_fashion_mnist_host.cpp), and
// linked into both binaries: the nvcc build (fashion_mnist_cuda) compiles only main() and the device-tensor job.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include <ddp/data/fashion_mnist.hpp>
#include <ddp/data/global_batch_sampler.hpp>
#include <ddp/ddp.hpp>
#include <ddp/tensor/precision.hpp>
#include <ddp/train/checkpoint.hpp>
#include <ddp/train/elastic_identity.hpp>
#include <ddp/train/evaluate.hpp>
#include <ddp/train/metrics_log.hpp>
#include <ddp/train/progress.hpp>
#include <ddp/train/svg_plot.hpp>

#include "examples/common/checkpoints.hpp"
#include "examples/common/elastic.hpp"
#include "examples/common/launch.hpp"
#include "examples/common/local_rounds.hpp"
#include "examples/common/models.hpp"
#include "examples/common/reduction.hpp"
#include "examples/common/report.hpp"

namespace ddp::examples::fashion_mnist {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// What parse() (05_fashion_mnist.cpp) chose from the flags.
struct Config {
  std::string model, optimizer, device;
  optim::ScheduleKind schedule = optim::ScheduleKind::kCosine;
  examples::Backend backend = examples::Backend::kThreads;
  int world_size = 2;                      // 0: take it from mpirun
  TimeoutOptions timeout{};                // --timeout
  MpiNodeOptions node{};                   // --mpi-allreduce
  Precision precision = Precision::kFp32;  // --precision (device tensors)
  std::int64_t loss_every = 1;             // --loss-every
  std::int64_t epochs = 2, global_batch = 64, limit_train = 0, limit_test = 0, seed = 1, max_steps = 0;
  examples::CheckpointFlags checkpoints{};  // --checkpoint, --checkpoint-every, --keep-checkpoints, --resume
  examples::ElasticChoice elastic{};        // --elastic, --min-world-size, --max-world-size, --join (Gloo)
  examples::ReductionChoice reduction{};    // --deterministic, --micro-batches, --comm-hook
  examples::LocalChoice local{};            // --local-sgd, --diloco
  double lr = 1e-3, bucket_cap_mb = 25;
  std::optional<double> clip_grad_norm;  // --clip-grad-norm: nn::clip_grad_norm before each optimizer step
  bool auto_cap = false;                 // --bucket-cap-mb auto: tune_bucket_cap chooses it before training
  std::string calibration_cache;         // --calibration-cache
  fs::path data_dir, trace_dir, out_dir;
};

// The header's note on --clip-grad-norm ("" when off).
inline std::string clip_note(Config const& cfg) {
  return cfg.clip_grad_norm ? detail::cat(", gradient 2-norm clipped to ", *cfg.clip_grad_norm) : std::string();
}

// Everything a rank prints before training.
template <class Trainer>
void print_header(Trainer& t, Config const& cfg, std::int64_t steps_per_epoch,
                  TensorDataset<std::int32_t> const& train_set, TensorDataset<std::int32_t> const& test_set) {
  using S = typename Trainer::S;
  std::string backend(std::remove_cvref_t<decltype(t.comm())>::backend_name);
  if constexpr (requires { t.comm().bootstrap(); })
    backend += detail::cat(" (ranks met through ", t.comm().bootstrap(), ")");
  std::printf(
      "fashion_mnist: model %s (%s parameters), %s backend, %s tensors, world size %d, global batch %lld (%lld per "
      "rank)\n",
      cfg.model.c_str(), thousands(t.ddp().parameters().parameter_numel()).c_str(), backend.c_str(),
      std::same_as<S, HostSpace> ? "host" : "device (cuda)", t.comm().world_size(),
      static_cast<long long>(t.global_batch()), static_cast<long long>(t.batch_size()));
  std::printf("optimizer %s lr %g, schedule %s, %lld epoch%s of %lld steps, seed %lld%s\n", cfg.optimizer.c_str(),
              cfg.lr, std::string(optim::schedule_name(cfg.schedule)).c_str(), static_cast<long long>(cfg.epochs),
              cfg.epochs == 1 ? "" : "s", static_cast<long long>(steps_per_epoch), static_cast<long long>(cfg.seed),
              clip_note(cfg).c_str());
  if constexpr (Trainer::ddp_type::world_size_invariant)
    std::printf("deterministic: %lld micro-batches of %lld per global batch, %lld on each rank\n",
                static_cast<long long>(cfg.reduction.micro_batches),
                static_cast<long long>(cfg.global_batch / cfg.reduction.micro_batches),
                static_cast<long long>(t.ddp().micro_batches_per_rank()));
  std::printf("data: %lld train / %lld test images from %s\n", static_cast<long long>(train_set.size()),
              static_cast<long long>(test_set.size()), cfg.data_dir.string().c_str());
  std::printf("%s\n", t.ddp().describe().c_str());
  std::printf("%s\n", t.optimizer().describe().c_str());
  if constexpr (!std::same_as<S, HostSpace>)
    std::printf("precision %s: GEMM and convolution operands in %s, float accumulation and master weights%s\n",
                std::string(name(cfg.precision)).c_str(), std::string(name(cfg.precision)).c_str(),
                cfg.precision == Precision::kFp16 ? ", dynamic loss scaling" : "");
  std::fflush(stdout);
}

// One rank's training once the optimizer is chosen: resume, the epochs (each a fit_epoch with hooks, an exact
// evaluation and a checkpoint), then the timeline, the metrics files and the final line.
template <class Trainer, MemorySpace S>
void train(Trainer& t, Net<S>& net, Timeline& timeline, Config const& cfg, TensorDataset<std::int32_t> const& train_set,
           TensorDataset<std::int32_t> const& test_set, ElasticSession* session) {
  // --elastic: the state of each step's start is kept in memory (keep_state), and a generation after a lost rank
  // resumes from it (resume_kept) instead of --resume.
  constexpr bool kElastic = KeepsLocalState<std::remove_cvref_t<decltype(t.optimizer())>>;
  auto& comm = t.comm();
  auto& opt = t.optimizer();
  int const rank = comm.rank(), world = comm.world_size();
  bool const leader = rank == 0;
  std::int64_t const steps_per_epoch = t.steps_per_epoch(train_set);
  // step: ×0.7 per epoch (the seeds' StepLR); cosine: annealed to 0 over all steps, updated every step
  // (its counter is the global step). The counter is part of the checkpoint.
  optim::Schedule schedule(opt, {.kind = cfg.schedule,
                                 .step = {.step_size = 1, .gamma = 0.7},
                                 .cosine = {.t_max = std::max<std::int64_t>(1, cfg.epochs * steps_per_epoch)}});
  if (leader) print_header(t, cfg, steps_per_epoch, train_set, test_set);

  TrainPosition pos{.world_size = world, .global_batch = cfg.global_batch, .seed = cfg.seed};
  MetricsLog log;          // rank 0's epochs so far; kept in the checkpoint so a resumed run's CSV and plot are whole
  EpochLoss resumed_loss;  // the interrupted epoch's train loss so far (a mid-epoch checkpoint's)
  std::string history;
  std::optional<Resumed> resumed;
  // Under ZeRO stage 1 or 2 a lost rank's optimizer shard went with it: after a change every rank takes the whole
  // state back from the newest checkpoint (--checkpoint, required with --elastic --zero), and the steps since are
  // redone.
  bool const sharded = cfg.reduction.zero > 0;
  if (session) t.list_changes_from(*session);
  if (session && session->generation() > 0 && sharded) {
    resumed = examples::resume_after_change(t, *session, cfg.checkpoints, cfg.reduction.zero, &history, &resumed_loss);
  } else if constexpr (kElastic) {
    if (session && session->generation() > 0) {
      if (auto p = t.resume_kept(*session, &history)) resumed = Resumed{*p, "(the state kept in memory)"};
    } else {
      resumed = examples::resume_job(t, cfg.checkpoints, &history, &resumed_loss);
    }
  } else {
    resumed = examples::resume_job(t, cfg.checkpoints, &history, &resumed_loss);
  }
  if (resumed) {
    std::string const file = resumed->file.string();
    pos = resume_position(resumed->position, pos, file);
    if (!history.empty()) {
      auto const saved = MetricsLog::from_csv(history, file + " (metrics)");
      for (auto const& m : saved.epochs())
        if (m.epoch <= pos.epoch) log.add(m);
    }
    if (leader)
      std::printf("resumed from %s: epoch %lld, step %lld (%lld optimizer steps so far)\n", file.c_str(),
                  static_cast<long long>(pos.epoch + 1), static_cast<long long>(pos.step),
                  static_cast<long long>(pos.global_step));
  }
  schedule.restore(pos.scheduler_epoch);
  auto at = [&](std::int64_t epoch, std::int64_t step, std::int64_t global_step) {
    return TrainPosition{.epoch = epoch,
                         .step = step,
                         .global_step = global_step,
                         .scheduler_epoch = schedule.counter(),
                         .world_size = world,
                         .global_batch = cfg.global_batch,
                         .seed = cfg.seed};
  };
  std::optional<CheckpointSeries> series;
  if (cfg.checkpoints.writes()) series.emplace(cfg.checkpoints.series());
  auto save = [&](TrainPosition const& p) { t.save_checkpoint(*series, p, log.csv()); };
  auto const loss = [](Variable<float, S> const& out, auto const& b) { return cross_entropy(out, to_space<S>(b.y)); };

  Counts final_counts;
  bool stopped = false;  // --max-steps reached
  auto const run_start = Clock::now();
  for (std::int64_t epoch = pos.epoch; epoch < cfg.epochs && !stopped; ++epoch) {
    std::optional<ProgressBar> bar;
    if (leader)
      bar.emplace(epoch + 1, cfg.epochs, steps_per_epoch, cfg.global_batch,
                  ProgressOptions{.interactive = stdout_is_terminal()}, pos.step);
    double const lr = opt.lr();
    StepHooks const hooks{.before_step =
                              [&](StepPosition const& p) {
                                // Deterministic mode keys the masks by each sample's place in the global batch instead.
                                if (!cfg.reduction.deterministic) reseed_dropouts(net, cfg.seed, rank, p.epoch, p.step);
                                if constexpr (kElastic)
                                  if (session && !sharded)
                                    t.keep_state(*session, at(p.epoch, p.step, p.global_step), log.csv());
                                // (joiners waiting: every rank leaves this step here, together, to regroup with them)
                                if (session) admit_joiners(*session, comm);
                                schedule.start_step(p.global_step);
                              },
                          .after_step =
                              [&](StepPosition const& p, double l) {
                                if (bar) bar->update(p.step, l);
                                bool const stop = cfg.max_steps > 0 && p.global_step >= cfg.max_steps;
                                bool const periodic =
                                    cfg.checkpoints.every > 0 && p.global_step % cfg.checkpoints.every == 0;
                                if (series && (periodic || stop) && p.step < p.steps_in_epoch)  // mid-epoch
                                  save(at(p.epoch, p.step, p.global_step));
                                return stop ? StepControl::kStop : StepControl::kContinue;
                              }};
    EpochResult const r = t.fit_epoch(
        train_set,
        EpochStart{
            .epoch = epoch, .step = pos.step, .global_step = pos.global_step, .loss = std::exchange(resumed_loss, {})},
        loss, hooks);
    if (bar) bar->finish();
    pos.global_step = r.global_step;
    stopped = r.stopped;
    if (!r.complete()) {  // stopped mid-epoch: no evaluation, the checkpoint has the position
      if (leader)
        std::printf("stopped after %lld optimizer steps (--max-steps) at epoch %lld, step %lld%s%s\n",
                    static_cast<long long>(pos.global_step), static_cast<long long>(epoch + 1),
                    static_cast<long long>(r.end_step), series ? "; checkpoint: " : "",
                    cfg.checkpoints.file.string().c_str());
      break;
    }
    final_counts = t.evaluate(test_set, 500);
    EpochMetrics const m{.epoch = epoch + 1,
                         .train_loss = r.train.mean_loss(),
                         .test_loss = final_counts.mean_loss(),
                         .test_accuracy = final_counts.accuracy(),
                         .test_correct = final_counts.correct,
                         .test_total = final_counts.total,
                         .seconds = r.seconds,
                         .steps = r.steps,
                         .samples = r.train.total,
                         .lr = lr};
    log.add(m);
    if (leader) {
      std::printf("%s\n", format_epoch_summary(m, cfg.epochs).c_str());
      if (!r.membership_changes.empty()) {  // --elastic: what the epoch went through (each said when it happened)
        std::string changes;
        for (auto const& c : r.membership_changes)
          changes += detail::cat(changes.empty() ? "" : ", ", c.from_world_size, " -> ", c.to_world_size,
                                 " ranks at step ", c.step);
        std::printf("epoch %lld/%lld: membership changes: %s\n", static_cast<long long>(epoch + 1),
                    static_cast<long long>(cfg.epochs), changes.c_str());
      }
      if (auto const scale = t.loss_scale())
        std::printf("loss scale %g (%lld steps skipped for an overflow so far)\n", *scale,
                    static_cast<long long>(t.loss_scale_skipped_steps()));
      std::fflush(stdout);
    }
    schedule.end_epoch(epoch + 1);
    pos = at(epoch + 1, 0, pos.global_step);
    if (series) {
      save(pos);
      if (leader)
        std::printf("checkpoint: %s (epoch %lld done)\n", cfg.checkpoints.file.string().c_str(),
                    static_cast<long long>(epoch + 1));
    }
    if (stopped && leader)
      std::printf("stopped after %lld optimizer steps (--max-steps) at the end of epoch %lld\n",
                  static_cast<long long>(pos.global_step), static_cast<long long>(epoch + 1));
  }

  if (!cfg.trace_dir.empty()) {
    timeline.write_json((cfg.trace_dir / detail::cat("trace_rank", rank, ".json")).string());
    if (leader)
      std::printf("timeline: %s (one per rank; open in ui.perfetto.dev or chrome://tracing)\n",
                  (cfg.trace_dir / "trace_rank*.json").string().c_str());
  }
  if (!leader) return;
  if (!cfg.out_dir.empty() && !log.empty()) {
    log.write_csv(cfg.out_dir / "metrics.csv");
    SvgPlot::write_metrics_svg(log, cfg.out_dir / "metrics.svg",
                               detail::cat("Fashion-MNIST, ", cfg.model, ", ", cfg.optimizer, ", world size ", world));
    std::printf("metrics: %s, %s\n", (cfg.out_dir / "metrics.csv").string().c_str(),
                (cfg.out_dir / "metrics.svg").string().c_str());
  }
  if (final_counts.total > 0 && !stopped)
    std::printf("test accuracy: %.2f%% (%lld/%lld) after %lld epoch%s, %.1f s in total (training and evaluation)\n",
                100.0 * final_counts.accuracy(), static_cast<long long>(final_counts.correct),
                static_cast<long long>(final_counts.total), static_cast<long long>(cfg.epochs),
                cfg.epochs == 1 ? "" : "s", std::chrono::duration<double>(Clock::now() - run_start).count());
  else if (!stopped)
    std::printf("nothing to train: the checkpoint is already at epoch %lld of %lld\n",
                static_cast<long long>(pos.epoch), static_cast<long long>(cfg.epochs));
  if constexpr (requires { opt.bytes_sent(); }) print_local_bytes(opt, t.ddp().wire_bytes());
  if constexpr (requires { t.optimizer().optimizer().gradient_bytes(); }) {
    if (cfg.reduction.zero >= 1) {  // what this rank's gradient pages hold between steps (resident, measured)
      auto const& zero = t.optimizer().optimizer();
      std::printf("ZeRO-%d: rank 0 keeps %lld of %lld gradient bytes between steps (%.3f; 1/%d is %.3f)\n",
                  cfg.reduction.zero, static_cast<long long>(zero.gradient_bytes()),
                  static_cast<long long>(zero.unsharded_gradient_bytes()),
                  double(zero.gradient_bytes()) / double(zero.unsharded_gradient_bytes()), world, 1.0 / world);
    }
  }
  if (cfg.reduction.deterministic)
    std::printf("weights: %s (FNV-1a 64 of the final parameters%s; the same for every world size dividing %lld)\n",
                weights_digest(net.seq).c_str(), cfg.local.replicas > 0 ? ", replica 0's" : "",
                static_cast<long long>(cfg.local.replicas > 0 ? cfg.local.replicas : cfg.reduction.micro_batches));
  std::fflush(stdout);
}

// One rank's job on tensors of space S (host, or device with --device cuda): the model, its trainer (DDP with
// the chosen bucket cap, the chosen optimizer) and train().
template <MemorySpace S, class Comm>
void run(Comm& comm, Config const& cfg, TensorDataset<std::int32_t> const& train_set,
         TensorDataset<std::int32_t> const& test_set, ElasticSession* session = nullptr) {
  Generator init(static_cast<std::uint64_t>(cfg.seed));  // the same on every rank (DDP broadcasts rank 0's anyway)
  Net<S> net = cfg.model == "cnn" ? make_cnn<S>(init) : make_mlp<S>(init);
  Timeline timeline(comm.rank());
  auto const cap = static_cast<std::size_t>(cfg.bucket_cap_mb * double(1 << 20));
  SizeCapped bucketer{BucketConfig{.cap_bytes = cap, .first_cap_bytes = std::min(cap, kDefaultFirstBucketBytes)}};
  if constexpr (std::same_as<S, HostSpace>) {
    if (cfg.auto_cap) bucketer = auto_bucket_cap(comm, net.seq, train_set, cfg.global_batch, cfg.calibration_cache);
  }
  TrainerOptions const opts{
      .seed = static_cast<std::uint64_t>(cfg.seed),
      .drop_last = false,
      // Device tensors: these models give every parameter a gradient every step, so
      // DDP's bookkeeping stays on the device after the first (no copy per step).
      .ddp = {.timeline = cfg.trace_dir.empty() ? nullptr : &timeline, .static_graph = !std::same_as<S, HostSpace>},
      .global_batch = cfg.global_batch,
      .clip_grad_norm = cfg.clip_grad_norm,
      .loss_scaling = cfg.precision == Precision::kFp16
                          ? std::optional<optim::GradScalerOptions>(optim::GradScalerOptions{})
                          : std::nullopt,
      .loss_every = cfg.loss_every};
  // --precision: this rank's thread runs its GEMMs and convolutions in it (device tensors; parse() refuses it on
  // host tensors, and so would the compiler).
  std::optional<autocast> precision;
  if constexpr (!std::same_as<S, HostSpace>) precision.emplace(cfg.precision);
  // The one training loop, for every composition the flags choose (examples/common/reduction.hpp).
  // The optimizer always under ZeroRedundancyOptimizer, whose stage 0 is the optimizer itself, and under
  // OverlappedOptimizer, which with UpdateAt::kStep steps after backward: --zero and --overlap-update are values,
  // not other types.
  auto go = [&]<optim::Optimizer O, class R, class Bt>(std::type_identity<O>, typename O::options_type const& o,
                                                       R reduction, Bt batching) {
    using Opt = OverlappedOptimizer<ZeroRedundancyOptimizer<O, Comm>>;
    basic_trainer<nn::AnySequential<float, S>, Comm, Opt, SizeCapped, R, Bt> t(
        net.seq, comm,
        {.optimizer = {.optimizer = o, .zero = {.stage = cfg.reduction.zero}},
         .overlap = {.update_at = cfg.reduction.update}},
        opts, {.bucketer = bucketer, .reduction = reduction, .batching = batching});
    train(t, net, timeline, cfg, train_set, test_set, session);
  };
  if (cfg.reduction.deterministic)  // one counter stream per dropout layer, the same on every rank: masks are
    for (std::size_t k = 0; k < net.dropouts.size(); ++k)  // keyed by the sample
      net.dropouts[k].generator().seed(static_cast<std::uint64_t>(cfg.seed), examples::mix(k + 1));
  // --local-sgd, --diloco: the optimizer under LocalSgd or DiLoCo (host tensors), on the default reduction, or with
  // --deterministic and --replicas on deterministic mode's (virtual replicas).
  auto go_local = [&]<optim::Optimizer O>(std::type_identity<O>, typename O::options_type const& o) {
    auto const train_with = [&]<class Opt>(std::type_identity<Opt>, typename Opt::options_type const& lo) {
      if (cfg.reduction.deterministic) {
        basic_trainer<nn::AnySequential<float, S>, Comm, Opt, SizeCapped, ExactSum, MicroBatches> t(
            net.seq, comm, lo, opts,
            {.bucketer = bucketer, .reduction = {}, .batching = {.count = cfg.reduction.micro_batches}});
        train(t, net, timeline, cfg, train_set, test_set, session);
      } else {
        basic_trainer<nn::AnySequential<float, S>, Comm, Opt> t(net.seq, comm, lo, opts, {.bucketer = bucketer});
        train(t, net, timeline, cfg, train_set, test_set, session);
      }
    };
    auto const& l = cfg.local;
    if (l.local_sgd > 0)
      train_with(std::type_identity<LocalSgd<O, Comm>>{}, {.optimizer = o,
                                                           .local = {.period = l.local_sgd,
                                                                     .warmup_steps = l.warmup,
                                                                     .average_optimizer_state = l.average_state,
                                                                     .replicas = l.replicas,
                                                                     .node_period = l.node_period}});
    else
      train_with(std::type_identity<DiLoCo<O, Comm>>{}, {.optimizer = o,
                                                         .outer = {.period = l.diloco,
                                                                   .outer_lr = l.outer_lr,
                                                                   .outer_momentum = l.outer_momentum,
                                                                   .wire = l.wire,
                                                                   .replicas = l.replicas}});
  };
  if constexpr (std::same_as<S, HostSpace>) {
    if (cfg.local.on()) {
      if (cfg.optimizer == "adamw")
        go_local(std::type_identity<optim::basic_adamw<float, S>>{}, {.lr = cfg.lr});
      else if (cfg.optimizer == "adam")
        go_local(std::type_identity<optim::basic_adam_l2<float, S>>{}, {.lr = cfg.lr});
      else
        go_local(std::type_identity<optim::basic_sgd<float, S>>{}, {.lr = cfg.lr, .momentum = 0.9});
      return;
    }
  }
  // The device build instantiates the default composition only (parse() rejects the others with --device cuda).
  with_reduction<std::same_as<S, HostSpace>>(cfg.reduction, [&](auto reduction, auto batching) {
    if (cfg.optimizer == "adamw")
      go(std::type_identity<optim::basic_adamw<float, S>>{}, {.lr = cfg.lr}, reduction, batching);
    else if (cfg.optimizer == "adam")
      go(std::type_identity<optim::basic_adam_l2<float, S>>{}, {.lr = cfg.lr}, reduction, batching);
    else
      go(std::type_identity<optim::basic_sgd<float, S>>{}, {.lr = cfg.lr, .momentum = 0.9}, reduction, batching);
  });
}

// The job on host tensors: examples::launch on the chosen backend, run<HostSpace> on each rank. Defined in
// 05_fashion_mnist_host.cpp; returns main()'s exit status.
int run_host(Config const& cfg, TensorDataset<std::int32_t> const& train_set,
             TensorDataset<std::int32_t> const& test_set, int argc, char** argv);

}  // namespace ddp::examples::fashion_mnist
