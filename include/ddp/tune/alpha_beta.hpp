// The α–β cost model of an all-reduce on a backend: t(bytes) = α + β·bytes, fitted to probe samples (and
// kept as a curve through them), and how all-reduces and compute share the machine while both run. Pure
// arithmetic: the probes that measure it are in probe.hpp, the cache that keeps it in calibration.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ddp/error.hpp"

namespace ddp {

struct ProbeSample {
  std::size_t bytes = 0;
  double seconds = 0;  // median over the repetitions of the slowest rank's time
};

// How an all-reduce and compute share the machine while both run (probe_overlap): at a few all-reduce sizes,
// each one's rate relative to running alone, in (0, 1]. Empty (the default, and what a device backend gets) is
// the free overlap of separate cores: both rates 1. With more busy threads than cores (each rank a compute
// thread and a progress thread, say 4 ranks on 2 cores) both slow down: a small all-reduce barely
// moves while compute runs (every rank's progress thread must be on a core at once to pass its barriers),
// a large one takes its share of the cores (ddp/tune/cost_model.hpp).
struct OverlapSample {
  std::size_t bytes = 0;
  double compute = 1;  // compute's rate while all-reduces of `bytes` are in flight
  double comm = 1;     // an all-reduce's rate while compute runs
};
struct Overlap {
  std::vector<OverlapSample> curve{};  // sizes ascending
  double compute_rate(std::size_t bytes) const noexcept { return at(bytes, &OverlapSample::compute); }
  double comm_rate(std::size_t bytes) const noexcept { return at(bytes, &OverlapSample::comm); }

 private:
  // Linear in log2(bytes) between samples, held past either end; 1 without samples.
  double at(std::size_t bytes, double OverlapSample::*rate) const noexcept {
    if (curve.empty()) return 1.0;
    if (bytes <= curve.front().bytes) return curve.front().*rate;
    if (bytes >= curve.back().bytes) return curve.back().*rate;
    std::size_t k = 1;
    while (curve[k].bytes < bytes) ++k;
    auto const& a = curve[k - 1];
    auto const& b = curve[k];
    double const f = std::log2(double(bytes) / double(a.bytes)) / std::log2(double(b.bytes) / double(a.bytes));
    return a.*rate + f * (b.*rate - a.*rate);
  }
};

// Predicted all-reduce time of `bytes`: alpha seconds of latency plus beta seconds per byte, the line fitted
// to a probe. Real links are not one line (in cache and out of it, eager and rendezvous protocols): where the
// probe's own points are kept in `curve`, predict() interpolates between them (every segment its own α and
// β), holds the smallest point's time below it and extends the last segment's slope past the largest; the
// line stays for reports and for extrapolating to other world sizes (docs/cost_model.md).
struct AlphaBeta {
  double alpha = 0;                  // s
  double beta = 0;                   // s / byte
  std::vector<ProbeSample> curve{};  // sizes ascending; used by predict() when it has two or more points
  Overlap overlap{};                 // measured by probe_overlap; empty (free overlap) when not measured
  double predict(std::size_t bytes) const noexcept {
    if (curve.size() < 2) return alpha + beta * static_cast<double>(bytes);
    if (bytes <= curve.front().bytes) return curve.front().seconds;
    std::size_t k = 1;
    while (k + 1 < curve.size() && curve[k].bytes < bytes) ++k;
    auto const& a = curve[k - 1];
    auto const& b = curve[k];
    double const slope = std::max(0.0, (b.seconds - a.seconds) / static_cast<double>(b.bytes - a.bytes));
    return a.seconds + slope * static_cast<double>(bytes - a.bytes);
  }
  // The algorithm bandwidth the line implies for large messages (bytes / s); 0 when beta is 0.
  double bandwidth() const noexcept { return beta > 0 ? 1.0 / beta : 0.0; }
};

// Least squares of seconds against bytes, weighted by 1/seconds² (relative errors count alike, so the small
// messages that fix α are not drowned by the large ones that fix β). α and β are clamped at 0.
inline AlphaBeta fit_alpha_beta(std::vector<ProbeSample> const& samples) {
  if (samples.size() < 2)
    throw ArgumentError(detail::cat("fit_alpha_beta: needs 2 or more samples, got ", samples.size()));
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto const& s : samples) {
    if (!(s.seconds > 0))
      throw ArgumentError(detail::cat("fit_alpha_beta: sample of ", s.bytes, " B has time ", s.seconds));
    double const w = 1.0 / (s.seconds * s.seconds), x = static_cast<double>(s.bytes), y = s.seconds;
    sw += w, sx += w * x, sy += w * y, sxx += w * x * x, sxy += w * x * y;
  }
  double const det = sw * sxx - sx * sx;
  if (!(det > 0)) throw ArgumentError("fit_alpha_beta: the samples need at least two different sizes");
  AlphaBeta m{(sxx * sy - sx * sxy) / det, (sw * sxy - sx * sy) / det};
  if (m.beta < 0)
    m = AlphaBeta{sy / sw, 0};  // time falls with size (noise): a constant
  else if (m.alpha < 0)
    m = AlphaBeta{0, sxy / sxx};  // β alone, through the origin
  return m;
}

// The model with `samples` in place of its curve's points at the same sizes (and added where the curve has
// none), the line refitted to the result; the overlap is kept. For a probe taken later than the calibration, in
// the same seconds as the work it predicts (tune_bucket_cap's probe between the profiling steps): what an
// all-reduce costs right after compute can differ from back-to-back repetitions (bench/RESULTS.md, cost model:
// twice as much for a small all-reduce across hosts). No samples: the model as it is. Throws ArgumentError where the
// result has fewer than two sizes.
inline AlphaBeta with_probe_samples(AlphaBeta const& model, std::vector<ProbeSample> const& samples) {
  if (samples.empty()) return model;
  std::vector<ProbeSample> curve = samples;
  for (auto const& c : model.curve)
    if (std::none_of(samples.begin(), samples.end(), [&](ProbeSample const& q) { return q.bytes == c.bytes; }))
      curve.push_back(c);
  std::sort(curve.begin(), curve.end(), [](ProbeSample const& a, ProbeSample const& b) { return a.bytes < b.bytes; });
  curve.erase(std::unique(curve.begin(), curve.end(),
                          [](ProbeSample const& a, ProbeSample const& b) { return a.bytes == b.bytes; }),
              curve.end());
  AlphaBeta m = fit_alpha_beta(curve);
  m.curve = std::move(curve), m.overlap = model.overlap;
  return m;
}

}  // namespace ddp
