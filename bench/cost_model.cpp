// bench/cost_model: the α–β cost model (ddp/tune/: probes, calibration, cost model) against measured
// DDP steps. Per model: calibrate the backend (or read the cache), profile a DDP run's backward (when each
// gradient is final, by grad hooks), choose the bucket cap from the model, then run DDP with PyTorch's 25 MiB
// cap and with the chosen cap and print predicted against measured times, per bucket and per step. Each step is
// predicted twice: from the calibration at start-up (tune_bucket_cap's CalibrationTiming::kStartUp), and from a
// probe taken in the same rounds as the steps (run's probe_candidates; tune_bucket_cap's kBetweenSteps, its
// default where no node has more ranks than CPUs, probes the same way between its profiling steps), so a miss
// can be told apart from a machine whose state changed between the calibration and the steps.
//   bazel run //bench:cost_model -- --world-size 2                          (threads)
//   mpirun -n 2 bazel-bin/bench/cost_model --backend mpi --cache /tmp/ddp_alpha_beta.txt
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/tune/tune.hpp"
#include "examples/common/flags.hpp"
#include "examples/common/launch.hpp"

using namespace ddp;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

Tensor<float> rnd(Shape s, Generator& g) {
  Tensor<float> t(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = g.uniform(-1.0f, 1.0f);
  return t;
}

struct Measured {
  BackwardProfile profile;               // medians over the timed steps, of the job as a whole (below)
  std::vector<ProbeSample> probe;        // the in-run probe (run's probe_candidates), from the same rounds as the steps
  std::vector<double> bucket_seconds;    // median all-reduce time per bucket (launch to observed completion)
  double step = 0;                       // the job's time per step: first step's start to last step's end / steps
  double step_median = 0, step_p90 = 0;  // of the single steps' times (those `step` is the mean of)
  std::size_t buckets = 0;
};

// A time point that means the same instant on every rank: each rank's clock shifted by its offset from the
// ranks' mean, estimated over barrier rounds (the median of each rank's deviation: a rank descheduled just
// after a barrier, as on oversubscribed cores, spoils one round, not the estimate).
template <class Comm>
Clock::time_point common_zero(Comm& comm) {
  constexpr int kRounds = 21;
  std::vector<double> dev;
  for (int k = 0; k < kRounds; ++k) {
    comm.barrier();
    double t = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
    double mean = t;
    host_all_reduce(comm, std::span<double>(&mean, 1), ReduceOp::kSum);
    dev.push_back(t - mean / comm.world_size());
  }
  double base = std::chrono::duration<double>(Clock::now().time_since_epoch()).count() - median(dev);
  host_all_reduce(comm, std::span<double>(&base, 1), ReduceOp::kMax);  // the latest rank's "now", shared
  auto const shift = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(base + median(dev)));
  return Clock::time_point(shift);
}

// One DDP configuration of an interleaved run: its own model, DDP (bucket cap `cap`), optimizer and stamps.
// On the heap: the gradient hooks hold its address.
template <class Comm, class Model, class MakeOpt>
struct Job {
  using Ddp = DistributedDataParallel<Model, Comm>;
  using Opt = decltype(std::declval<MakeOpt&>()(std::declval<Ddp&>().parameters()));
  Model model;
  Timeline timeline;
  Ddp ddp;
  Opt opt;
  std::vector<Var> params;                  // trainable, registration order: DDP's parameter indices
  std::vector<double> ready_now;            // this step's ready time per parameter, s since the common zero
  std::vector<double> stamps;               // per timed step: -start, backward start, ready times, backward end, update
  std::vector<std::vector<double>> bucket;  // per bucket, its all-reduce time in each timed step

  template <class MakeModel>
  Job(Comm& comm, MakeModel& make_model, MakeOpt& make_opt, std::size_t cap)
      : model(make_model()),
        timeline(comm.rank()),
        ddp(model, comm, {.timeline = &timeline},
            {.bucketer = SizeCapped{{.cap_bytes = cap, .first_cap_bytes = std::min(cap, kDefaultFirstBucketBytes)}}}),
        opt(make_opt(ddp.parameters())),
        bucket(ddp.plan().buckets.size()) {
    for (auto const& p : model.named_parameters())
      if (p.var.requires_grad()) params.push_back(p.var);
    ready_now.assign(params.size(), 0);
  }
  std::size_t row() const noexcept { return params.size() + 4; }
};

// `iters` DDP steps of each cap after `warmup`, interleaved: cap 0's step, cap 1's step, ..., then again, so
// every configuration sees the same state of the machine (on this VM the same run measures tens of percent
// apart an hour, or a minute, later: a prediction checked against a run taken at another time measures the
// machine, not the model). Every rank stamps its phases against a common zero (common_zero), and the job's
// view is taken per step across ranks: forward runs from the first rank's step start to the last rank's
// backward start, a gradient is ready when it is ready on every rank, the update is the slowest rank's. Ranks
// that share cores (4 ranks on 2 here) take turns; per-rank phase times would hide that, the job's view does
// not. A step's time is from the end of the step before it (whichever configuration ran it) to its own end,
// both on the last rank to finish, so the steps' times add up to the run's wall time.
// With `probe_candidates` (ascending), the in-run probe's sizes are those up to the first that holds all of
// the model's gradients (no bucket of any cap is larger, so every bucket lies between two sizes probed in the
// run), and every round starts with one blocking all-reduce of each size, timed as
// probe_alpha_beta times them (a barrier before each, the slowest rank's time), from the same kind of buffer
// (the communicator's gradient storage where it has one); the sample of a size is the median over the timed
// rounds. The round's first step is then timed from the probe's end, so the probes are in no step's time.
// This probe sees the machine in the same seconds as the steps; the calibration at start-up saw it before.
template <class Comm, class MakeModel, class MakeOpt, class Loss>
std::vector<Measured> run(Comm& comm, MakeModel&& make_model, MakeOpt&& make_opt, Tensor<float> const& x, Loss&& loss,
                          std::vector<std::size_t> const& caps, int warmup, int iters,
                          std::vector<std::size_t> const& probe_candidates = {}) {
  warmup = std::max(warmup, 1);  // the first timed step's time starts at a warm-up step's end
  using J = Job<Comm, decltype(make_model()), std::remove_reference_t<MakeOpt>>;
  std::vector<std::unique_ptr<J>> jobs;
  for (std::size_t cap : caps) jobs.push_back(std::make_unique<J>(comm, make_model, make_opt, cap));
  Clock::time_point zero;
  for (auto& j : jobs) {
    j->stamps.assign(static_cast<std::size_t>(iters) * j->row(), 0);
    for (std::size_t i = 0; i < j->params.size(); ++i)
      j->params[i].set_grad_hook([&zero, &ready = j->ready_now, i](auto&) { ready[i] = seconds(zero, Clock::now()); });
  }
  std::size_t const nj = jobs.size();
  std::vector<std::size_t> probe_sizes;
  if (nj > 0) {
    std::size_t total = 0;
    for (auto const& p : jobs.front()->params) total += static_cast<std::size_t>(p.numel()) * sizeof(float);
    for (std::size_t bytes : probe_candidates)
      if (probe_sizes.empty() || probe_sizes.back() < total) probe_sizes.push_back(bytes);
  }
  // The end of every step, in execution order (warm-up included: the first timed step's time starts at the
  // last warm-up step's end), and where its time starts: the end of the step before it, or of the round's probes.
  std::vector<double> ends(static_cast<std::size_t>(warmup + iters) * nj, 0), begins(ends.size(), 0);
  std::size_t const largest_probe = probe_sizes.empty() ? 0 : *std::max_element(probe_sizes.begin(), probe_sizes.end());
  using Space = native_space_t<Comm>;
  Tensor<float, Space> const probe_storage =
      probe_sizes.empty() ? Tensor<float, Space>() : detail::probe_buffer(comm, detail::probe_floats(largest_probe));
  std::vector<double> probe_times(probe_sizes.size() * static_cast<std::size_t>(iters), 0);  // [round][size]
  zero = common_zero(comm);
  // Round `it` starts with configuration it mod nj: no configuration always follows the same other one (a
  // step's speed depends on whose data the caches hold).
  std::vector<std::size_t> position(ends.size());  // (round, configuration) -> its place in execution order
  for (int it = 0; it < warmup + iters; ++it) {
    double round_begin = it > 0 ? ends[static_cast<std::size_t>(it) * nj - 1] : 0;
    for (std::size_t k = 0; k < probe_sizes.size(); ++k) {
      Tensor<float, Space> buf = detail::probe_slice(probe_storage, probe_sizes[k]);
      detail::TimedProbe const t = detail::timed_all_reduce(comm, buf, "in-run probe");
      if (it >= warmup) probe_times[static_cast<std::size_t>(it - warmup) * probe_sizes.size() + k] = t.seconds();
      round_begin = seconds(zero, t.end);
    }
    for (std::size_t slot = 0; slot < nj; ++slot) {
      std::size_t const jj = (static_cast<std::size_t>(it) + slot) % nj;
      position[static_cast<std::size_t>(it) * nj + jj] = static_cast<std::size_t>(it) * nj + slot;
      J& j = *jobs[jj];
      std::size_t const before = j.timeline.size();
      auto const t0 = Clock::now();
      j.opt.zero_grad();
      Var l = loss(j.ddp(Var(x)));
      auto const t1 = Clock::now();
      backward(l);
      auto const t2 = Clock::now();
      j.opt.step();
      auto const t3 = Clock::now();
      std::size_t const pos = static_cast<std::size_t>(it) * nj + slot;
      begins[pos] = slot == 0 ? round_begin : ends[pos - 1];
      ends[pos] = seconds(zero, t3);
      if (it < warmup) continue;
      std::size_t const np = j.params.size();
      double* r = j.stamps.data() + static_cast<std::size_t>(it - warmup) * j.row();
      r[0] = -seconds(zero, t0), r[1] = seconds(zero, t1);
      for (std::size_t i = 0; i < np; ++i) r[2 + i] = j.ready_now[i];
      r[np + 2] = seconds(zero, t2), r[np + 3] = seconds(t2, t3);
      auto const spans = j.timeline.spans();
      for (std::size_t k = before; k < spans.size(); ++k) {
        auto const& s = spans[k];
        if (s.name.rfind("all_reduce bucket ", 0) == 0)
          j.bucket[std::stoul(s.name.substr(18))].push_back(s.duration_us * 1e-6);
      }
    }
  }
  // The job's view: every stamp max-reduced across ranks (a start through its negation).
  host_all_reduce(comm, std::span<double>(ends), ReduceOp::kMax);
  host_all_reduce(comm, std::span<double>(begins), ReduceOp::kMax);
  host_all_reduce(comm, std::span<double>(probe_times), ReduceOp::kMax);  // each probe: the slowest rank's time
  std::vector<ProbeSample> probe;
  for (std::size_t k = 0; k < probe_sizes.size(); ++k) {
    std::vector<double> t;
    for (int r = 0; r < iters; ++r) t.push_back(probe_times[static_cast<std::size_t>(r) * probe_sizes.size() + k]);
    probe.push_back({static_cast<std::size_t>(detail::probe_floats(probe_sizes[k])) * sizeof(float), median(t)});
  }
  std::vector<Measured> out;
  for (std::size_t jj = 0; jj < nj; ++jj) {
    J& j = *jobs[jj];
    std::size_t const np = j.params.size(), row = j.row();
    std::vector<double> all = j.stamps;
    for (auto const& b : j.bucket) all.push_back(median(b));
    host_all_reduce(comm, std::span<double>(all), ReduceOp::kMax);
    std::vector<std::vector<double>> ready(np);
    std::vector<double> fwd, bwd, upd;
    std::vector<double> steps;  // each timed step's time; they add up to the run's wall time
    for (int k = 0; k < iters; ++k) {
      double const* r = all.data() + static_cast<std::size_t>(k) * row;
      double const start = -r[0], bstart = r[1];
      fwd.push_back(bstart - start);
      double last = 0;
      for (std::size_t i = 0; i < np; ++i) {
        double const t = std::max(0.0, r[2 + i] - bstart);
        ready[i].push_back(t), last = std::max(last, t);
      }
      bwd.push_back(last);
      upd.push_back(r[np + 3]);
      std::size_t const at = position[static_cast<std::size_t>(warmup + k) * nj + jj];  // in execution order
      steps.push_back(ends[at] - begins[at]);
    }
    Measured m;
    m.probe = probe;
    for (auto const& p : j.params) m.profile.numels.push_back(p.numel());
    for (auto const& r : ready) m.profile.ready.push_back(median(r));
    m.profile.forward = median(fwd), m.profile.backward = median(bwd), m.profile.update = median(upd);
    m.bucket_seconds.assign(all.begin() + static_cast<std::ptrdiff_t>(j.stamps.size()), all.end());
    m.step = std::accumulate(steps.begin(), steps.end(), 0.0) / iters;
    std::sort(steps.begin(), steps.end());
    m.step_median = steps[steps.size() / 2];
    m.step_p90 = steps[std::min(steps.size() - 1, steps.size() * 9 / 10)];
    m.buckets = j.bucket.size();
    out.push_back(std::move(m));
  }
  return out;
}

// The cap is chosen from a profiling run at PyTorch's cap, by the model with the measured overlap, by the
// same model with the free overlap of separate cores (AlphaBeta::overlap = {1, 1}, the model before overlap
// was measured), and by the model fed that run's in-run probe (tune_bucket_cap's kBetweenSteps); then PyTorch's cap
// and the distinct chosen ones run interleaved (run), and every one is
// predicted by both models from the profile of that run's PyTorch-cap steps: a chosen cap's steps are
// measured, never fed back into its prediction. The measured steps side by side say which choice was right.
template <class Comm, class MakeModel, class MakeOpt, class Loss>
void model_case(Comm& comm, Calibration const& cal, char const* name, MakeModel&& make_model, MakeOpt&& make_opt,
                Tensor<float> const& x, Loss&& loss, int warmup, int iters) {
  bool const r0 = comm.rank() == 0;
  AlphaBeta free_model = cal.model;
  free_model.overlap = {};
  std::vector<std::size_t> calibration_sizes;  // ascending (the curve is sorted): run trims them to the model
  for (auto const& c : cal.model.curve) calibration_sizes.push_back(c.bytes);
  Measured const first =
      run(comm, make_model, make_opt, x, loss, {kDefaultBucketCapBytes}, warmup, iters, calibration_sizes).front();
  CapChoice const choice = choose_bucket_cap(first.profile, cal.model, sizeof(float));
  CapChoice const free_choice = choose_bucket_cap(first.profile, free_model, sizeof(float));
  // tune_bucket_cap's CalibrationTiming::kBetweenSteps: the model with the profiling run's own in-run
  // probe in place of the calibration's points, the cap chosen from that run's profile.
  CapChoice const between_choice =
      choose_bucket_cap(first.profile, with_probe_samples(cal.model, first.probe), sizeof(float));
  // What tune_bucket_cap's default, CalibrationTiming::kAuto, resolves to here (collective).
  bool const auto_between = detail::resolve_timing(comm, TuneOptions{}) == CalibrationTiming::kBetweenSteps;
  if (r0) {
    std::printf("\n== %s, world size %d: forward %.3f ms, backward %.3f ms, update %.3f ms (profiled at cap 25 MiB)\n",
                name, comm.world_size(), first.profile.forward * 1e3, first.profile.backward * 1e3,
                first.profile.update * 1e3);
    std::printf("caps (predicted step, exposed):");
    for (auto const& c : choice.tried)
      std::printf(" %zuK:%.2f/%.2f", c.config.cap_bytes >> 10, c.prediction.step * 1e3, c.prediction.exposed * 1e3);
    std::printf(
        "\nchosen cap %zu KiB (with free overlap: %zu KiB; probed between steps, as tune_bucket_cap's kBetweenSteps: "
        "%zu KiB; tune_bucket_cap's default here: %s)\n",
        choice.config.cap_bytes >> 10, free_choice.config.cap_bytes >> 10, between_choice.config.cap_bytes >> 10,
        auto_between ? "kBetweenSteps" : "kStartUp, a node has more ranks than CPUs");
  }
  std::vector<std::size_t> caps = {kDefaultBucketCapBytes};
  std::vector<char const*> what = {"pytorch-cap"};
  for (auto [cap, label] : {std::pair{choice.config.cap_bytes, "chosen-cap"},
                            std::pair{free_choice.config.cap_bytes, "free-overlap-choice"},
                            std::pair{between_choice.config.cap_bytes, "between-steps-choice"}}) {
    if (std::find(caps.begin(), caps.end(), cap) == caps.end()) caps.push_back(cap), what.push_back(label);
  }
  std::vector<Measured> const runs =
      caps.size() > 1 ? run(comm, make_model, make_opt, x, loss, caps, warmup, iters, calibration_sizes)
                      : std::vector<Measured>{first};
  BackwardProfile const& profile = runs.front().profile;
  // The calibration's model with the in-run probe's samples in place of its own at those sizes (the line
  // refitted; overlap as calibrated): the same model, fed by a probe taken in the same seconds as the steps, as
  // tune_bucket_cap's CalibrationTiming::kBetweenSteps feeds it.
  AlphaBeta const run_model = with_probe_samples(cal.model, runs.front().probe);
  if (r0) {
    std::printf("in-run probe (median over the rounds) against the calibration:");
    for (auto const& q : runs.front().probe)
      std::printf(" %zuK %.3f/%.3f ms", q.bytes >> 10, q.seconds * 1e3, cal.model.predict(q.bytes) * 1e3);
    std::printf("\n");
  }
  for (std::size_t k = 0; k < caps.size(); ++k) {
    BucketConfig const cfg{.cap_bytes = caps[k], .first_cap_bytes = std::min(caps[k], kDefaultFirstBucketBytes)};
    BucketPlan const plan = assign_buckets(profile.numels, sizeof(float), cfg);
    StepPrediction const p = predict_step(plan, profile, cal.model, sizeof(float));
    StepPrediction const pf = predict_step(plan, profile, free_model, sizeof(float));
    StepPrediction const pr = predict_step(plan, profile, run_model, sizeof(float));
    if (!r0) continue;
    Measured const& m = runs[k];
    double const err = (p.step - m.step) / m.step, free_err = (pf.step - m.step) / m.step,
                 run_err = (pr.step - m.step) / m.step;
    std::printf("-- %s: cap %zu KiB, %zu buckets%s\n%s", what[k], caps[k] >> 10, m.buckets,
                caps.size() > 1 ? " (steps interleaved with the other caps')" : "",
                cost_report(p, m.bucket_seconds, m.step).c_str());
    std::printf(
        "RESULT %s ws=%d %s cap=%zuK predicted %.3f ms measured %.3f ms error %+.1f%% %s; free overlap "
        "%.3f ms %+.1f%%; single steps: median %.3f ms, 90th percentile %.3f ms; in-run probe %.3f ms %+.1f%% %s\n",
        name, comm.world_size(), what[k], caps[k] >> 10, p.step * 1e3, m.step * 1e3, err * 100,
        std::abs(err) <= 0.2 ? "(within 20%)" : "(OUTSIDE 20%)", pf.step * 1e3, free_err * 100, m.step_median * 1e3,
        m.step_p90 * 1e3, pr.step * 1e3, run_err * 100, std::abs(run_err) <= 0.2 ? "(within 20%)" : "(OUTSIDE 20%)");
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  examples::Flags flags("cost_model", "The alpha-beta cost model's predicted DDP step against the measured one.");
  examples::add_launch_flags(flags)
      .add("models", "mlp,cnn,wide", "comma-separated subset of mlp,cnn,wide")
      .add("cache", "", "calibration cache file (read if it has this backend and layout, else appended)")
      .add("iters", "20", "timed steps per run (after warm-up; the wide model runs half of them)");
  try {
    if (!flags.parse(argc, argv)) return 0;
    auto const launch = examples::launch_choice(flags);
    std::string const models = "," + flags.str("models") + ",";
    std::string const cache = flags.str("cache");
    std::int64_t const iters_flag = flags.integer("iters");
    if (iters_flag < 3 || iters_flag > 100000)
      throw ArgumentError("cost_model: --iters must be 3 to 100000, got " + flags.str("iters"));
    int const iters = static_cast<int>(iters_flag);
    for (std::size_t at = 1; at < models.size();) {  // every name in --models is one of the three
      std::size_t const end = models.find(',', at);
      std::string const name = models.substr(at, end - at);
      if (name != "mlp" && name != "cnn" && name != "wide")
        throw ArgumentError("cost_model: --models takes a comma-separated subset of mlp,cnn,wide, got '" +
                            flags.str("models") + "'");
      at = end + 1;
    }
    bool const mlp = models.find(",mlp,") != std::string::npos, cnn = models.find(",cnn,") != std::string::npos,
               wide = models.find(",wide,") != std::string::npos;
    auto make_mlp = [] {
      Generator i(0);
      return nn::Sequential(nn::Flatten(), nn::Linear(784, 256, i), nn::ReLU(), nn::Linear(256, 128, i), nn::ReLU(),
                            nn::Linear(128, 10, i));
    };
    auto make_cnn = [] {
      Generator i(0);
      return nn::Sequential(nn::Conv2d(1, 32, 3, i), nn::ReLU(), nn::Conv2d(32, 64, 3, i), nn::ReLU(), nn::MaxPool2d(2),
                            nn::Flatten(), nn::Linear(9216, 128, i), nn::ReLU(), nn::Linear(128, 10, i));
    };
    auto make_wide = [] {
      Generator i(0);
      return nn::Sequential(nn::Linear(10, 10000, i), nn::ReLU(), nn::Linear(10000, 10000, i), nn::ReLU(),
                            nn::Linear(10000, 5, i));
    };
    // The probe reaches the largest bucket any chosen model can have (its largest parameter: a bucket never
    // splits one), so no prediction extrapolates past the measured points: the wide model's 400 MB gradient
    // reduces at another rate than 64 MiB does (the threads backend here: 21 GB/s at 400 MB, 13 GB/s at 64 MiB).
    ProbeOptions probe;
    std::size_t largest = 0;
    auto note_largest = [&](auto&& model) {
      for (auto const& p : model.named_parameters())
        largest = std::max(largest, static_cast<std::size_t>(p.var.numel()) * sizeof(float));
    };
    if (mlp) note_largest(make_mlp());
    if (cnn) note_largest(make_cnn());
    if (wide) note_largest(make_wide());
    if (largest > probe.sizes.back()) probe.sizes.push_back(largest);
    return examples::launch(launch, argc, argv, [&](auto& comm) {
      Calibration const cal = calibrate(comm, {.cache = cache, .probe = probe});
      if (comm.rank() == 0) {
        std::printf("cost_model: %s\nalpha %.2f us, beta %.4f ns/B (%.2f GB/s)%s\n", cal.key.c_str(),
                    cal.model.alpha * 1e6, cal.model.beta * 1e9, cal.model.bandwidth() / 1e9,
                    cal.from_cache ? " (from the cache)" : "");
        for (auto const& o : cal.model.overlap.curve)
          std::printf(
              "  overlap %9zu B: while both run, compute at %.3f and the all-reduce at %.3f of their rates "
              "alone\n",
              o.bytes, o.compute, o.comm);
        for (auto const& s : cal.samples)
          std::printf("  probe %9zu B: %.3f ms measured, %.3f ms on the fitted line\n", s.bytes, s.seconds * 1e3,
                      (cal.model.alpha + cal.model.beta * static_cast<double>(s.bytes)) * 1e3);
      }
      Generator g(1 + static_cast<std::uint64_t>(comm.rank()));
      auto x = rnd({32, 1, 28, 28}, g);
      Tensor<std::int32_t> y(Shape{32});
      for (int i = 0; i < 32; ++i) y[i] = static_cast<std::int32_t>(g.below(10));
      auto ce = [&](Var const& o) { return cross_entropy(o, y); };
      if (mlp)
        model_case(
            comm, cal, "mlp", make_mlp, [](auto& p) { return optim::SGD(p, {.lr = 0.01, .momentum = 0.9}); }, x, ce, 10,
            10 * iters);
      if (cnn)
        model_case(
            comm, cal, "cnn", make_cnn, [](auto& p) { return optim::AdamW(p, {.lr = 1e-3}); }, x, ce, 3, iters);
      if (wide) {
        auto wx = rnd({2, 10}, g), wy = rnd({2, 5}, g);
        model_case(
            comm, cal, "wide", make_wide, [](auto& p) { return optim::SGD(p, {.lr = 0.001}); }, wx,
            [&](Var const& o) { return mse_loss(o, wy); }, 2, std::max(3, iters / 2));
      }
    });
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
