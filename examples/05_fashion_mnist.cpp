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
#include <cstdio>
#include <exception>
#include <optional>
#include <string>

#include "examples/common/elastic.hpp"
#include "examples/common/fashion_mnist_job.hpp"
#include "examples/common/flags.hpp"
#include "examples/common/launch.hpp"
#include "examples/common/local_rounds.hpp"
#include "examples/common/reduction.hpp"

#if defined(__CUDACC__)  // the fashion_mnist_cuda target: device tensors on Thrust's CUDA system, NCCL
#include <ddp/comm/nccl.hpp>
#include <ddp/tensor/device.hpp>
#endif

namespace {

using namespace ddp;
using namespace ddp::examples;  // flags, launch, reduction
using namespace ddp::examples::fashion_mnist;

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
      .add("trace", "", "write a Chrome/Perfetto timeline per rank into this directory (trace_rank<r>.json)")
      .add("out", "", "write metrics.csv and metrics.svg (loss and accuracy per epoch) into this directory")
      .add("limit-train", "0", "use only the first N training images (0: all 60000)")
      .add("limit-test", "0", "use only the first N test images (0: all 10000)");
  examples::add_resume_flags(f);
  examples::add_elastic_flags(f);
  examples::add_reduction_flags(f);
  examples::add_local_flags(f);
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
  c.max_steps = f.at_least("max-steps", 0);
  c.reduction =
      examples::reduction_choice(f, c.backend == examples::Backend::kThreads ? c.world_size : 0, c.global_batch);
  c.local = examples::local_choice(f, c.reduction, c.backend);
  c.checkpoints = examples::checkpoint_flags(f);
  c.elastic =
      examples::elastic_choice(f, c.backend, c.local.on() ? (c.local.local_sgd > 0 ? "--local-sgd" : "--diloco") : "",
                               c.reduction.zero, c.checkpoints.writes());
  if (c.local.on() && c.device == "cuda")
    throw ArgumentError(detail::cat("fashion_mnist: ", c.local.local_sgd > 0 ? "--local-sgd" : "--diloco",
                                    " runs on host tensors in this program; drop --device cuda"));
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
  c.trace_dir = user_path(f.str("trace"));
  c.out_dir = user_path(f.str("out"));
  for (auto const* d : {&c.trace_dir, &c.out_dir}) make_directory(*d, "fashion_mnist");
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
    return run_host(*cfg, *train_set, *test_set, argc, argv);  // 05_fashion_mnist_host.cpp
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
