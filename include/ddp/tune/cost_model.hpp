// The step-time model of overlapped bucketed all-reduce: from a backward profile (when each gradient becomes
// ready) and an α–β model of the backend (ddp/tune/alpha_beta.hpp), when each bucket's all-reduce starts and
// ends, how much communication is left exposed after backward, and the step time; the bucket cap that
// minimises it; and a report of predicted against measured times.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ddp/bucket/plan.hpp"
#include "ddp/error.hpp"
#include "ddp/tune/calibration.hpp"

namespace ddp {

// One rank's compute, measured (e.g. medians over steps): seconds from the start of backward at which each
// trainable parameter's gradient was final (registration order), and the phases around it.
struct BackwardProfile {
  std::vector<std::int64_t> numels;  // elements per parameter, registration order
  std::vector<double> ready;         // s after backward began, per parameter
  double forward = 0;                // s
  double backward = 0;               // s: backward's own compute, without the wait for buckets
  double update = 0;                 // s: optimizer step (and zero_grad)
};

struct BucketPrediction {
  std::size_t bytes = 0;
  double ready = 0;  // s after backward began: its last gradient is final
  double start = 0;  // max(ready, the previous bucket's end): buckets run one after another, in plan order
  double end = 0;    // start + its all-reduce time (longer where it shares the cores with backward's compute)
};

struct StepPrediction {
  std::vector<BucketPrediction> buckets;
  double backward = 0;  // s until backward's compute ends: the profile's, longer where all-reduces slow it
  double exposed = 0;   // s of communication after backward's compute: max(0, last end − backward)
  double step = 0;      // forward + backward + exposed + update
};

// Each bucket in plan order starts when its gradients are ready and the bucket before it is done, and takes
// model.predict(bytes) alone. While backward's compute still runs, the two share the machine
// (model.overlap, measured by probe_overlap at the bucket's size): the all-reduce progresses at comm_rate of its
// rate alone and the compute at compute_rate of its own. With both rates 1 (separate cores) an all-reduce
// during backward is hidden for free; with the comm rate near 0 (small all-reduces on this 2-core VM: each
// rank's progress thread waits for a core, and a collective needs every rank's at once) it waits for
// backward's end. The profile's times are taken as
// compute alone: a profile from a run with PyTorch's cap, whose first bucket is the only one launched during
// backward, holds little of that run's own sharing.
inline StepPrediction predict_step(BucketPlan const& plan, BackwardProfile const& profile, AlphaBeta const& model,
                                   std::size_t element_bytes) {
  if (profile.ready.size() != profile.numels.size())
    throw ArgumentError(detail::cat("predict_step: the profile has ", profile.ready.size(), " ready times for ",
                                    profile.numels.size(), " parameters"));
  double const work = profile.backward;  // backward's compute, s alone
  StepPrediction p;
  double t = 0;             // s after backward began
  double done = 0;          // backward's compute done by t, s alone
  double compute_end = -1;  // when done reached work (-1: not yet)
  for (auto const& b : plan.buckets) {
    BucketPrediction bp;
    double ready = 0;  // in compute done
    for (auto i : b.params) {
      if (i >= profile.ready.size())
        throw ArgumentError(
            detail::cat("predict_step: the plan names parameter ", i, " but the profile has ", profile.ready.size()));
      ready = std::max(ready, std::min(profile.ready[i], work));
    }
    if (done < ready) t += ready - done, done = ready;  // no all-reduce in flight: compute alone until it is ready
    if (done >= work && compute_end < 0) compute_end = t;
    bp.bytes = static_cast<std::size_t>(b.numel) * element_bytes;
    bp.ready = t;
    bp.start = t;
    double left = model.predict(bp.bytes);  // s of the all-reduce alone still to run
    if (done < work) {                      // shared with backward's compute until one of them ends
      double const compute_rate = std::clamp(model.overlap.compute_rate(bp.bytes), 1e-3, 1.0);
      double const comm_rate = std::clamp(model.overlap.comm_rate(bp.bytes), 1e-3, 1.0);
      double const to_compute_end = (work - done) / compute_rate, to_comm_end = left / comm_rate;
      if (to_comm_end <= to_compute_end) {
        t += to_comm_end, done += compute_rate * to_comm_end, left = 0;
      } else {
        t += to_compute_end, done = work, left -= comm_rate * to_compute_end, compute_end = t;
      }
    }
    t += left;
    bp.end = t;
    p.buckets.push_back(bp);
  }
  p.backward = compute_end >= 0 ? compute_end : t + (work - done);
  p.exposed = std::max(0.0, t - p.backward);
  p.step = profile.forward + p.backward + p.exposed + profile.update;
  return p;
}

// Caps tried by choose_bucket_cap: powers of two from 64 KiB to 256 MiB, and PyTorch's 25 MiB.
inline std::vector<std::size_t> default_candidate_caps() {
  std::vector<std::size_t> caps;
  for (std::size_t c = std::size_t{64} << 10; c <= (std::size_t{256} << 20); c *= 2) caps.push_back(c);
  caps.push_back(kDefaultBucketCapBytes);
  std::sort(caps.begin(), caps.end());
  return caps;
}

struct CapCandidate {
  BucketConfig config;
  std::size_t buckets = 0;
  StepPrediction prediction;
};

struct CapChoice {
  BucketConfig config;              // the chosen one
  StepPrediction prediction;        // its prediction
  std::vector<CapCandidate> tried;  // every candidate, in the order given
};

// The cap (first bucket capped at min(cap, 1 MiB), as SizeCapped's default) with the least predicted step:
// exposed communication, and backward slowed by the all-reduces that share its cores (predict_step); ties
// (within 1 µs) go to the larger cap, which launches fewer all-reduces.
inline CapChoice choose_bucket_cap(BackwardProfile const& profile, AlphaBeta const& model, std::size_t element_bytes,
                                   std::vector<std::size_t> const& caps = default_candidate_caps()) {
  if (caps.empty()) throw ArgumentError("choose_bucket_cap: no candidate caps");
  CapChoice choice;
  bool have = false;
  for (std::size_t cap : caps) {
    BucketConfig cfg{.cap_bytes = cap, .first_cap_bytes = std::min(cap, kDefaultFirstBucketBytes)};
    BucketPlan const plan = assign_buckets(profile.numels, element_bytes, cfg);
    StepPrediction pred = predict_step(plan, profile, model, element_bytes);
    choice.tried.push_back({cfg, plan.buckets.size(), pred});
    bool const better = !have || pred.step < choice.prediction.step - 1e-6 ||
                        (std::abs(pred.step - choice.prediction.step) <= 1e-6 && cap > choice.config.cap_bytes);
    if (better) choice.config = cfg, choice.prediction = pred, have = true;
  }
  return choice;
}

// Predicted against measured: per bucket (all-reduce time, launch to completion) and per step.
// measured_bucket_seconds may be shorter than the plan (missing ones print as "-").
inline std::string cost_report(StepPrediction const& p, std::vector<double> const& measured_bucket_seconds,
                               double measured_step_seconds) {
  // Measured bucket times come from the reducer's observer: launch to the first poll that saw the bucket
  // complete (polls come as parameters become ready and at the end of backward), so they are upper bounds.
  std::string out = "bucket      bytes   ready ms   predicted ms   observed ms (launch to first poll seeing it done)\n";
  char line[160];
  for (std::size_t b = 0; b < p.buckets.size(); ++b) {
    auto const& bp = p.buckets[b];
    double const pred = (bp.end - bp.start) * 1e3;
    if (b < measured_bucket_seconds.size())
      std::snprintf(line, sizeof line, "%6zu %10zu %10.3f %14.3f %13.3f\n", b, bp.bytes, bp.ready * 1e3, pred,
                    measured_bucket_seconds[b] * 1e3);
    else
      std::snprintf(line, sizeof line, "%6zu %10zu %10.3f %14.3f %13s\n", b, bp.bytes, bp.ready * 1e3, pred, "-");
    out += line;
  }
  double const err = measured_step_seconds > 0 ? (p.step - measured_step_seconds) / measured_step_seconds : 0.0;
  std::snprintf(line, sizeof line,
                "step: predicted %.3f ms (exposed communication %.3f ms), measured %.3f ms, error %+.1f%%\n",
                p.step * 1e3, p.exposed * 1e3, measured_step_seconds * 1e3, err * 100);
  out += line;
  return out;
}

}  // namespace ddp
