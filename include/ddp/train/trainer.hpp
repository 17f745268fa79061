// basic_trainer<Model, Comm, Optimizer, Bucketer>: the standard data-parallel loop (sampler per epoch,
// DDP forward/backward, optimizer step, exact distributed evaluation) for users who do not want to
// write it, with what a real job adds: a global batch, starting an epoch part-way (mid-epoch resume),
// per-step hooks (before: reseed, schedule; after: progress, checkpoints, early stop) and train-loss counts
// over all ranks, epochs whose ranks have different numbers of batches (an error, or ddp::join), and steps
// skipped for non-finite gradients. The explicit loop stays available: trainer.ddp() and trainer.optimizer().
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include "ddp/data/global_batch_sampler.hpp"
#include "ddp/data/loader.hpp"
#include "ddp/data/metrics.hpp"
#include "ddp/data/sampler.hpp"
#include "ddp/nn/clip_grad.hpp"
#include "ddp/optim/grad_scaler.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "ddp/parallel/join.hpp"
#include "ddp/parallel/overlapped_update.hpp"
#include "ddp/trace/timeline.hpp"
#include "ddp/train/checkpoint.hpp"
#include "ddp/train/checkpoint_series.hpp"
#include "ddp/train/elastic.hpp"
#include "ddp/train/evaluate.hpp"
#include "ddp/train/loss_meter.hpp"

namespace ddp {

// How an epoch's samples are shared among the ranks when they do not divide evenly.
enum class EpochSplit {
  kPad,   // DistributedSampler's padding (PyTorch's): every rank gets ceil(n / R) samples, a few repeated. Ranks
          // whose batch counts still differ (datasets of different sizes) are a DdpError on every rank.
  kJoin,  // every sample exactly once: ranks whose share has fewer batches join early (ddp::join) and shadow
          // the others' last steps, divided as TrainerOptions::join says; all end the epoch in the same state.
};

struct TrainerOptions {
  std::int64_t batch_size = 32;  // per rank (used when global_batch is 0)
  bool shuffle = true;
  std::uint64_t seed = 0;  // sampler seed (the shuffle is the same on every rank)
  bool drop_last = true;   // drop each epoch's incomplete last batch (DataLoader's drop_last)
  DdpOptions ddp{};        // ddp.timeline, when set, also records each "optimizer step" (category "step")
  // When positive: samples per step over all ranks; each rank takes global_batch / world_size, which must be
  // a whole number (ArgumentError otherwise), and batch_size is not used.
  std::int64_t global_batch = 0;
  EpochSplit split = EpochSplit::kPad;
  JoinOptions join{};  // for the epochs EpochSplit::kJoin leaves uneven (the even ones run without a join)
  // When set: before each optimizer step, nn::clip_grad_norm(ddp.parameters(), *clip_grad_norm) (the 2-norm of
  // the averaged gradients, the same on every rank; PyTorch's clip_grad_norm_). A finite number >= 0, checked
  // when the trainer is built; last_grad_norm() is the norm before clipping.
  std::optional<double> clip_grad_norm{};
  // When set: backward runs on the loss times a dynamic scale (optim::GradScaler with these options), the
  // gradients are unscaled before clipping and the step, a step whose gradients overflow is skipped on every rank
  // alike and the scale backs off (as do steps DdpOptions::non_finite skips). loss_scale() reads the scale. Not
  // with EpochSplit::kJoin, nor with an optimizer that updates inside backward. Deterministic mode's exact sums
  // cannot carry an Inf: there, set ddp.non_finite = NonFinite::kSkipStep, or an overflow raises on every rank
  // instead of backing the scale off. The trainer's save_checkpoint keeps the scale and its growth tracker, and
  // load_checkpoint restores them (the weights can depend on the scale: float16 rounds the scaled gradients).
  std::optional<optim::GradScalerOptions> loss_scaling{};
  // How often a step reads its loss on the host, which on a device waits for the step to finish: every step (1),
  // or every loss_every-th step and the epoch's last. Between reads the losses stay in device memory (copied into
  // one buffer, read at once), so the epoch's mean loss is the same as with 1; StepHooks::after_step then gets
  // the latest loss read (of an earlier step). A positive number, checked when the trainer is built.
  std::int64_t loss_every = 1;
};

// Where an epoch starts: fit_epoch(data, EpochStart{.epoch = e, .step = s, .global_step = g}, ...) visits
// batches s, s + 1, ... of epoch e (DataLoader::from(s): exactly the batches an uninterrupted run visits
// there), counting optimizer steps on from g.
struct EpochStart {
  std::int64_t epoch = 0;
  std::int64_t step = 0;         // batches of the epoch already done (a checkpoint's TrainPosition::step)
  std::int64_t global_step = 0;  // optimizer steps taken before (TrainPosition::global_step)
  // This rank's share of the epoch's train loss before `step` (a mid-epoch checkpoint's, from the trainer's
  // load_checkpoint): the epoch's figures then cover the whole epoch, as in the uninterrupted run.
  EpochLoss loss{};
};

// Where training stands, as the step hooks see it: before a step, `step` and `global_step` count the steps
// done before it (so `step` is the index of the batch about to run); after a step, they include it. In an
// uneven epoch (EpochSplit::kJoin), steps_in_epoch is the most batches any rank has, and a rank that has run
// out calls no more hooks.
struct StepPosition {
  std::int64_t epoch = 0;
  std::int64_t step = 0;
  std::int64_t steps_in_epoch = 0;
  std::int64_t global_step = 0;
};

// What an after-step hook asks of the loop.
enum class StepControl { kContinue, kStop };

// Called on every rank, in the rank's thread. before_step runs before zero_grad (e.g. reseed dropout, set a
// per-step learning rate); after_step after the optimizer step with this rank's loss (e.g. progress, a
// checkpoint, early stop). A hook that stops must decide the same on every rank (from the position, not the
// rank's loss), or ranks fall out of step. Empty hooks are skipped.
struct StepHooks {
  std::function<void(StepPosition const&)> before_step;
  std::function<StepControl(StepPosition const&, double loss)> after_step;
};

struct EpochResult {
  std::int64_t epoch = 0;
  std::int64_t steps = 0;     // steps taken by this call, with this rank's own batches
  double seconds = 0;         // wall time of the steps (hooks included; sampler set-up and reductions excluded)
  Counts train{};             // the train loss over all ranks, per sample (train.mean_loss(); correct is 0): skipped
                              // steps left out, EpochStart::loss's steps included
  std::int64_t end_step = 0;  // the epoch's steps done after this call (EpochStart::step + the most any rank took)
  std::int64_t steps_in_epoch = 0;  // the most batches any rank has this epoch
  std::int64_t global_step = 0;     // synchronised steps taken after this call (skipped ones included)
  std::int64_t skipped_steps = 0;   // steps whose averaged gradients held NaN/Inf, skipped on every rank
                                    // (DdpOptions::non_finite = NonFinite::kSkipStep, or an overflow under
                                    // TrainerOptions::loss_scaling): no optimizer step
  bool stopped = false;             // an after_step hook returned StepControl::kStop (on this rank)
  // Elastic training: the membership changes that resumed within this epoch (their step in it), as this rank saw
  // them; from the ElasticSession the trainer was given (resume_kept, keep_state). A change interrupts fit_epoch, so
  // these are the ones before this call, which resumed the epoch.
  std::vector<MembershipChange> membership_changes{};
  bool complete() const noexcept { return end_step == steps_in_epoch; }
};

// Any composition of DistributedDataParallel (parallel/policies.hpp) trains through the same loop. A
// world-size-invariant reduction (ExactSum: deterministic mode) takes its batches from GlobalBatchSampler (each
// rank a contiguous share of every global batch, so TrainerOptions::global_batch is required and EpochSplit::kJoin
// does not apply); then the weights, and the epoch's mean loss (the micro-batch losses are gathered and added in
// global order), are bitwise the same for every world size dividing the micro-batch count.
// Determinism otherwise: with a deterministic communicator (threads, MPI) the run is bitwise identical across
// runs, and a run resumed with fit_epoch(EpochStart{...}) from a checkpoint equals the uninterrupted one bitwise
// at the same world size. Not thread-safe: one trainer per rank.
template <nn::Model M, AsyncCommunicator C, optim::Optimizer O, GradientBucketer B = SizeCapped,
          ReductionPolicy R = AverageAllReduce, BatchingPolicy Bt = OnePass>
class basic_trainer {
 public:
  using S = typename M::space;
  using V = Variable<typename M::value_type, S>;
  using ddp_type = DistributedDataParallel<M, C, B, R, Bt>;

  basic_trainer(M& model, C& comm, typename O::options_type opt, TrainerOptions opts = {},
                DdpPolicies<B, R, Bt> policies = {})
      : comm_(&comm),
        opts_(checked(opts)),
        batch_(rank_batch(opts, comm.world_size())),
        ddp_(model, comm, opts.ddp, std::move(policies)),
        opt_(detail::make_optimizer<O>(ddp_, opt)) {
    // Both read the whole averaged gradients before the step: attached as such, they are refused where the
    // composition cannot give them (composition.hpp).
    // Local rounds (LocalSgd, DiLoCo) clip each replica's mean gradient before its inner step instead.
    if constexpr (kClipsInside) {
      if (opts_.clip_grad_norm)
        opt_.before_inner_step(
            [this] { last_grad_norm_ = double(nn::clip_grad_norm(ddp_.parameters(), *opts_.clip_grad_norm)); });
    }
    if ((opts_.clip_grad_norm && !kClipsInside) || opts_.loss_scaling) {
      reader_.name = opts_.loss_scaling ? "loss_scaling" : "clip_grad_norm";
      reading_ = ddp_.attach(reader_);
    }
    if (opts_.loss_scaling) scaler_.emplace(ddp_.parameters(), *opts_.loss_scaling);
  }

  // The epoch from `start` to its end ({.epoch = e}: a whole epoch, each rank its DistributedSampler share), or
  // until an after_step hook returns kStop. loss(output, batch) -> scalar Var. Batches are host tensors; for a device
  // model the inputs and targets are uploaded without the host waiting (to_space_async), so the loss gets device
  // targets (to_space<S>(batch.y) in it is then no copy). Collective: every rank calls it with the same start. The step loop is the explicit one: before_step, zero_grad, forward, loss,
  // backward (DDP averages the gradients), optimizer step (unless DDP skipped the step), after_step.
  // First every rank's batch count is exchanged (one all-gather of a word per rank): unequal counts are a
  // DdpError on every rank naming them (EpochSplit::kPad), or the epoch runs inside ddp::join (kJoin).
  template <Dataset D, class LossFn>
  EpochResult fit_epoch(D const& data, EpochStart const& start, LossFn&& loss, StepHooks const& hooks = {}) {
    DataLoader loader(data, epoch_indices(data.size(), start.epoch),
                      {.batch_size = batch_, .drop_last = invariant || opts_.drop_last});
    Batches const batches = agree_on_batches(loader.num_batches(), start);
    std::int64_t const longest = batches.longest;  // (not a structured binding: lambdas below capture it)
    ddp_.module().set_mode(Mode::kTrain);
    StepPosition p{
        .epoch = start.epoch, .step = start.step, .steps_in_epoch = longest, .global_step = start.global_step};
    EpochResult r{.epoch = start.epoch, .steps_in_epoch = longest};
    std::int64_t const skipped_before = scaler_ ? scaler_->skipped_steps() : ddp_.skipped_steps();
    auto const t0 = std::chrono::steady_clock::now();
    meter_.emplace(LossMeterOptions{.read_every = opts_.loss_every,
                                    .micro_batches_per_rank = invariant ? ddp_.micro_batches_per_rank() : 0},
                   start.loss);
    struct EndMeter {  // the meter lives for this epoch only (save_checkpoint reads it from the hooks)
      std::optional<Meter>& m;
      ~EndMeter() { m.reset(); }
    } end_meter{meter_};
    auto run = [&] {
      for (auto const& batch : loader.from(std::min(start.step, loader.num_batches()))) {
        if (hooks.before_step) hooks.before_step(p);
        bool const stepped = step(batch, loss, p.global_step);
        ++p.step;
        ++p.global_step;
        ++r.steps;
        // Read this step's loss now (every step by default), or keep it on the device until the next read.
        meter_->end_step(batch.size(), stepped, (p.step % opts_.loss_every) == 0 || p.step >= longest);
        if (hooks.after_step && hooks.after_step(p, meter_->last()) == StepControl::kStop) {
          r.stopped = true;
          break;
        }
      }
      meter_->read();  // a stop, or an epoch that ended early (a join)
    };
    std::int64_t rounds = 0;
    if (batches.even) {
      run();
      rounds = r.steps;
    } else {
      if constexpr (!invariant) rounds = join(ddp_, opt_, run, opts_.join).rounds;
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.end_step = start.step + rounds;
    r.global_step = start.global_step + rounds;
    r.skipped_steps = (scaler_ ? scaler_->skipped_steps() : ddp_.skipped_steps()) - skipped_before;
    r.train = meter_->finish(*comm_);
    if (session_ != nullptr) {
      std::int64_t const first = start.global_step - start.step;  // the epoch's first step
      for (auto const& c : session_->changes())
        if (c.step >= first && c.step < r.global_step) r.membership_changes.push_back(c);
    }
    return r;
  }

  // Collective: ddp::save_checkpoint of the model, the optimizer and `pos`, with what the loop carries between
  // steps: the loss scale (TrainerOptions::loss_scaling) and the gradient wire's state (PowerSGD's round counts, Q
  // and every rank's error feedback). load_checkpoint restores all of it, so a resumed run continues the
  // uninterrupted one bitwise at the same world size (at another, PowerSGD's error feedback starts at zero).
  // Called from a step hook (mid-epoch), it also keeps every rank's share of the epoch's train loss so far.
  void save_checkpoint(std::filesystem::path const& path, TrainPosition const& pos, std::string_view extra = {}) {
    ddp::save_checkpoint(path, *comm_, ddp_.module(), opt_, pos, extra, round_state());
  }
  // The same into a CheckpointSeries: the newest of the last few (see resume_newest).
  void save_checkpoint(CheckpointSeries const& series, TrainPosition const& pos, std::string_view extra = {}) {
    ddp::save_checkpoint(series, *comm_, ddp_.module(), opt_, pos, extra, round_state());
  }
  // Collective: ddp::load_checkpoint (every failure on every rank), then the loss scale and the wire state where
  // the file holds them for this run's composition. Returns the stored position; `extra` receives the stored bytes.
  // `epoch_loss` receives this rank's share of the epoch's loss before the stored position (EpochStart::loss), or an
  // empty one when the checkpoint was taken at an epoch's end.
  TrainPosition load_checkpoint(std::filesystem::path const& path, std::string* extra = nullptr,
                                EpochLoss* epoch_loss = nullptr) {
    RoundState<typename M::value_type> round{.wire = ddp_.wire_state()};
    TrainPosition const pos = ddp::load_checkpoint(path, *comm_, ddp_.module(), opt_, extra, &round);
    apply_round_state(round, epoch_loss);
    return pos;
  }
  // Collective: ddp::load_newest_checkpoint, for a job that restarts (torchrun --max_restarts, a Slurm requeue, an
  // mpirun relaunch) at whatever world size it now has: the newest usable file of `series` is loaded as
  // load_checkpoint loads one, and named in the result with the newer ones it skipped; nothing is loaded, and nothing
  // returned, when the series has no file yet.
  std::optional<ResumedCheckpoint> resume_newest(CheckpointSeries const& series, std::string* extra = nullptr,
                                                 EpochLoss* epoch_loss = nullptr) {
    RoundState<typename M::value_type> round{.wire = ddp_.wire_state()};
    auto r = ddp::load_newest_checkpoint(series, *comm_, ddp_.module(), opt_, extra, &round);
    if (r) apply_round_state(round, epoch_loss);
    return r;
  }

  // Elastic training (elastic_spawn, train/elastic.hpp). keep_state, from a before_step hook: a copy of the model,
  // the optimizer state, the loss scale and the position at the start of step `p`, in memory (no collective).
  // resume_kept, collective, at the start of the body: after a membership change, the state of the step the change
  // interrupted, at the new world size; nothing in the first generation.
  void keep_state(ElasticSession& session, StepPosition const& p) {
    keep_state(session, TrainPosition{.epoch = p.epoch,
                                      .step = p.step,
                                      .global_step = p.global_step,
                                      .world_size = comm_->world_size(),
                                      .global_batch = global_batch(),
                                      .seed = static_cast<std::int64_t>(opts_.seed)});
  }
  // The same with the caller's position (e.g. its schedule's counter) and bytes (resume_kept hands them back).
  void keep_state(ElasticSession& session, TrainPosition const& pos, std::string_view extra = {}) {
    session_ = &session;
    ddp::keep_state(session, ddp_.module(), opt_, pos, scaler_ ? std::optional(scaler_->state()) : std::nullopt, extra);
  }
  // Where fit_epoch's results take their membership_changes from: done by resume_kept and keep_state; a body that
  // calls neither (ZeRO-1/2 shards, which resume from a checkpoint after a change) says so here.
  void list_changes_from(ElasticSession const& session) noexcept { session_ = &session; }
  // Both step-boundary duties of an elastic body, from a before_step hook: keep_state, then admit_joiners (a
  // collective when the job may grow).
  void elastic_step(ElasticSession& session, StepPosition const& p) {
    keep_state(session, p);
    admit_joiners(session, *comm_);
  }
  std::optional<TrainPosition> resume_kept(ElasticSession& session, std::string* extra = nullptr) {
    session_ = &session;  // (fit_epoch's results list its changes)
    RoundState<typename M::value_type> round{.wire = ddp_.wire_state()};
    auto pos = ddp::resume_kept(session, *comm_, ddp_.module(), opt_, &round, extra);
    if (pos) apply_round_state(round, nullptr);
    return pos;
  }

  // Batches per epoch (the most any rank has): what fit_epoch's steps_in_epoch will be.
  template <Dataset D>
  std::int64_t steps_per_epoch(D const& data) const {
    if constexpr (invariant) return data.size() / opts_.global_batch;
    DistributedSampler sampler(data.size(), *comm_, {.shuffle = false, .drop_last = false});
    std::int64_t const n = sampler.size();
    return opts_.drop_last ? n / batch_ : (n + batch_ - 1) / batch_;
  }

  // Classification accuracy and loss over `data`, each sample counted exactly once across ranks
  // (EvalSampler, integer counts summed exactly). The model runs without DDP (no collectives per batch, so
  // ranks with one batch more or less stay in step), in Mode::kEval and without autograd.
  template <Dataset D>
  requires std::same_as<typename D::target_type, std::int32_t> Counts evaluate(D const& data,
                                                                               std::int64_t batch_size = 256) {
    return ddp::evaluate(ddp_.module(), *comm_, data, batch_size);
  }

  // Samples per step on this rank, and over all ranks.
  std::int64_t batch_size() const noexcept { return batch_; }
  std::int64_t global_batch() const noexcept { return batch_ * comm_->world_size(); }

  ddp_type& ddp() noexcept { return ddp_; }
  O& optimizer() noexcept { return opt_; }
  C& comm() noexcept { return *comm_; }
  // With TrainerOptions::clip_grad_norm: the total gradient norm before clipping at the last step that clipped
  // (steps DDP skipped for non-finite gradients are not clipped); NaN before the first.
  double last_grad_norm() const noexcept { return last_grad_norm_; }
  // With TrainerOptions::loss_scaling: the current loss scale, and the steps skipped for overflowing gradients.
  std::optional<double> loss_scale() const noexcept {
    return scaler_ ? std::optional<double>(scaler_->get_scale()) : std::nullopt;
  }
  std::int64_t loss_scale_skipped_steps() const noexcept { return scaler_ ? scaler_->skipped_steps() : 0; }

 private:
  static constexpr bool invariant = ddp_type::world_size_invariant;

  // What the loop carries between steps, for save_checkpoint, and back from a loaded checkpoint.
  RoundState<typename M::value_type> round_state() {
    RoundState<typename M::value_type> round{.wire = ddp_.wire_state()};
    if (scaler_) round.loss_scale = scaler_->state();
    if (meter_) round.epoch_loss = meter_->snapshot(*comm_);
    return round;
  }
  void apply_round_state(RoundState<typename M::value_type> const& round, EpochLoss* epoch_loss) {
    if (epoch_loss) *epoch_loss = round.epoch_loss.value_or(EpochLoss{});
    if (scaler_ && round.loss_scale) scaler_->load_state(*round.loss_scale);
    if (!round.wire.kind.empty()) ddp_.load_wire_state(round.wire, round.wire_from);
  }

  // This rank's samples of the epoch: DistributedSampler's (padded, or for a join), or for a world-size-invariant
  // reduction GlobalBatchSampler's contiguous shares of whole global batches.
  std::vector<std::int64_t> epoch_indices(std::int64_t n, std::int64_t epoch) const {
    SamplerOptions const so{
        .shuffle = opts_.shuffle, .seed = opts_.seed, .drop_last = false, .pad = opts_.split == EpochSplit::kPad};
    auto take = [&](auto sampler) {
      sampler.set_epoch(epoch);
      return std::vector<std::int64_t>(sampler.indices().begin(), sampler.indices().end());
    };
    if constexpr (invariant)
      return take(GlobalBatchSampler(n, opts_.global_batch, *comm_, so));
    else
      return take(DistributedSampler(n, *comm_, so));
  }

  // Every rank's batch count this epoch (one all-gather of a word per rank): whether they are even, and the most
  // any rank has. Unequal counts are a DdpError on every rank naming them under EpochSplit::kPad; a start beyond
  // the epoch is an ArgumentError.
  struct Batches {
    bool even;
    std::int64_t longest;
  };
  Batches agree_on_batches(std::int64_t mine, EpochStart const& start) const {
    auto const counts = gather_batch_counts(*comm_, mine);
    bool const even = std::all_of(counts.begin(), counts.end(), [&](std::int64_t c) { return c == counts[0]; });
    if (!even && opts_.split == EpochSplit::kPad) detail::check_even_batches(counts);
    std::int64_t const longest = *std::max_element(counts.begin(), counts.end());
    if (start.step < 0 || start.step > longest)
      throw ArgumentError(detail::cat("trainer: epoch ", start.epoch, " cannot start at step ", start.step, ": it has ",
                                      longest, " steps"));
    return {even, longest};
  }

  // One optimizer step on `batch`: zero_grad, forward and backward of each micro-batch (DDP reduces the gradients;
  // each loss goes to the meter), then the step, unless DDP skipped it for non-finite gradients: clipping and the
  // loss scale's unscaling and overflow check first, where configured. Whether the optimizer stepped.
  template <class Batch, class LossFn>
  bool step(Batch const& batch, LossFn& loss, std::int64_t global_step) {
    opt_.zero_grad();
    // A device model's batch is uploaded without a host wait (one device is all a rank's step touches).
    auto const parts = ddp_.micro_batches(to_space_async<S>(batch.x), to_space_async<S>(batch.y),
                                          {.step = static_cast<std::uint64_t>(global_step)});
    for (auto const& mb : parts) {  // one under OnePass
      V l = loss(ddp_(mb), mb);
      backward(scaler_ ? scaler_->scale(l) : l);
      meter_->add(l);
    }
    if (ddp_.step_skipped()) {
      if (scaler_) scaler_->skip();
      return false;
    }
    Timeline::Scope span(opts_.ddp.timeline, "optimizer step", "step", Timeline::kCompute);
    auto const clip = [&] {
      if (opts_.clip_grad_norm && !kClipsInside)
        last_grad_norm_ = double(nn::clip_grad_norm(ddp_.parameters(), *opts_.clip_grad_norm));
    };
    if (scaler_) return scaler_->step(opt_, clip);
    clip();
    opt_.step();
    return true;
  }

  // Whether the optimizer clips inside its own steps (local rounds: before_inner_step).
  static constexpr bool kClipsInside = requires(O & o) { o.before_inner_step(std::function<void()>{}); };

  static TrainerOptions const& checked(TrainerOptions const& o) {
    if constexpr (invariant) {
      if (o.global_batch <= 0)
        throw ArgumentError(
            "trainer: deterministic (world-size-invariant) training needs TrainerOptions::global_batch: each step's "
            "global batch must not depend on the world size");
      if (o.split == EpochSplit::kJoin)
        throw ArgumentError(
            "trainer: EpochSplit::kJoin does not apply to deterministic training (every rank gets "
            "whole global batches); use EpochSplit::kPad");
    }
    if (o.loss_scaling && o.split == EpochSplit::kJoin)
      throw ArgumentError(
          "trainer: loss_scaling with EpochSplit::kJoin: ranks that run out of data would stop updating the loss "
          "scale while the others go on; use EpochSplit::kPad");
    if (o.clip_grad_norm && !(std::isfinite(*o.clip_grad_norm) && *o.clip_grad_norm >= 0))
      throw ArgumentError(detail::cat("trainer: clip_grad_norm must be a finite number >= 0, got ", *o.clip_grad_norm));
    if (o.loss_every < 1)
      throw ArgumentError(detail::cat("trainer: loss_every must be at least 1 (read every step), got ", o.loss_every));
    return o;
  }
  static std::int64_t rank_batch(TrainerOptions const& o, int world) {
    if (o.global_batch > 0) {
      if (o.global_batch % world != 0)
        throw ArgumentError(detail::cat("trainer: global batch ", o.global_batch,
                                        " must be a multiple of the world size ", world,
                                        " (each rank takes global batch / world size)"));
      return o.global_batch / world;
    }
    if (o.batch_size < 1) throw ArgumentError(detail::cat("trainer: batch_size must be positive, got ", o.batch_size));
    return o.batch_size;
  }

  C* comm_;
  TrainerOptions opts_;
  std::int64_t batch_;
  double last_grad_norm_ = std::numeric_limits<double>::quiet_NaN();
  std::optional<optim::basic_grad_scaler<typename M::value_type, S>> scaler_;  // TrainerOptions::loss_scaling
  using Meter = basic_loss_meter<typename M::value_type, S>;
  std::optional<Meter> meter_;               // the running epoch's train loss (inside fit_epoch only)
  ElasticSession const* session_ = nullptr;  // an elastic body's (resume_kept, keep_state): its changes
  ddp_type ddp_;
  O opt_;
  // What clipping and loss scaling are to the DDP: readers of the whole averaged gradients.
  struct GradientReader final : DdpHook {
    std::string name;
    HookTraits traits() const override { return {.name = name, .caps = Capability::kNeedsWholeGradients}; }
  } reader_;
  Attachment reading_;  // reader_ attached, under clipping or loss scaling
};

// The common composition: SGD and PyTorch's default bucketing.
template <nn::Model M, AsyncCommunicator C>
using trainer = basic_trainer<M, C, optim::basic_sgd<typename M::value_type, typename M::space>>;

}  // namespace ddp
