// tune_bucket_cap (ddp/tune/tune_bucket_cap.hpp), run by the threads test and under mpirun: one choice on
// every rank, nothing of the model changed, and a run with the chosen cap bitwise the one that never tuned.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/tune/tune.hpp"

namespace ddp::test {

// Conv -> BatchNorm (buffers) -> ReLU -> Flatten -> Dropout (a generator) -> Linear, on 1x6x6 images.
inline auto make_tune_net() {
  Generator g(7);
  return nn::Sequential(nn::Conv2d(1, 4, 3, g), nn::BatchNorm2d(4), nn::ReLU(), nn::Flatten(), nn::Dropout(0.25, 11),
                        nn::Linear(4 * 4 * 4, 3, g));
}

struct TuneData {
  Tensor<float> x{Shape{4, 1, 6, 6}}, y{Shape{4, 3}};
};
inline TuneData tune_data(int rank) {
  TuneData d;
  Generator g(100 + static_cast<std::uint64_t>(rank));
  for (std::int64_t i = 0; i < d.x.numel(); ++i) d.x[i] = g.uniform(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < d.y.numel(); ++i) d.y[i] = g.uniform(-1.0f, 1.0f);
  return d;
}

// Every parameter's, buffer's and generator's bits, in order.
template <class M>
std::vector<std::uint64_t> model_bits(M const& m) {
  std::vector<std::uint64_t> out;
  auto const add = [&](Tensor<float> const& t) {
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      std::uint32_t u = 0;
      std::memcpy(&u, &t[i], sizeof u);
      out.push_back(u);
    }
  };
  for (auto const& p : m.named_parameters()) add(p.var.value());
  for (auto const& b : m.named_buffers()) add(b.tensor);
  for (auto const& g : nn::generators_of(m)) {
    auto const st = g.generator->state();
    out.push_back(st.state), out.push_back(st.inc);
  }
  return out;
}

struct TuneOutcome {
  std::size_t cap = 0;
  std::size_t tried = 0;
  std::size_t ready = 0;
  bool model_unchanged = false;
  bool buffers_moved_in_training = false;  // so "unchanged" above means something
  int user_hook_calls_during = 0, user_hook_calls_after = 0;
  bool same_as_untuned = false;
  // CalibrationTiming::kBetweenSteps: its probe's sizes and times, and whether the model the cap was chosen
  // with holds them in place of the calibration's points (the others kept).
  std::vector<std::size_t> probe_bytes;
  std::vector<double> probe_seconds;
  bool model_holds_probe = false;
  // CalibrationTiming::kStartUp: no probe between the steps, the calibration's model as it was.
  bool start_up_as_calibrated = false;
  // The default CalibrationTiming::kAuto, resolved with one CPU per node and with plenty (whether a probe ran
  // between the steps agrees with what it resolved to).
  CalibrationTiming auto_one_cpu = CalibrationTiming::kAuto, auto_many_cpus = CalibrationTiming::kAuto;
  bool auto_probes_as_resolved = false;
};

// Three SGD steps of `m` wrapped with `bucketer` on this rank's data.
template <class Comm, class M>
std::vector<std::uint64_t> train_three(Comm& comm, M& m, SizeCapped bucketer, TuneData const& d) {
  DistributedDataParallel ddp(m, comm, {}, DdpPolicies{.bucketer = bucketer});
  optim::SGD opt(ddp.parameters(), {.lr = 0.05, .momentum = 0.9});
  for (int s = 0; s < 3; ++s) {
    opt.zero_grad();
    backward(mse_loss(ddp(Var(d.x)), d.y));
    opt.step();
  }
  return model_bits(m);
}

template <class Comm>
TuneOutcome tune_case(Comm& comm) {
  TuneOutcome o;
  TuneData const d = tune_data(comm.rank());
  auto net = make_tune_net();
  auto const before = model_bits(net);
  // A hook the user set: it runs during the profile and stays afterwards.
  auto const named = net.named_parameters();
  named[0].var.set_grad_hook([&o](auto&) { ++o.user_hook_calls_during; });
  auto const loss_of = [&](auto& ddp) { return mse_loss(ddp(Var(d.x)), d.y); };
  CalibrateOptions const cal{.probe = {.sizes = {1024, 16384, 262144}, .warmup = 1, .reps = 2},
                             .overlap = {.sizes = {16384}, .seconds = 1e-3, .reps = 1}};
  TunedBucketCap const t = tune_bucket_cap(
      net, comm, loss_of, {.calibrate = cal, .timing = CalibrationTiming::kBetweenSteps, .warmup = 1, .steps = 3});
  o.cap = t.choice.config.cap_bytes;
  for (auto const& q : t.between_steps) o.probe_bytes.push_back(q.bytes), o.probe_seconds.push_back(q.seconds);
  o.model_holds_probe = !t.between_steps.empty() && t.model.curve.size() == t.calibration.model.curve.size();
  for (auto const& c : t.model.curve) {
    auto const probed = std::find_if(t.between_steps.begin(), t.between_steps.end(),
                                     [&](ProbeSample const& q) { return q.bytes == c.bytes; });
    auto const calibrated = std::find_if(t.calibration.model.curve.begin(), t.calibration.model.curve.end(),
                                         [&](ProbeSample const& q) { return q.bytes == c.bytes; });
    double const want = probed != t.between_steps.end()                 ? probed->seconds
                        : calibrated != t.calibration.model.curve.end() ? calibrated->seconds
                                                                        : -1.0;
    o.model_holds_probe = o.model_holds_probe && c.seconds == want;
  }
  TunedBucketCap const s = tune_bucket_cap(
      net, comm, loss_of, {.calibrate = cal, .timing = CalibrationTiming::kStartUp, .warmup = 1, .steps = 2});
  o.start_up_as_calibrated = s.between_steps.empty() && s.model.curve.size() == s.calibration.model.curve.size() &&
                             s.model.alpha == s.calibration.model.alpha && s.model.beta == s.calibration.model.beta;
  for (std::size_t k = 0; o.start_up_as_calibrated && k < s.model.curve.size(); ++k)
    o.start_up_as_calibrated = s.model.curve[k].seconds == s.calibration.model.curve[k].seconds;
  o.auto_probes_as_resolved = s.timing == CalibrationTiming::kStartUp && t.timing == CalibrationTiming::kBetweenSteps;
  for (int cpus : {1, 1 << 16}) {
    TunedBucketCap const a =
        tune_bucket_cap(net, comm, loss_of, {.calibrate = cal, .node_cpus = cpus, .warmup = 0, .steps = 1});
    (cpus == 1 ? o.auto_one_cpu : o.auto_many_cpus) = a.timing;
    o.auto_probes_as_resolved =
        o.auto_probes_as_resolved && a.between_steps.empty() == (a.timing == CalibrationTiming::kStartUp);
  }
  o.tried = t.choice.tried.size();
  o.ready = t.profile.ready.size();
  o.model_unchanged = model_bits(net) == before;
  named[0].var.set_grad_hook([&o](auto&) { ++o.user_hook_calls_after; });
  // The tuned model trains bit for bit as an identical one that never tuned.
  auto fresh = make_tune_net();
  auto const tuned_run = train_three(comm, net, t.bucketer(), d);
  auto const fresh_run = train_three(comm, fresh, t.bucketer(), d);
  o.same_as_untuned = tuned_run == fresh_run;
  o.buffers_moved_in_training = fresh_run != before;
  return o;
}

}  // namespace ddp::test
