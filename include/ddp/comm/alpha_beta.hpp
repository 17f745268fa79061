// The α–β cost of an all-reduce on a backend: t(bytes) = α + β·bytes, fitted to a short probe of the
// backend itself (every rank measures, the slowest rank's time counts, every rank gets the same fit), and a
// calibration cache so later runs on the same backend and layout skip the probe.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp {

struct ProbeSample {
  std::size_t bytes = 0;
  double seconds = 0;  // median over the repetitions of the slowest rank's time
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

struct ProbeOptions {
  // Message sizes in bytes (float elements), small to large; PyTorch's bucket sizes lie inside, and the
  // largest is past the caches, where big buckets live (in cache, 16 MiB reduces up to 1.5x faster here).
  std::vector<std::size_t> sizes = {std::size_t{4} << 10, std::size_t{64} << 10, std::size_t{1} << 20,
                                    std::size_t{4} << 20, std::size_t{16} << 20, std::size_t{64} << 20};
  int warmup = 2;
  int reps = 7;
};

struct Calibration {
  std::string key;  // backend, world size, layout: what the fit is valid for
  AlphaBeta model;
  std::vector<ProbeSample> samples;  // empty when it came from the cache
  bool from_cache = false;
};

namespace detail {
inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}
}  // namespace detail

// What a calibration is valid for: the backend's name, the world size, where the backend can say its layout
// of ranks on nodes (MpiBackend::layout()), and this host's name (the cache is per machine or cluster).
template <Communicator C>
std::string calibration_key(C const& comm) {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::string key = detail::cat(C::backend_name, " world ", comm.world_size(), " host ", host);
  if constexpr (requires { comm.layout(); }) key += detail::cat(" ", comm.layout());
  if constexpr (requires { comm.gradients_in_place(); }) {
    if (comm.gradients_in_place()) key += " gradients in place";
  }
  for (char& c : key)
    if (c == '\n' || c == '\t') c = ' ';
  return key;
}

// Collective: every rank times blocking all-reduces (kSum) of each size, with a barrier before each; the
// slowest rank's time of each repetition counts (what a bucket waits for), the median over repetitions is the
// sample, and every rank fits the same samples. Where the communicator keeps DDP's gradients in storage of
// its own (MpiBackend::gradient_storage: reduced in place), the probe's buffers are slices of such storage,
// so it times the path DDP's buckets take.
template <AsyncCommunicator C>
Calibration probe_alpha_beta(C& comm, ProbeOptions const& opts = {}) {
  using S = native_space_t<C>;
  if (opts.sizes.size() < 2 || opts.reps < 1)
    throw ArgumentError("probe_alpha_beta: needs two or more sizes and reps >= 1");
  Calibration cal{calibration_key(comm), {}, {}, false};
  Tensor<float, S> storage;
  if constexpr (requires(std::int64_t n) {
                  { comm.template gradient_storage<float>(n) } -> std::same_as<Tensor<float, S>>;
                }) {
    std::size_t const largest = *std::max_element(opts.sizes.begin(), opts.sizes.end());
    storage = comm.template gradient_storage<float>(
        static_cast<std::int64_t>(std::max<std::size_t>(largest / sizeof(float), 1)));
  }
  for (std::size_t bytes : opts.sizes) {
    auto const n = static_cast<std::int64_t>(std::max<std::size_t>(bytes / sizeof(float), 1));
    Tensor<float, S> buf = storage.defined() ? Tensor<float, S>::view(storage.owner(), storage.data(), Shape{n})
                                             : Tensor<float, S>(Shape{n});
    if constexpr (std::same_as<S, HostSpace>)
      std::fill_n(buf.data(), n, 0.5f);
    else
      Kernels<S>::fill(n, 0.5f, buf.data());
    std::vector<double> times;
    for (int i = 0; i < opts.warmup + opts.reps; ++i) {
      comm.barrier();
      auto const t0 = std::chrono::steady_clock::now();
      // The handle's wait returns once the result is in memory (on a device backend: after the stream).
      comm.all_reduce_async(detail::span_of<C>(buf), ReduceOp::kSum, CollectiveTag{"alpha-beta probe", n}).wait();
      double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      host_all_reduce(comm, std::span<double>(&t, 1), ReduceOp::kMax);
      if (i >= opts.warmup) times.push_back(t);
    }
    cal.samples.push_back({static_cast<std::size_t>(n) * sizeof(float), detail::median_of(times)});
  }
  cal.model = fit_alpha_beta(cal.samples);
  cal.model.curve = cal.samples;
  std::sort(cal.model.curve.begin(), cal.model.curve.end(),
            [](ProbeSample const& a, ProbeSample const& b) { return a.bytes < b.bytes; });
  cal.model.curve.erase(std::unique(cal.model.curve.begin(), cal.model.curve.end(),
                                    [](ProbeSample const& a, ProbeSample const& b) { return a.bytes == b.bytes; }),
                        cal.model.curve.end());
  return cal;
}

// The cache: one line per key, "alpha beta [n bytes seconds ...]<TAB>key" (the probe's n points, if kept).
// Later lines win; unreadable lines are skipped.
inline std::optional<AlphaBeta> load_calibration(std::string const& path, std::string const& key) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  std::optional<AlphaBeta> found;
  std::string line;
  while (std::getline(f, line)) {
    auto const tab = line.find('\t');
    if (tab == std::string::npos || line.substr(tab + 1) != key) continue;
    std::istringstream in(line.substr(0, tab));
    AlphaBeta m;
    if (!(in >> m.alpha >> m.beta) || m.alpha < 0 || m.beta < 0) continue;
    std::size_t n = 0;
    bool ok = true;
    if (in >> n) {
      for (std::size_t i = 0; i < n && ok; ++i) {
        ProbeSample p;
        ok = static_cast<bool>(in >> p.bytes >> p.seconds) && p.seconds > 0 &&
             (m.curve.empty() || p.bytes > m.curve.back().bytes);
        m.curve.push_back(p);
      }
    }
    if (ok) found = m;
  }
  return found;
}
inline void save_calibration(std::string const& path, std::string const& key, AlphaBeta const& m) {
  std::ofstream f(path, std::ios::app);
  f.precision(17);
  f << m.alpha << ' ' << m.beta;
  if (!m.curve.empty()) {
    f << ' ' << m.curve.size();
    for (auto const& p : m.curve) f << ' ' << p.bytes << ' ' << p.seconds;
  }
  f << '\t' << key << '\n';
  if (!f) throw IoError(detail::cat("save_calibration: cannot append to ", path));
}

struct CalibrateOptions {
  std::string cache;  // file of earlier fits ("" : always probe, write nothing)
  ProbeOptions probe{};
};

// Rank 0 looks the key up in the cache; every rank follows its answer (so all use one model): a cached fit
// is broadcast, otherwise every rank probes and rank 0 appends the fit to the cache. A cached curve that stops
// short of the largest size asked for (opts.probe.sizes) counts as a miss: the probe runs and its line, appended
// later, wins, so a larger model never reads an extrapolated time from an earlier, smaller calibration.
template <AsyncCommunicator C>
Calibration calibrate(C& comm, CalibrateOptions const& opts = {}) {
  std::string const key = calibration_key(comm);
  std::vector<double> cached;  // rank 0's find: alpha, beta, then the curve's (bytes, seconds) pairs
  if (comm.rank() == 0 && !opts.cache.empty()) {
    std::size_t const wanted =
        opts.probe.sizes.empty() ? 0 : *std::max_element(opts.probe.sizes.begin(), opts.probe.sizes.end());
    auto m = load_calibration(opts.cache, key);
    if (m && !m->curve.empty() && m->curve.back().bytes < wanted) m.reset();
    if (m) {
      cached = {m->alpha, m->beta};
      for (auto const& p : m->curve) cached.push_back(static_cast<double>(p.bytes)), cached.push_back(p.seconds);
    }
  }
  double size = static_cast<double>(cached.size());
  host_broadcast(comm, std::span<double>(&size, 1), 0);
  if (size > 0) {
    cached.resize(static_cast<std::size_t>(size));
    host_broadcast(comm, std::span<double>(cached), 0);
    AlphaBeta m{cached[0], cached[1]};
    for (std::size_t i = 2; i + 1 < cached.size(); i += 2)
      m.curve.push_back({static_cast<std::size_t>(cached[i]), cached[i + 1]});
    return Calibration{key, std::move(m), {}, true};
  }
  Calibration cal = probe_alpha_beta(comm, opts.probe);
  if (comm.rank() == 0 && !opts.cache.empty()) save_calibration(opts.cache, key, cal.model);
  return cal;
}

}  // namespace ddp
