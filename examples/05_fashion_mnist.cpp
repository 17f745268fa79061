// 05_fashion_mnist: the main job — a CNN (the seeds' BasicNet) or an MLP trained data-parallel on
// Fashion-MNIST with AdamW, on threads or under mpirun; progress bar, exact distributed evaluation,
// atomic checkpoints with exact resume (also with another world size or bucket cap), a metrics CSV + SVG plot and a
// per-rank Chrome/Perfetto timeline. The same code trains on host tensors (--device cpu) or, built by nvcc, on GPUs
// (--device cuda: device tensors, NcclBackend, one GPU per rank chosen by the node-local rank; the ranks meet
// over MPI under mpirun, else through the rendezvous store: torchrun, MASTER_ADDR/MASTER_PORT or DDP_STORE_FILE).
//   bazel run //examples:fashion_mnist                       (threads, 2 ranks, CNN, 2 epochs)
//   bazel run //examples:fashion_mnist -- --model mlp --out /tmp/fm --trace /tmp/fm
//   mpirun -n 2 bazel-bin/examples/fashion_mnist --backend mpi
//   mpirun -n 2 bazel-bin/examples/fashion_mnist_cuda --device cuda     (nvcc build, one GPU per rank)
//   torchrun --redirects 1 --tee 1 --nproc_per_node=2 --no_python bazel-bin/examples/fashion_mnist_cuda --device cuda
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <type_traits>

#include <ddp/data/global_batch_sampler.hpp>
#include <ddp/ddp.hpp>
#include <ddp/tensor/precision.hpp>
#include <ddp/train/checkpoint.hpp>
#include <ddp/train/evaluate.hpp>
#include <ddp/train/metrics_log.hpp>
#include <ddp/train/progress.hpp>

#include "examples/common/flags.hpp"
#include "examples/common/launch.hpp"
#include "examples/common/models.hpp"
#include "examples/common/reduction.hpp"
#include "examples/common/report.hpp"

#if defined(__CUDACC__)  // the fashion_mnist_cuda target: device tensors on Thrust's CUDA system, NCCL
#include <ddp/comm/nccl.hpp>
#include <ddp/tensor/device.hpp>
#endif

namespace {

using namespace ddp;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Config {
  std::string model, optimizer, device;
  optim::ScheduleKind schedule = optim::ScheduleKind::kCosine;
  examples::Backend backend = examples::Backend::kThreads;
  int world_size = 2;                      // 0: take it from mpirun
  TimeoutOptions timeout{};                // --timeout
  MpiNodeOptions node{};                   // --mpi-allreduce
  Precision precision = Precision::kFp32;  // --precision (device tensors)
  std::int64_t loss_every = 1;             // --loss-every
  std::int64_t epochs = 2, global_batch = 64, limit_train = 0, limit_test = 0, seed = 1, checkpoint_every = 0,
               max_steps = 0;
  examples::ReductionChoice reduction{};  // --deterministic, --micro-batches, --comm-hook
  double lr = 1e-3, bucket_cap_mb = 25;
  std::optional<double> clip_grad_norm;  // --clip-grad-norm: nn::clip_grad_norm before each optimizer step
  bool auto_cap = false;                 // --bucket-cap-mb auto: tune_bucket_cap chooses it before training
  std::string calibration_cache;         // --calibration-cache
  fs::path data_dir, checkpoint, resume, trace_dir, out_dir;
};

// The header's note on --clip-grad-norm ("" when off).
std::string clip_note(Config const& cfg) {
  return cfg.clip_grad_norm ? detail::cat(", gradient 2-norm clipped to ", *cfg.clip_grad_norm) : std::string();
}

using namespace ddp::examples;  // flags, launch, models, report

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
           TensorDataset<std::int32_t> const& test_set) {
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
  MetricsLog log;  // rank 0's epochs so far; kept in the checkpoint so a resumed run's CSV and plot are whole
  if (!cfg.resume.empty()) {
    std::string history;
    pos = resume_position(load_checkpoint(cfg.resume, comm, t.ddp().module(), opt, &history), pos, cfg.resume.string());
    if (!history.empty()) {
      auto const saved = MetricsLog::from_csv(history, cfg.resume.string() + " (metrics)");
      for (auto const& m : saved.epochs())
        if (m.epoch <= pos.epoch) log.add(m);
    }
    if (leader)
      std::printf("resumed from %s: epoch %lld, step %lld (%lld optimizer steps so far)\n", cfg.resume.string().c_str(),
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
  auto save = [&](TrainPosition const& p) {
    save_checkpoint(cfg.checkpoint, comm, t.ddp().module(), opt, p, log.csv());
  };
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
    StepHooks const hooks{
        .before_step =
            [&](StepPosition const& p) {
              // Deterministic mode keys the masks by each sample's place in the global batch instead.
              if (!cfg.reduction.deterministic) reseed_dropouts(net, cfg.seed, rank, p.epoch, p.step);
              schedule.start_step(p.global_step);
            },
        .after_step =
            [&](StepPosition const& p, double l) {
              if (bar) bar->update(p.step, l);
              bool const stop = cfg.max_steps > 0 && p.global_step >= cfg.max_steps;
              bool const periodic = cfg.checkpoint_every > 0 && p.global_step % cfg.checkpoint_every == 0;
              if (!cfg.checkpoint.empty() && (periodic || stop) && p.step < p.steps_in_epoch)  // mid-epoch
                save(at(p.epoch, p.step, p.global_step));
              return stop ? StepControl::kStop : StepControl::kContinue;
            }};
    EpochResult const r = t.fit_epoch(
        train_set, EpochStart{.epoch = epoch, .step = pos.step, .global_step = pos.global_step}, loss, hooks);
    if (bar) bar->finish();
    pos.global_step = r.global_step;
    stopped = r.stopped;
    if (!r.complete()) {  // stopped mid-epoch: no evaluation, the checkpoint has the position
      if (leader)
        std::printf("stopped after %lld optimizer steps (--max-steps) at epoch %lld, step %lld%s%s\n",
                    static_cast<long long>(pos.global_step), static_cast<long long>(epoch + 1),
                    static_cast<long long>(r.end_step),
                    cfg.checkpoint.empty() ? "" : "; checkpoint: ", cfg.checkpoint.string().c_str());
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
      if (auto const scale = t.loss_scale())
        std::printf("loss scale %g (%lld steps skipped for an overflow so far)\n", *scale,
                    static_cast<long long>(t.loss_scale_skipped_steps()));
      std::fflush(stdout);
    }
    schedule.end_epoch(epoch + 1);
    pos = at(epoch + 1, 0, pos.global_step);
    if (!cfg.checkpoint.empty()) {
      save(pos);
      if (leader)
        std::printf("checkpoint: %s (epoch %lld done)\n", cfg.checkpoint.string().c_str(),
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
    log.write_svg(cfg.out_dir / "metrics.svg",
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
  if (cfg.reduction.zero >= 1) {  // what this rank's gradient pages hold between steps (resident, measured)
    auto const& zero = t.optimizer().optimizer();
    std::printf("ZeRO-%d: rank 0 keeps %lld of %lld gradient bytes between steps (%.3f; 1/%d is %.3f)\n",
                cfg.reduction.zero, static_cast<long long>(zero.gradient_bytes()),
                static_cast<long long>(zero.unsharded_gradient_bytes()),
                double(zero.gradient_bytes()) / double(zero.unsharded_gradient_bytes()), world, 1.0 / world);
  }
  if (cfg.reduction.deterministic)
    std::printf("weights: %s (FNV-1a 64 of the final parameters; the same for every world size dividing %lld)\n",
                weights_digest(net.seq).c_str(), static_cast<long long>(cfg.reduction.micro_batches));
  std::fflush(stdout);
}

// One rank's job on tensors of space S (host, or device with --device cuda): the model, its trainer (DDP with
// the chosen bucket cap, the chosen optimizer) and train().
template <MemorySpace S, class Comm>
void run(Comm& comm, Config const& cfg, TensorDataset<std::int32_t> const& train_set,
         TensorDataset<std::int32_t> const& test_set) {
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
        opts, bucketer, reduction, batching);
    train(t, net, timeline, cfg, train_set, test_set);
  };
  if (cfg.reduction.deterministic)  // one counter stream per dropout layer, the same on every rank: masks are
    for (std::size_t k = 0; k < net.dropouts.size(); ++k)  // keyed by the sample
      net.dropouts[k].generator().seed(static_cast<std::uint64_t>(cfg.seed), examples::mix(k + 1));
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

// Parses and checks the flags; throws ArgumentError. Returns nullopt after --help.
std::optional<Config> parse(int argc, char** argv) {
  examples::Flags f(
      "fashion_mnist",
      "Trains a CNN or an MLP on Fashion-MNIST with DistributedDataParallel and reports the test accuracy.");
  examples::add_launch_flags(f)
      .add("model", "cnn", "cnn (BasicNet: 2 conv, max-pool, dropout, 2 fc) or mlp (784-256-128-10)")
      .add("device", "cpu",
           "cpu (host tensors) or cuda (device tensors, NCCL, one GPU per rank, under mpirun; needs the "
           "nvcc build //examples:fashion_mnist_cuda)")
      .add("precision", "fp32",
           "fp32, tf32, bf16 or fp16: the precision of the GEMM and convolution operands on device tensors (float "
           "accumulation, float master weights and optimizer state; fp16 adds dynamic loss scaling). Device tensors "
           "only (--device cuda)")
      .add("loss-every", "1",
           "read the loss on the host every N steps (and at each epoch's end): on device tensors the host then "
           "waits for the device once per N steps, not every step; the progress line shows the latest loss read")
      .add("epochs", "2", "epochs to train (a resumed run continues up to this many)")
      .add("batch-size", "64", "global batch: samples per step over all ranks (a multiple of the world size)")
      .add("lr", "", "learning rate (default: 0.001 for cnn, 0.002 for mlp)")
      .add("optimizer", "adamw", "sgd (momentum 0.9), adam or adamw (weight decay 0.01)")
      .add("schedule", "cosine",
           "learning rate schedule: none, step (x0.7 each epoch) or cosine (to 0 over all steps, per step)")
      .add("clip-grad-norm", "off",
           "before each optimizer step, scale the averaged gradients down to this 2-norm (PyTorch's "
           "clip_grad_norm_), or off")
      .add("bucket-cap-mb", "25",
           "DDP gradient bucket size cap in MiB (the first bucket is at most 1 MiB), or auto: the cost model "
           "chooses it for this model, backend and layout (calibrating the backend first; see "
           "--calibration-cache)")
      .add("calibration-cache", "",
           "with --bucket-cap-mb auto: read the backend's calibration from this file, or append it after the probe")
      .add("seed", "1", "seed of the initial weights, the shuffle order and (plus the rank) dropout")
      .add("data-dir", std::string(kFashionMnistDefaultDir), "directory with the four Fashion-MNIST IDX files (.gz)")
      .add("checkpoint", "", "write a checkpoint to this file at the end of every epoch (atomically)")
      .add("checkpoint-every", "0",
           "also write the checkpoint every N optimizer steps, mid-epoch included (0: epoch ends only)")
      .add("max-steps", "0", "stop after this many optimizer steps in total (0: no limit), writing --checkpoint there")
      .add("resume", "",
           "resume from this checkpoint (weights, buffers, optimizer, schedule, epoch and step); the "
           "world size and bucket cap may differ from the run that wrote it")
      .add("trace", "", "write a Chrome/Perfetto timeline per rank into this directory (trace_rank<r>.json)")
      .add("out", "", "write metrics.csv and metrics.svg (loss and accuracy per epoch) into this directory")
      .add("limit-train", "0", "use only the first N training images (0: all 60000)")
      .add("limit-test", "0", "use only the first N test images (0: all 10000)");
  examples::add_reduction_flags(f);
  if (!f.parse(argc, argv)) return std::nullopt;
  Config c;
  c.model = f.choice("model", {"cnn", "mlp"});
  examples::LaunchChoice const chosen = examples::launch_choice(f);
  c.backend = chosen.backend;
  c.timeout = chosen.timeout;
  c.node = chosen.node;
  c.optimizer = f.choice("optimizer", {"sgd", "adam", "adamw"});
  c.schedule = optim::parse_schedule_kind(f.choice("schedule", {"none", "step", "cosine"}));
  c.device = f.choice("device", {"cpu", "cuda"});
#if !defined(__CUDACC__)
  if (c.device == "cuda")
    throw ArgumentError(
        "fashion_mnist: --device cuda needs the CUDA build: bazel build //examples:fashion_mnist_cuda "
        "(nvcc), then mpirun -n <GPUs> bazel-bin/examples/fashion_mnist_cuda --device cuda");
#endif
  c.precision = parse_precision(f.choice("precision", {"fp32", "tf32", "bf16", "fp16"}));
  if (c.precision != Precision::kFp32 && c.device != "cuda")
    throw ArgumentError(detail::cat("--precision ", name(c.precision),
                                    " is for device tensors (--device cuda, the nvcc build "
                                    "//examples:fashion_mnist_cuda): host tensors compute in float"));
  if (c.device == "cuda" && f.is_set("backend") && c.backend != examples::Backend::kMpi)
    throw ArgumentError(
        "fashion_mnist: --device cuda uses NcclBackend (one rank per GPU), whose ranks meet over MPI under mpirun, "
        "else through torchrun's store, MASTER_ADDR/MASTER_PORT or DDP_STORE_FILE; drop --backend");
  if (c.device == "cuda") c.backend = examples::Backend::kMpi;
  // launch_choice took the size from the launcher for mpi and gloo; --device cuda switched to MPI after it.
  c.world_size = c.backend != examples::Backend::kThreads && !f.is_set("world-size") ? 0 : chosen.world_size;
  c.epochs = f.at_least("epochs", 1);
  c.loss_every = f.at_least("loss-every", 1);
  c.global_batch = f.at_least("batch-size", 1);
  c.limit_train = f.at_least("limit-train", 0);
  c.limit_test = f.at_least("limit-test", 0);
  c.seed = f.at_least("seed", 0);
  c.checkpoint_every = f.at_least("checkpoint-every", 0);
  c.max_steps = f.at_least("max-steps", 0);
  c.reduction =
      examples::reduction_choice(f, c.backend == examples::Backend::kThreads ? c.world_size : 0, c.global_batch);
  if (c.device == "cuda" && c.reduction.zero == 2)
    throw ArgumentError(
        "fashion_mnist: --zero 2 releases the gradient pages outside each rank's slices, which needs host memory; "
        "with --device cuda use --zero 1");
  if (c.device == "cuda" && (c.reduction.deterministic || c.reduction.comm_hook != "none"))
    throw ArgumentError(detail::cat(
        "fashion_mnist: ", c.reduction.deterministic ? "--deterministic" : "--comm-hook " + c.reduction.comm_hook,
        " runs on host tensors in this program; drop it with --device cuda"));
  c.lr = f.str("lr").empty() ? (c.model == "cnn" ? 1e-3 : 2e-3) : f.real("lr");
  if (!(c.lr > 0 && c.lr < 100))
    throw ArgumentError(detail::cat("fashion_mnist: --lr must be in (0, 100), got ", f.str("lr")));
  c.clip_grad_norm = f.number_or("clip-grad-norm", "off", "a positive number");
  if (c.clip_grad_norm && !(*c.clip_grad_norm > 0))
    throw ArgumentError(detail::cat("fashion_mnist: --clip-grad-norm must be a positive number or off, got '",
                                    f.str("clip-grad-norm"), "'"));
  if (c.clip_grad_norm && c.reduction.update == UpdateAt::kBucketReduced)
    throw ArgumentError(
        "fashion_mnist: --clip-grad-norm with --overlap-update: clipping needs every bucket's gradient before any "
        "parameter moves, and --overlap-update moves each bucket's as it lands; drop one of them");
  std::optional<double> const cap = f.number_or("bucket-cap-mb", "auto", "a number of MiB");
  c.auto_cap = !cap;
  c.calibration_cache = user_path(f.str("calibration-cache")).string();
  if (!c.calibration_cache.empty() && !c.auto_cap)
    throw ArgumentError("fashion_mnist: --calibration-cache is for --bucket-cap-mb auto");
  if (c.auto_cap && (c.device == "cuda" || c.reduction.deterministic))
    throw ArgumentError(
        "fashion_mnist: --bucket-cap-mb auto profiles host tensors on the default DDP path; give a number with "
        "--device cuda or --deterministic");
  if (cap) c.bucket_cap_mb = *cap;
  if (!(c.bucket_cap_mb >= 0 && c.bucket_cap_mb <= 4096))
    throw ArgumentError(
        detail::cat("fashion_mnist: --bucket-cap-mb must be in [0, 4096], got ", f.str("bucket-cap-mb")));
  if (c.backend == examples::Backend::kThreads && c.global_batch % c.world_size != 0)
    throw ArgumentError(detail::cat("fashion_mnist: --batch-size ", c.global_batch,
                                    " must be a multiple of --world-size ", c.world_size, " (it is the global batch)"));
  c.data_dir = user_path(f.str("data-dir"));
  c.checkpoint = user_path(f.str("checkpoint"));
  c.resume = user_path(f.str("resume"));
  c.trace_dir = user_path(f.str("trace"));
  c.out_dir = user_path(f.str("out"));
  for (auto const* d : {&c.trace_dir, &c.out_dir}) make_directory(*d, "fashion_mnist");
  if (!c.resume.empty() && !fs::exists(c.resume))
    throw ArgumentError(detail::cat("fashion_mnist: --resume ", c.resume.string(), " does not exist"));
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<Config> cfg;
  try {
    cfg = parse(argc, argv);
    if (!cfg) return 0;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  // Loaded once per process: the threads backend's ranks share it (collate is thread-safe).
  std::optional<TensorDataset<std::int32_t>> train_set, test_set;
  try {
    train_set.emplace(FashionMnist::load({.dir = cfg->data_dir, .split = Split::kTrain, .limit = cfg->limit_train}));
    test_set.emplace(FashionMnist::load({.dir = cfg->data_dir, .split = Split::kTest, .limit = cfg->limit_test}));
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  try {
#if defined(__CUDACC__)
    if (cfg->device == "cuda") {  // one rank per process and GPU: NcclBackend
      std::string const launcher = launch_env().source;
      if (launcher == "mpich" || launcher == "openmpi") {  // under mpirun: the ranks meet over MPI
        MpiSession session(argc, argv);
        try {
          if (cfg->world_size != 0 && cfg->world_size != session.world_size())
            throw ArgumentError(detail::cat("--world-size ", cfg->world_size, " does not match the MPI job's ",
                                            session.world_size(), " ranks (set it with mpirun -n)"));
          NcclBackend comm(session, NcclOptions{.timeout = cfg->timeout});
          run<DeviceSpace>(comm, *cfg, *train_set, *test_set);
        } catch (std::exception const& e) {
          session.abort(e.what());
        }
        return 0;
      }
      int rank = -1;  // else (torchrun, srun with DDP_STORE_FILE, one process): through the rendezvous store
      try {
        Rendezvous rv = rendezvous({.timeout = cfg->timeout.after});
        rank = rv.launch.rank;
        if (cfg->world_size != 0 && cfg->world_size != rv.launch.world_size)
          throw ArgumentError(detail::cat("--world-size ", cfg->world_size, " does not match the launcher's ",
                                          rv.launch.world_size, " ranks (WORLD_SIZE)"));
        NcclBackend comm(std::move(rv), NcclOptions{.timeout = cfg->timeout});
        run<DeviceSpace>(comm, *cfg, *train_set, *test_set);
      } catch (std::exception const& e) {
        std::fprintf(stderr, "error: %s%s\n", rank >= 0 ? detail::cat("rank ", rank, ": ").c_str() : "", e.what());
        return 1;
      }
      return 0;
    }
#endif
    return examples::launch(
        cfg->backend, cfg->world_size, argc, argv,
        [&](auto& comm) { run<HostSpace>(comm, *cfg, *train_set, *test_set); }, cfg->timeout, cfg->node);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
