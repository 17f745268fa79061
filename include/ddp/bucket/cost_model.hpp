// The step-time model of overlapped bucketed all-reduce: from a backward profile (when each gradient becomes
// ready) and an α–β model of the backend (ddp/comm/alpha_beta.hpp), when each bucket's all-reduce starts and
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
#include "ddp/comm/alpha_beta.hpp"
#include "ddp/error.hpp"

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
  double end = 0;    // start + α + β·bytes
};

struct StepPrediction {
  std::vector<BucketPrediction> buckets;
  double exposed = 0;  // s of communication after backward's compute: max(0, last end − backward)
  double step = 0;     // forward + backward + exposed + update
};

// Each bucket in plan order starts when its gradients are ready and the bucket before it is done.
inline StepPrediction predict_step(BucketPlan const& plan, BackwardProfile const& profile, AlphaBeta const& model,
                                   std::size_t element_bytes) {
  if (profile.ready.size() != profile.numels.size())
    throw ArgumentError(detail::cat("predict_step: the profile has ", profile.ready.size(), " ready times for ",
                                    profile.numels.size(), " parameters"));
  StepPrediction p;
  double prev_end = 0;
  for (auto const& b : plan.buckets) {
    BucketPrediction bp;
    for (auto i : b.params) {
      if (i >= profile.ready.size())
        throw ArgumentError(
            detail::cat("predict_step: the plan names parameter ", i, " but the profile has ", profile.ready.size()));
      bp.ready = std::max(bp.ready, profile.ready[i]);
    }
    bp.bytes = static_cast<std::size_t>(b.numel) * element_bytes;
    bp.start = std::max(bp.ready, prev_end);
    bp.end = bp.start + model.predict(bp.bytes);
    prev_end = bp.end;
    p.buckets.push_back(bp);
  }
  p.exposed = std::max(0.0, prev_end - profile.backward);
  p.step = profile.forward + profile.backward + p.exposed + profile.update;
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

// The cap (first bucket capped at min(cap, 1 MiB), as SizeCapped's default) with the least predicted exposed
// communication; ties (within 1 µs) go to the larger cap, which launches fewer all-reduces.
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
    bool const better = !have || pred.exposed < choice.prediction.exposed - 1e-6 ||
                        (std::abs(pred.exposed - choice.prediction.exposed) <= 1e-6 && cap > choice.config.cap_bytes);
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
