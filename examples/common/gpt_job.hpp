// The GPT job's one rank (examples/08_gpt.cpp): its Config, and run(comm, cfg, corpus), which builds the character
// GPT, its trainer (DDP with the chosen reduction, AdamW with decay on matrices only, clipping, a warm-up + cosine
// schedule) and trains it for --iters steps: progress with tokens/s and ETA, the validation loss over the whole
// validation split at intervals, checkpoints, and at the end a sample of generated text.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ddp/data/text_blocks.hpp>
#include <ddp/ddp.hpp>
#include <ddp/train/checkpoint.hpp>
#include <ddp/train/metrics_log.hpp>
#include <ddp/train/svg_plot.hpp>

#include "examples/common/checkpoints.hpp"
#include "examples/common/elastic.hpp"
#include "examples/common/launch.hpp"
#include "examples/common/local_rounds.hpp"
#include "examples/common/reduction.hpp"
#include "examples/common/report.hpp"

namespace ddp::examples::gpt {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// What parse() (08_gpt.cpp) chose from the flags.
struct Config {
  LaunchChoice launch{};
  nn::GptConfig model{};
  std::int64_t iters = 2000, global_batch = 24, warmup = 100, eval_interval = 250, log_interval = 50, seed = 1337;
  std::int64_t grad_accum = 1;  // micro-steps per rank per step, accumulated locally (no_sync) and reduced once
  std::int64_t max_steps = 0;   // max_steps > 0: stop there (checkpointed), before --iters
  examples::CheckpointFlags checkpoints{};  // --checkpoint, --checkpoint-every, --keep-checkpoints, --resume
  double lr = 1e-3, min_lr = 1e-4, beta2 = 0.99, weight_decay = 0.1, clip = 1.0;
  examples::ReductionChoice reduction{};
  examples::LocalChoice local{};      // --local-sgd, --diloco
  examples::ElasticChoice elastic{};  // --elastic, --min-world-size, --max-world-size, --join (Gloo)
  std::int64_t sample_tokens = 500, top_k = 0;
  double temperature = 0.8;
  std::uint64_t sample_seed = 1;
  fs::path data, trace_dir, out_dir;
};

// Loss per sequence block, one row per eval point; kept in the checkpoint so a resumed run's CSV and plot are whole.
struct LossRow {
  std::int64_t iter = 0;
  double train_loss = 0, val_loss = 0, lr = 0, tokens_per_second = 0;
};
inline constexpr char kLossCsvHeader[] = "iter,train_loss,val_loss,lr,tokens_per_second";

inline std::string loss_csv(std::vector<LossRow> const& rows) {
  std::string s = std::string(kLossCsvHeader) + "\n";
  char buf[160];
  for (auto const& r : rows) {
    std::snprintf(buf, sizeof buf, "%lld,%.6f,%.6f,%.6g,%.1f\n", static_cast<long long>(r.iter), r.train_loss,
                  r.val_loss, r.lr, r.tokens_per_second);
    s += buf;
  }
  return s;
}
inline std::vector<LossRow> parse_loss_csv(std::string_view text, std::string const& source) {
  std::vector<LossRow> rows;
  std::istringstream is{std::string(text)};
  std::string line;
  if (!std::getline(is, line) || line != kLossCsvHeader)
    throw IoError(detail::cat(source, ": the first line is not the GPT job's loss CSV header"));
  while (std::getline(is, line)) {
    LossRow r;
    long long it = 0;
    if (std::sscanf(line.c_str(), "%lld,%lf,%lf,%lf,%lf", &it, &r.train_loss, &r.val_loss, &r.lr,
                    &r.tokens_per_second) != 5)
      throw IoError(detail::cat(source, ": not a loss row: '", line, "'"));
    r.iter = it;
    rows.push_back(r);
  }
  return rows;
}

// What a checkpoint carries besides the model and optimizer: the vocabulary (a checkpoint of another corpus's
// characters is refused, even when their count matches) and the loss rows so far.
inline std::string checkpoint_extra(data::CharVocab const& vocab, std::vector<LossRow> const& rows) {
  return detail::cat("vocab ", vocab.size(), "\n", vocab.chars(), "\n", loss_csv(rows));
}
inline std::vector<LossRow> check_checkpoint_extra(std::string const& extra, data::CharVocab const& vocab,
                                                   std::string const& file) {
  std::string const head = detail::cat("vocab ", vocab.size(), "\n");
  if (extra.rfind("vocab ", 0) != 0)
    throw ArgumentError(detail::cat("gpt: checkpoint ", file, " was not written by the GPT job (no vocabulary)"));
  if (extra.rfind(head, 0) != 0 || extra.compare(head.size(), vocab.chars().size(), vocab.chars()) != 0 ||
      extra.size() < head.size() + vocab.chars().size() + 1 || extra[head.size() + vocab.chars().size()] != '\n') {
    std::size_t const nl = extra.find('\n');
    throw ArgumentError(detail::cat("gpt: checkpoint ", file, " was trained on another vocabulary (",
                                    extra.substr(6, nl == std::string::npos ? 0 : nl - 6),
                                    " characters) than --data's (", vocab.size(),
                                    " characters): its token ids would mean other characters"));
  }
  return parse_loss_csv(std::string_view(extra).substr(head.size() + vocab.chars().size() + 1),
                        file + " (loss history)");
}

// The mean next-token loss over every non-overlapping block of `blocks` (the whole split), all ranks sharing the
// blocks in contiguous pieces; the sum is gathered exactly in double. Runs without autograd in eval mode.
template <class Comm, class Model>
double split_loss(Comm& comm, Model& model, data::BlockBatcher const& blocks, std::int64_t batch = 64) {
  NoGradGuard no_grad;
  Mode const was = model.mode();
  model.set_mode(Mode::kEval);
  auto const offsets = blocks.eval_offsets();
  auto const n = static_cast<std::int64_t>(offsets.size());
  int const r = comm.rank(), w = comm.world_size();
  std::int64_t const lo = n * r / w, hi = n * (r + 1) / w;
  std::vector<double> sum{0.0};
  for (std::int64_t i = lo; i < hi; i += batch) {
    std::int64_t const b = std::min(batch, hi - i);
    auto const tb = blocks.batch(std::span<std::int64_t const>(offsets.data() + i, static_cast<std::size_t>(b)));
    sum[0] += double(nn::gpt_loss(model(Var(tb.x)), tb.y).item()) * double(b);
  }
  host_all_reduce(comm, std::span<double>(sum), ReduceOp::kSum);
  model.set_mode(was);
  return n ? sum[0] / double(n) : 0.0;
}

// One rank's training: the trainer's fit_epoch over TextBlocks until --iters optimizer steps, with the hooks that
// set the learning rate, print progress, evaluate, checkpoint and stop.
// --elastic: the state of each step's start is kept in memory (keep_state), joiners are admitted at step boundaries
// (admit_joiners), and a generation after a change resumes from the kept state (resume_kept) instead of --resume;
// under ZeRO 1 or 2 from the newest checkpoint.
template <class Trainer>
void train(Trainer& t, Timeline& timeline, Config const& cfg, data::TextCorpus const& corpus, ElasticSession* session) {
  constexpr bool kElastic = KeepsLocalState<std::remove_cvref_t<decltype(t.optimizer())>>;
  auto& comm = t.comm();
  auto& opt = t.optimizer();
  int const rank = comm.rank(), world = comm.world_size();
  bool const leader = rank == 0;
  std::int64_t const T = cfg.model.block_size;
  data::TextBlocks const train_set(corpus.train(), {.block_size = T});
  data::BlockBatcher const val_blocks(corpus.val(), {.block_size = T});
  optim::Schedule schedule(
      opt,
      {.kind = optim::ScheduleKind::kWarmupCosine,
       .warmup_cosine = {.warmup = cfg.warmup, .t_max = std::max(cfg.iters, cfg.warmup + 1), .eta_min = cfg.min_lr}});
  if (leader) {
    std::string backend(std::remove_cvref_t<decltype(comm)>::backend_name);
    std::printf(
        "gpt: %s parameters (%lld layers, %lld heads, width %lld, block %lld, vocabulary %lld), %s backend, world "
        "size %d, global batch %lld (%lld per rank) = %s tokens per step\n",
        thousands(t.ddp().parameters().parameter_numel()).c_str(), static_cast<long long>(cfg.model.n_layer),
        static_cast<long long>(cfg.model.n_head), static_cast<long long>(cfg.model.n_embd), static_cast<long long>(T),
        static_cast<long long>(cfg.model.vocab_size), backend.c_str(), world, static_cast<long long>(cfg.global_batch),
        static_cast<long long>(t.batch_size()), thousands(cfg.global_batch * T).c_str());
    std::printf(
        "adamw lr %g -> %g (warm-up %lld, cosine to step %lld), betas (0.9, %g), weight decay %g on matrices, clip "
        "%g, dropout %g, %lld iterations, seed %lld\n",
        cfg.lr, cfg.min_lr, static_cast<long long>(cfg.warmup), static_cast<long long>(cfg.iters), cfg.beta2,
        cfg.weight_decay, cfg.clip, cfg.model.dropout, static_cast<long long>(cfg.iters),
        static_cast<long long>(cfg.seed));
    std::printf("data: %s, %s characters, %s train / %s validation\n", corpus.path().string().c_str(),
                thousands(corpus.size()).c_str(), thousands(static_cast<std::int64_t>(corpus.train().size())).c_str(),
                thousands(static_cast<std::int64_t>(corpus.val().size())).c_str());
    if constexpr (Trainer::ddp_type::world_size_invariant)
      std::printf("deterministic: %lld micro-batches of %lld sequences per step, %lld on each rank\n",
                  static_cast<long long>(cfg.reduction.micro_batches),
                  static_cast<long long>(cfg.global_batch / cfg.reduction.micro_batches),
                  static_cast<long long>(t.ddp().micro_batches_per_rank()));
    else if (cfg.grad_accum > 1)
      std::printf("gradient accumulation: %lld micro-steps of %lld sequences on each rank, reduced once per step\n",
                  static_cast<long long>(cfg.grad_accum), static_cast<long long>(t.batch_size() / cfg.grad_accum));
    std::printf("%s\n%s\n", t.ddp().describe().c_str(), t.optimizer().describe().c_str());
    std::fflush(stdout);
  }

  TrainPosition pos{.world_size = world, .global_batch = cfg.global_batch, .seed = cfg.seed};
  std::vector<LossRow> rows;
  EpochLoss resumed_loss;  // the interrupted epoch's train loss so far (a mid-epoch checkpoint's)
  std::string extra;
  auto take = [&](TrainPosition const& p, std::string const& from) {  // a resumed position and its loss rows
    pos = resume_position(p, pos, from);
    rows = check_checkpoint_extra(extra, corpus.vocab(), from);
    if (leader)
      std::printf("resumed from %s at iteration %lld\n", from.c_str(), static_cast<long long>(pos.global_step));
  };
  bool const sharded = cfg.reduction.zero > 0;
  if (session) t.list_changes_from(*session);
  if (session && session->generation() > 0 && sharded) {  // the shards went with the change: the newest checkpoint
    auto const resumed =
        examples::resume_after_change(t, *session, cfg.checkpoints, cfg.reduction.zero, &extra, &resumed_loss);
    if (resumed) take(resumed->position, resumed->file.string());
  } else if (session && session->generation() > 0) {
    if constexpr (kElastic)
      if (auto const p = t.resume_kept(*session, &extra)) take(*p, "(the state kept in memory)");
  } else if (auto const resumed = examples::resume_job(t, cfg.checkpoints, &extra, &resumed_loss)) {
    take(resumed->position, resumed->file.string());
  }
  schedule.restore(pos.global_step);
  std::optional<CheckpointSeries> series;
  if (cfg.checkpoints.writes()) series.emplace(cfg.checkpoints.series());
  auto at = [&](std::int64_t epoch, std::int64_t step, std::int64_t global_step) {
    return TrainPosition{.epoch = epoch,
                         .step = step,
                         .global_step = global_step,
                         .scheduler_epoch = global_step,
                         .world_size = world,
                         .global_batch = cfg.global_batch,
                         .seed = cfg.seed};
  };
  auto save = [&](std::int64_t epoch, std::int64_t step, std::int64_t global_step) {
    t.save_checkpoint(*series, at(epoch, step, global_step), checkpoint_extra(corpus.vocab(), rows));
  };
  auto const loss = [](Var const& out, auto const& mb) { return nn::gpt_loss(out, mb.y); };

  double interval_loss = 0;
  std::int64_t interval_steps = 0;
  auto const run_start = Clock::now();
  auto interval_start = run_start;
  std::int64_t const first_step = pos.global_step;
  double last_val = 0;
  // Throughput over the steps after the first kWarm of this run, evaluation excluded (what bench/ compares).
  constexpr std::int64_t kWarm = 5;
  std::optional<Clock::time_point> warm_at;
  double eval_seconds = 0;  // after warm_at
  auto evaluate = [&](std::int64_t iter) {
    double const secs = std::chrono::duration<double>(Clock::now() - interval_start).count();
    auto const e0 = Clock::now();
    last_val = split_loss(comm, t.ddp().module(), val_blocks);
    if (warm_at) eval_seconds += std::chrono::duration<double>(Clock::now() - e0).count();
    LossRow const row{.iter = iter,
                      .train_loss = interval_steps ? interval_loss / double(interval_steps) : 0.0,
                      .val_loss = last_val,
                      .lr = opt.lr(),
                      .tokens_per_second = secs > 0 ? double(interval_steps * cfg.global_batch * T) / secs : 0.0};
    rows.push_back(row);
    if (leader) {
      std::printf("iter %lld: train loss %.4f, val loss %.4f (the whole validation split: %s blocks of %lld)\n",
                  static_cast<long long>(iter), row.train_loss, row.val_loss,
                  thousands(static_cast<std::int64_t>(val_blocks.eval_offsets().size())).c_str(),
                  static_cast<long long>(T));
      std::fflush(stdout);
    }
    interval_loss = 0;
    interval_steps = 0;
    interval_start = Clock::now();
  };

  std::int64_t epoch = pos.epoch;
  bool done = pos.global_step >= cfg.iters;
  while (!done) {
    StepHooks const hooks{
        .before_step =
            [&](StepPosition const& p) {
              if constexpr (kElastic)
                if (session && !sharded)
                  t.keep_state(*session, at(p.epoch, p.step, p.global_step), checkpoint_extra(corpus.vocab(), rows));
              // (joiners waiting: every rank leaves this step here, together, to regroup)
              if (session) admit_joiners(*session, comm);
              schedule.start_step(p.global_step);
            },
        .after_step =
            [&](StepPosition const& p, double l) {
              interval_loss += l;
              ++interval_steps;
              std::int64_t const it = p.global_step;
              if (it == first_step + kWarm) warm_at = Clock::now();
              if (leader && (it % cfg.log_interval == 0 || it == cfg.iters)) {
                double const secs = std::chrono::duration<double>(Clock::now() - run_start).count();
                double const tps = double((it - first_step) * cfg.global_batch * T) / secs;
                double const eta = secs / double(it - first_step) * double(cfg.iters - it);
                std::printf("iter %5lld/%lld  loss %.4f  lr %.2e  %s tokens/s  ETA %d:%02d\n",
                            static_cast<long long>(it), static_cast<long long>(cfg.iters), l, opt.lr(),
                            thousands(static_cast<std::int64_t>(tps)).c_str(), int(eta) / 60, int(eta) % 60);
                std::fflush(stdout);
              }
              // The last step's evaluation comes before its checkpoint, so that a resumed run's rows are whole.
              if ((cfg.eval_interval > 0 && it % cfg.eval_interval == 0) || it >= cfg.iters) evaluate(it);
              bool const stop = it >= cfg.iters || (cfg.max_steps > 0 && it >= cfg.max_steps);
              if (series && (stop || (cfg.checkpoints.every > 0 && it % cfg.checkpoints.every == 0)))
                save(p.epoch, p.step, it);
              return stop ? StepControl::kStop : StepControl::kContinue;
            }};
    EpochResult const r = t.fit_epoch(
        train_set,
        EpochStart{
            .epoch = epoch, .step = pos.step, .global_step = pos.global_step, .loss = std::exchange(resumed_loss, {})},
        loss, hooks);
    if (leader && !r.membership_changes.empty()) {  // --elastic: what the pass went through
      std::string changes;
      for (auto const& c : r.membership_changes)
        changes += detail::cat(changes.empty() ? "" : ", ", c.from_world_size, " -> ", c.to_world_size,
                               " ranks at iteration ", c.step);
      std::printf("membership changes: %s\n", changes.c_str());
      std::fflush(stdout);
    }
    pos.global_step = r.global_step;
    pos.step = 0;
    done = r.stopped || pos.global_step >= cfg.iters;
    if (!done) ++epoch;
  }
  if (pos.global_step < cfg.iters) {  // --max-steps: the checkpoint has the position, the rest is for the resume
    if (leader) {
      std::printf("stopped after %lld iterations (--max-steps)%s%s\n", static_cast<long long>(pos.global_step),
                  series ? "; checkpoint: " : "", cfg.checkpoints.file.string().c_str());
      if (cfg.reduction.deterministic) std::printf("weights: %s\n", weights_digest(t.ddp().module()).c_str());
      std::fflush(stdout);
    }
    return;
  }
  if (rows.empty() || rows.back().iter != pos.global_step) evaluate(pos.global_step);  // nothing left to train
  double const total = std::chrono::duration<double>(Clock::now() - run_start).count();

  if (!cfg.trace_dir.empty()) {
    timeline.write_json((cfg.trace_dir / detail::cat("trace_rank", rank, ".json")).string());
    if (leader)
      std::printf("timeline: %s (one per rank; open in ui.perfetto.dev or chrome://tracing)\n",
                  (cfg.trace_dir / "trace_rank*.json").string().c_str());
  }
  if (!leader) return;
  std::printf("val loss: %.4f after %lld iterations, %.1f s (training and evaluation)\n", last_val,
              static_cast<long long>(cfg.iters), total);
  if (warm_at && pos.global_step > first_step + kWarm) {
    double const secs = std::chrono::duration<double>(Clock::now() - *warm_at).count() - eval_seconds;
    double const tps = double((pos.global_step - first_step - kWarm) * cfg.global_batch * T) / secs;
    std::printf(
        "throughput: %s tokens/s over iterations %lld-%lld (evaluation excluded); %.1f GFLOP/s per rank in the "
        "model's matrix products (%.3g MFLOP per token)\n",
        thousands(static_cast<std::int64_t>(tps)).c_str(), static_cast<long long>(first_step + kWarm + 1),
        static_cast<long long>(pos.global_step), tps * cfg.model.flops_per_token(T) / world / 1e9,
        cfg.model.flops_per_token(T) / 1e6);
  }
  if constexpr (requires { opt.bytes_sent(); }) print_local_bytes(opt, t.ddp().wire_bytes());
  if (series) std::printf("checkpoint: %s\n", cfg.checkpoints.file.string().c_str());
  if (!cfg.out_dir.empty() && !rows.empty()) {
    std::vector<double> xs;
    SvgPlot::Curve train{"train loss", "#1f77b4", {}}, val{"validation loss", "#ff7f0e", {}};
    for (auto const& row : rows) {
      xs.push_back(double(row.iter));
      train.y.push_back(row.train_loss);
      val.y.push_back(row.val_loss);
    }
    ddp::detail::write_text_file(cfg.out_dir / "losses.csv", loss_csv(rows), "loss CSV");
    ddp::detail::write_text_file(
        cfg.out_dir / "losses.svg",
        SvgPlot::curves_svg(detail::cat("GPT on ", cfg.data.filename().string(), ", world size ", world), "iteration",
                            "loss", xs, {train, val}),
        "loss SVG");
    std::printf("losses: %s, %s\n", (cfg.out_dir / "losses.csv").string().c_str(),
                (cfg.out_dir / "losses.svg").string().c_str());
  }
  if (cfg.reduction.deterministic)
    std::printf("weights: %s (FNV-1a 64 of the final parameters%s; the same for every world size dividing %lld)\n",
                weights_digest(t.ddp().module()).c_str(), cfg.local.replicas > 0 ? ", replica 0's" : "",
                static_cast<long long>(cfg.local.replicas > 0 ? cfg.local.replicas : cfg.reduction.micro_batches));
  if (cfg.sample_tokens > 0) {
    auto const& vocab = corpus.vocab();
    std::vector<std::int32_t> context = vocab.encode("\n");
    auto const out = nn::sample(
        t.ddp().module(), context,
        {.tokens = cfg.sample_tokens, .temperature = cfg.temperature, .top_k = cfg.top_k, .seed = cfg.sample_seed});
    std::printf("sample (%lld characters, temperature %g%s, seed %llu):\n%s\n",
                static_cast<long long>(cfg.sample_tokens), cfg.temperature,
                cfg.top_k > 0 ? detail::cat(", top-k ", cfg.top_k).c_str() : "",
                static_cast<unsigned long long>(cfg.sample_seed),
                vocab.decode(std::span<std::int32_t const>(out).subspan(context.size())).c_str());
  }
  std::fflush(stdout);
}

// One rank's job: the model (the same initial weights on every rank), its trainer for the chosen reduction and
// ZeRO stage, and train().
template <class Comm>
void run(Comm& comm, Config const& cfg, data::TextCorpus const& corpus, ElasticSession* session = nullptr) {
  nn::GptConfig mc = cfg.model;
  mc.vocab_size = corpus.vocab().size();
  // Dropout: each rank its own masks (seed + rank), or, deterministic, masks keyed by the sample (every rank alike).
  mc.dropout_seed = static_cast<std::uint64_t>(cfg.seed) + (cfg.reduction.deterministic ? 0u : 7919u * comm.rank());
  Generator init(static_cast<std::uint64_t>(cfg.seed));
  nn::Gpt model(mc, init);
  Config c = cfg;
  c.model = mc;
  Timeline timeline(comm.rank());
  TrainerOptions const opts{.seed = static_cast<std::uint64_t>(cfg.seed),
                            .drop_last = true,
                            .ddp = {.timeline = cfg.trace_dir.empty() ? nullptr : &timeline},
                            .global_batch = cfg.global_batch,
                            .clip_grad_norm = cfg.clip > 0 ? std::optional<double>(cfg.clip) : std::nullopt};
  optim::AdamWOptions const adamw{.lr = cfg.lr,
                                  .beta1 = 0.9,
                                  .beta2 = cfg.beta2,
                                  .weight_decay = cfg.weight_decay,
                                  .weight_decay_rule = optim::decay_matrices_only(cfg.weight_decay)};
  auto go = [&](auto reduction, auto batching) {
    using Opt = OverlappedOptimizer<ZeroRedundancyOptimizer<optim::AdamW, Comm>>;
    basic_trainer<nn::Gpt, Comm, Opt, SizeCapped, decltype(reduction), decltype(batching)> t(
        model, comm,
        {.optimizer = {.optimizer = adamw, .zero = {.stage = cfg.reduction.zero}},
         .overlap = {.update_at = cfg.reduction.update}},
        opts, {.reduction = reduction, .batching = batching});
    train(t, timeline, c, corpus, session);
  };
  // --local-sgd, --diloco: AdamW under LocalSgd or DiLoCo, on the default reduction, or with --deterministic and
  // --replicas on deterministic mode's (virtual replicas).
  auto go_local = [&]<class Opt>(std::type_identity<Opt>, typename Opt::options_type const& o) {
    if (cfg.reduction.deterministic) {
      basic_trainer<nn::Gpt, Comm, Opt, SizeCapped, ExactSum, MicroBatches> t(
          model, comm, o, opts, {.reduction = {}, .batching = {.count = cfg.reduction.micro_batches}});
      train(t, timeline, c, corpus, session);
    } else {
      basic_trainer<nn::Gpt, Comm, Opt> t(model, comm, o, opts);
      train(t, timeline, c, corpus, session);
    }
  };
  auto const& l = cfg.local;
  if (l.local_sgd > 0)
    return go_local(std::type_identity<LocalSgd<optim::AdamW, Comm>>{},
                    {.optimizer = adamw,
                     .local = {.period = l.local_sgd,
                               .warmup_steps = l.warmup,
                               .average_optimizer_state = l.average_state,
                               .replicas = l.replicas,
                               .node_period = l.node_period}});
  if (l.diloco > 0)
    return go_local(std::type_identity<DiLoCo<optim::AdamW, Comm>>{}, {.optimizer = adamw,
                                                                       .outer = {.period = l.diloco,
                                                                                 .outer_lr = l.outer_lr,
                                                                                 .outer_momentum = l.outer_momentum,
                                                                                 .wire = l.wire,
                                                                                 .replicas = l.replicas}});
  // --grad-accum: each rank's share in micro-steps whose gradients add up locally, reduced once per step.
  if (cfg.grad_accum > 1) return go(AverageAllReduce{}, MicroBatches{.count = cfg.grad_accum * comm.world_size()});
  with_reduction<true>(cfg.reduction, go);
}

}  // namespace ddp::examples::gpt
