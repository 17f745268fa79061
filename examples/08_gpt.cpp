// 08_gpt: the main job for text — a character-level GPT (nanoGPT's shakespeare_char CPU recipe: 4 layers, 4 heads,
// width 128, block 64, AdamW with a warm-up + cosine schedule) trained data-parallel on tinyshakespeare, on threads
// (2 ranks by default), under mpirun or torchrun. Prints progress with tokens/s and ETA, the validation loss over
// the whole validation split at intervals, and at the end a generated sample.
//   bazel run //examples:gpt
//   bazel run //examples:gpt -- --iters 200 --out /tmp/gpt --sample 300 --temperature 0.8 --top-k 20
//   mpirun -n 2 bazel-bin/examples/gpt --backend mpi --deterministic
//   torchrun --redirects 1 --tee 1 --nproc_per_node 2 --no_python bazel-bin/examples/gpt --backend gloo
#include <cstdio>
#include <exception>
#include <optional>
#include <string>

#include "examples/common/elastic.hpp"
#include "examples/common/flags.hpp"
#include "examples/common/gpt_job.hpp"
#include "examples/common/launch.hpp"
#include "examples/common/local_rounds.hpp"
#include "examples/common/reduction.hpp"
#include "examples/common/report.hpp"

namespace {

using namespace ddp;
using namespace ddp::examples;
namespace fs = std::filesystem;

// The vendored corpus: under `bazel run` in the runfiles tree, else from the workspace `bazel run` was called in.
std::string default_data() {
  fs::path const rel = "third_party/tinyshakespeare/input.txt";
  if (fs::exists(rel)) return rel.string();
  if (char const* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY")) return (fs::path(ws) / rel).string();
  return rel.string();
}

// Parses and checks the flags; throws ArgumentError. Returns nullopt after --help.
std::optional<gpt::Config> parse(int argc, char** argv) {
  Flags f("gpt",
          "Trains a character-level GPT on a text file with DistributedDataParallel, reports the validation loss and "
          "prints a sample.");
  add_launch_flags(f)
      .add("data", "", "the text file (default: the vendored tinyshakespeare, third_party/tinyshakespeare/input.txt)")
      .add("iters", "2000", "optimizer steps to train (a resumed run continues up to this many)")
      .add("batch-size", "24", "global batch: sequences per step over all ranks (a multiple of the world size)")
      .add("grad-accum", "1",
           "micro-steps per rank per step: their gradients add up locally (no_sync) and are reduced once")
      .add("block-size", "64", "context length: tokens per sequence (the position table's rows)")
      .add("n-layer", "4", "transformer blocks")
      .add("n-head", "4", "attention heads (dividing --n-embd)")
      .add("n-embd", "128", "model width")
      .add("dropout", "0", "dropout on the embeddings, attention weights and residual branches, in [0, 1)")
      .add("bias", "true", "biases in the Linear and LayerNorm layers")
      .add("lr", "1e-3", "peak learning rate (after the warm-up)")
      .add("min-lr", "1e-4", "learning rate the cosine decays to at --iters")
      .add("warmup", "100", "warm-up steps (linear from lr/warmup)")
      .add("beta2", "0.99", "AdamW's beta2 (beta1 0.9)")
      .add("weight-decay", "0.1", "AdamW's decoupled weight decay, on weight matrices and embeddings only")
      .add("clip", "1.0", "clip the gradients' total 2-norm to this before each step (0: off)")
      .add("seed", "1337", "seed of the initial weights, the sampler and dropout")
      .add("eval-interval", "250", "iterations between validation losses (0: only at the end)")
      .add("log-interval", "50", "iterations between progress lines")
      .add("checkpoint", "", "write a checkpoint to this file every --checkpoint-every steps and at the end")
      .add("checkpoint-every", "0", "steps between checkpoints (0: at the end only)")
      .add("max-steps", "0", "stop after this many steps in total (0: at --iters), writing --checkpoint there")
      .add("sample", "500", "characters to generate at the end (0: none)")
      .add("temperature", "0.8", "sampling temperature (> 0)")
      .add("top-k", "0", "sample among the k most likely characters only (0: all)")
      .add("sample-seed", "1", "seed of the sample's draws")
      .add("trace", "", "write a Chrome/Perfetto timeline per rank into this directory (trace_rank<r>.json)")
      .add("out", "", "write losses.csv and losses.svg (train and validation loss per evaluation) into this directory");
  add_resume_flags(f);
  add_reduction_flags(f);
  add_local_flags(f);
  add_elastic_flags(f);
  if (!f.parse(argc, argv)) return std::nullopt;
  gpt::Config c;
  c.launch = launch_choice(f);
  c.iters = f.at_least("iters", 1);
  c.global_batch = f.at_least("batch-size", 1);
  c.model.block_size = f.at_least("block-size", 1);
  c.model.n_layer = f.at_least("n-layer", 1);
  c.model.n_head = f.at_least("n-head", 1);
  c.model.n_embd = f.at_least("n-embd", 1);
  c.model.bias = f.boolean("bias");
  c.model.dropout = f.real("dropout");
  if (c.model.n_embd % c.model.n_head != 0)
    throw ArgumentError(
        detail::cat("gpt: --n-embd ", c.model.n_embd, " is not a multiple of --n-head ", c.model.n_head));
  if (!(c.model.dropout >= 0 && c.model.dropout < 1))
    throw ArgumentError(detail::cat("gpt: --dropout must be in [0, 1), got ", f.str("dropout")));
  c.lr = f.real("lr");
  c.min_lr = f.real("min-lr");
  if (!(c.lr > 0 && c.lr < 10) || !(c.min_lr >= 0 && c.min_lr <= c.lr))
    throw ArgumentError(
        detail::cat("gpt: need 0 < --lr < 10 and 0 <= --min-lr <= --lr, got ", f.str("lr"), " and ", f.str("min-lr")));
  c.warmup = f.at_least("warmup", 0);
  c.beta2 = f.real("beta2");
  if (!(c.beta2 >= 0 && c.beta2 < 1)) throw ArgumentError(detail::cat("gpt: --beta2 must be in [0, 1), got ", c.beta2));
  c.weight_decay = f.real("weight-decay");
  if (!(c.weight_decay >= 0)) throw ArgumentError("gpt: --weight-decay must be >= 0");
  c.clip = f.real("clip");
  if (!(c.clip >= 0)) throw ArgumentError("gpt: --clip must be >= 0 (0: off)");
  c.seed = f.at_least("seed", 0);
  c.eval_interval = f.at_least("eval-interval", 0);
  c.log_interval = f.at_least("log-interval", 1);
  c.max_steps = f.at_least("max-steps", 0);
  c.sample_tokens = f.at_least("sample", 0);
  c.temperature = f.real("temperature");
  if (!(c.temperature > 0))
    throw ArgumentError(detail::cat("gpt: --temperature must be > 0, got ", f.str("temperature")));
  c.top_k = f.at_least("top-k", 0);
  c.sample_seed = static_cast<std::uint64_t>(f.at_least("sample-seed", 0));
  c.reduction = reduction_choice(f, c.launch.backend == Backend::kThreads ? c.launch.world_size : 0, c.global_batch);
  c.grad_accum = f.at_least("grad-accum", 1);
  c.local = local_choice(f, c.reduction, c.launch.backend);
  if (c.local.on() && c.grad_accum > 1)
    throw ArgumentError(detail::cat("gpt: ", c.local.local_sgd > 0 ? "--local-sgd" : "--diloco",
                                    " with --grad-accum: local steps take one pass per step here; drop one"));
  if (c.grad_accum > 1 && (c.reduction.deterministic || c.reduction.comm_hook != "none"))
    throw ArgumentError(
        detail::cat("gpt: --grad-accum with ",
                    c.reduction.deterministic ? "--deterministic" : "--comm-hook " + c.reduction.comm_hook,
                    ": accumulation runs on the default float all-reduce (--deterministic has its own "
                    "micro-batches: --micro-batches)"));
  if (c.launch.backend == Backend::kThreads && c.global_batch % (c.launch.world_size * c.grad_accum) != 0)
    throw ArgumentError(detail::cat("gpt: --batch-size ", c.global_batch, " must be a multiple of --world-size ",
                                    c.launch.world_size, " times --grad-accum ", c.grad_accum));
  if (c.launch.backend == Backend::kThreads && c.global_batch % c.launch.world_size != 0)
    throw ArgumentError(detail::cat("gpt: --batch-size ", c.global_batch, " must be a multiple of --world-size ",
                                    c.launch.world_size, " (it is the global batch)"));
  if (c.clip > 0 && c.reduction.update == UpdateAt::kBucketReduced)
    throw ArgumentError(
        "gpt: --clip with --overlap-update: clipping needs every bucket's gradient before any parameter moves, and "
        "--overlap-update moves each bucket's as it lands; add --clip 0 or drop --overlap-update");
  c.data = f.str("data").empty() ? fs::path(default_data()) : user_path(f.str("data"));
  c.checkpoints = examples::checkpoint_flags(f);
  c.elastic =
      elastic_choice(f, c.launch.backend, c.local.on() ? (c.local.local_sgd > 0 ? "--local-sgd" : "--diloco") : "",
                     c.reduction.zero, c.checkpoints.writes());
  c.trace_dir = user_path(f.str("trace"));
  c.out_dir = user_path(f.str("out"));
  for (auto const* d : {&c.trace_dir, &c.out_dir}) make_directory(*d, "gpt");
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<gpt::Config> cfg;
  try {
    cfg = parse(argc, argv);
    if (!cfg) return 0;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  std::optional<data::TextCorpus> corpus;  // loaded once per process: the threads backend's ranks share it
  try {
    corpus.emplace(data::TextCorpus::load(cfg->data, {.block_size = cfg->model.block_size}));
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  try {
    if (cfg->elastic.on) {  // Gloo processes that can be lost or join (examples/common/elastic.hpp)
      nn::GptConfig mc = cfg->model;
      mc.vocab_size = corpus->vocab().size();
      Generator init(static_cast<std::uint64_t>(cfg->seed));
      return run_elastic_job(
          cfg->elastic, cfg->launch, model_identity(nn::Gpt(mc, init)),
          [&](GlooBackend& comm, ElasticSession& session) { gpt::run(comm, *cfg, *corpus, &session); });
    }
    return launch(cfg->launch, argc, argv, [&](auto& comm) { gpt::run(comm, *cfg, *corpus); });
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
