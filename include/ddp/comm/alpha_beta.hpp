// The α–β cost of an all-reduce on a backend: t(bytes) = α + β·bytes, fitted to a short probe of the
// backend itself (every rank measures, the slowest rank's time counts, every rank gets the same fit), how
// all-reduces and compute share the machine while both run (probe_overlap), and a calibration cache so later
// runs on the same backend and layout skip the probes.
#pragma once

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"
#include "ddp/tensor/host_kernels.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp {

struct ProbeSample {
  std::size_t bytes = 0;
  double seconds = 0;  // median over the repetitions of the slowest rank's time
};

// How an all-reduce and compute share the machine while both run (probe_overlap): at a few all-reduce sizes,
// each one's rate relative to running alone, in (0, 1]. Empty (the default, and what a device backend gets) is
// the free overlap of separate cores: both rates 1. With more busy threads than cores (each rank a compute
// thread and a progress thread; 2 or 4 ranks on this VM's 2 cores) both slow down: a small all-reduce barely
// moves while compute runs (every rank's progress thread must be on a core at once to pass its barriers),
// a large one takes its share of the cores (ddp/bucket/cost_model.hpp).
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
// all-reduce costs right after compute can differ from back-to-back repetitions (RESULTS, session 22: 2x at
// 4 KiB across namespace hosts on 16 cores). No samples: the model as it is. Throws ArgumentError where the
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

namespace detail {
// n floats where the probes all-reduce them: in the communicator's gradient_storage where it has one (DDP's
// buckets live there), else plain memory.
template <AsyncCommunicator C>
Tensor<float, native_space_t<C>> probe_buffer(C& comm, std::int64_t n) {
  using S = native_space_t<C>;
  Tensor<float, S> buf;
  if constexpr (requires {
                  { comm.template gradient_storage<float>(n) } -> std::same_as<Tensor<float, S>>;
                }) {
    buf = comm.template gradient_storage<float>(n);
  } else {
    buf = Tensor<float, S>(Shape{n});
  }
  return buf;
}
template <class S>
void fill_probe(Tensor<float, S>& buf) {
  if constexpr (std::same_as<S, HostSpace>)
    std::fill_n(buf.data(), buf.numel(), 0.5f);
  else
    Kernels<S>::fill(buf.numel(), 0.5f, buf.data());
}
// The floats a probe of `bytes` all-reduces (at least one).
inline std::int64_t probe_floats(std::size_t bytes) noexcept {
  return static_cast<std::int64_t>(std::max<std::size_t>(bytes / sizeof(float), 1));
}
// The first probe_floats(bytes) floats of `storage` (a probe_buffer), filled with the probe's values.
template <class S>
Tensor<float, S> probe_slice(Tensor<float, S> const& storage, std::size_t bytes) {
  Tensor<float, S> buf = Tensor<float, S>::view(storage.owner(), storage.data(), Shape{probe_floats(bytes)});
  fill_probe(buf);
  return buf;
}
// One timed probe, collective: a barrier, then a blocking all-reduce (kSum) of `buf`. `begin`: this rank's
// clock after the barrier; `end`: once the result is in memory (on a device backend: after the stream).
struct TimedProbe {
  std::chrono::steady_clock::time_point begin, end;
  double seconds() const noexcept { return std::chrono::duration<double>(end - begin).count(); }
};
template <AsyncCommunicator C>
TimedProbe timed_all_reduce(C& comm, Tensor<float, native_space_t<C>>& buf, char const* what) {
  comm.barrier();
  TimedProbe t;
  t.begin = std::chrono::steady_clock::now();
  comm.all_reduce_async(span_of<C>(buf), ReduceOp::kSum, CollectiveTag{what, buf.numel()}).wait();
  t.end = std::chrono::steady_clock::now();
  return t;
}
}  // namespace detail

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
  std::size_t const largest = *std::max_element(opts.sizes.begin(), opts.sizes.end());
  Tensor<float, S> const storage = detail::probe_buffer(comm, detail::probe_floats(largest));
  for (std::size_t bytes : opts.sizes) {
    Tensor<float, S> buf = detail::probe_slice(storage, bytes);
    std::vector<double> times;
    for (int i = 0; i < opts.warmup + opts.reps; ++i) {
      double t = detail::timed_all_reduce(comm, buf, "alpha-beta probe").seconds();
      host_all_reduce(comm, std::span<double>(&t, 1), ReduceOp::kMax);
      if (i >= opts.warmup) times.push_back(t);
    }
    cal.samples.push_back({static_cast<std::size_t>(buf.numel()) * sizeof(float), detail::median_of(times)});
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

struct OverlapProbeOptions {
  // All-reduce sizes: a small bucket (latency-bound) and a large one (bandwidth-bound).
  std::vector<std::size_t> sizes = {std::size_t{64} << 10, std::size_t{4} << 20};
  double seconds = 0.02;  // compute per measurement, at least (and at least 8 all-reduces' time alone)
  int reps = 3;
};

// Collective. For each size, every rank times a fixed amount of compute (GEMMs of 128 x 128 x 128) alone, a
// fixed number of all-reduces alone (four in flight, as DDP's buckets queue), and both at once: the
// all-reduces on the backend's progress thread, the GEMMs on the caller's, topping the queue up between GEMMs,
// as DDP's backward launches buckets between ops. The slowest rank's times count, and every rank issues the
// same all-reduces (their count is agreed first), so the collectives match. compute rate = compute alone /
// compute together; comm rate = the all-reduce work done while the compute ran (all of it, less what was left
// after the compute ended and then ran alone) / the compute's time. The all-reduces outlast the compute (else
// the round is repeated with twice as many). Median over opts.reps. Host communicators at world size 2 or more:
// a device backend's collectives and kernels share the GPU by other rules, and one rank has nothing to share;
// both get an empty Overlap (free overlap, not measured).
template <AsyncCommunicator C>
Overlap probe_overlap(C& comm, OverlapProbeOptions const& opts = {}) {
  using S = native_space_t<C>;
  if (!(opts.seconds > 0) || opts.reps < 1 || opts.sizes.empty() ||
      *std::min_element(opts.sizes.begin(), opts.sizes.end()) < sizeof(float))
    throw ArgumentError("probe_overlap: needs seconds > 0, reps >= 1 and sizes of 4 bytes or more");
  if constexpr (!std::same_as<S, HostSpace>) {
    return Overlap{};
  } else {
    if (comm.world_size() == 1) return Overlap{};  // one rank's all-reduce is a copy: nothing to share
    using Clock = std::chrono::steady_clock;
    auto const since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    auto const slowest = [&](std::vector<double> v) {  // max over ranks, element-wise
      host_all_reduce(comm, std::span<double>(v), ReduceOp::kMax);
      return v;
    };
    constexpr std::int64_t kDim = 128;
    std::vector<float> a(kDim * kDim, 0.5f), b(kDim * kDim, 0.25f), c(kDim * kDim);
    auto const gemm = [&] {
      Kernels<HostSpace>::gemm(Trans::kNo, Trans::kNo, kDim, kDim, kDim, 1.0f, a.data(), b.data(), 0.0f, c.data());
    };
    gemm();
    comm.barrier();
    auto t0 = Clock::now();
    for (int i = 0; i < 8; ++i) gemm();
    double const gemm_s = slowest({since(t0) / 8})[0];
    std::vector<std::size_t> sizes = opts.sizes;
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    auto const largest = static_cast<std::int64_t>(sizes.back() / sizeof(float));
    Tensor<float, S> const storage = detail::probe_buffer(comm, largest);
    Overlap out;
    for (std::size_t bytes : sizes) {
      auto const n = static_cast<std::int64_t>(bytes / sizeof(float));
      Tensor<float, S> buf = Tensor<float, S>::view(storage.owner(), storage.data(), Shape{n});
      detail::fill_probe(buf);
      CollectiveTag const tag{"overlap probe", n};
      auto const launch = [&] { return comm.all_reduce_async(detail::span_of<C>(buf), ReduceOp::kMax, tag); };
      using Handle = decltype(launch());
      constexpr std::size_t kDepth = 4;
      // One all-reduce's time alone (after a warm-up), agreed across ranks; from it the compute's length and
      // the all-reduces' count.
      launch().wait();
      std::vector<double> ar;
      for (int i = 0; i < 5; ++i) {
        comm.barrier();
        t0 = Clock::now();
        launch().wait();
        ar.push_back(since(t0));
      }
      double const ar_s = slowest({detail::median_of(ar)})[0];
      double const window = std::max(opts.seconds, 8 * ar_s);
      auto const gemms = static_cast<std::int64_t>(std::ceil(window / std::max(gemm_s, 1e-9)));
      auto calls = std::min<std::int64_t>(static_cast<std::int64_t>(std::ceil(1.5 * window / std::max(ar_s, 1e-9))) + 2,
                                          1 << 20);
      // `count` all-reduces, at most kDepth in flight, topped up between `compute` GEMMs and then until all are
      // done. Returns the compute's time, the whole round's time, and the all-reduces finished by the
      // compute's end.
      auto const round = [&](std::int64_t compute, std::int64_t count) {
        std::vector<Handle> q;
        q.reserve(static_cast<std::size_t>(count));
        std::size_t head = 0;
        auto const reap = [&] {
          while (head < q.size() && q[head].test()) q[head++].wait();
        };
        auto const top_up = [&] {
          while (static_cast<std::int64_t>(q.size()) < count && q.size() - head < kDepth) q.push_back(launch());
        };
        comm.barrier();
        auto const start = Clock::now();
        top_up();
        for (std::int64_t g = 0; g < compute; ++g) gemm(), reap(), top_up();
        reap();
        double const compute_s = since(start);
        auto const finished = static_cast<double>(head);
        // Top up first: reap() may have found every launched all-reduce done (a progress thread that ran them
        // all before this thread looked), and the round still owes the rest of its `count`.
        for (top_up(); head < q.size(); top_up()) q[head++].wait();
        return std::array<double, 3>{compute_s, since(start), finished};
      };
      std::vector<double> compute_rate, comm_rate;
      for (int rep = 0, tries = 0; rep < opts.reps;) {
        comm.barrier();
        t0 = Clock::now();
        for (std::int64_t g = 0; g < gemms; ++g) gemm();
        double const compute_alone = since(t0);
        double const comm_alone = round(0, calls)[1] / static_cast<double>(calls);
        auto const together = round(gemms, calls);
        // The slowest rank's times; the finished count as its negation, so the fewest count.
        auto const r = slowest({compute_alone, comm_alone, together[0], together[1], -together[2]});
        if (-r[4] >= static_cast<double>(calls) && ++tries < 4) {  // the all-reduces ran out before the compute
          calls *= 2;
          continue;
        }
        double const work = static_cast<double>(calls) * r[1];  // the all-reduces' time alone
        double const after = r[3] - r[2];                       // ran alone after the compute ended
        compute_rate.push_back(std::clamp(r[0] / r[2], 0.01, 1.0));
        comm_rate.push_back(std::clamp((work - after) / r[2], 0.01, 1.0));
        ++rep;
      }
      out.curve.push_back({n * sizeof(float), detail::median_of(compute_rate), detail::median_of(comm_rate)});
    }
    return out;
  }
}

// The cache: one line per key, "alpha beta n [bytes seconds]*n overlap k [bytes compute comm]*k<TAB>key"
// (the probe's n points, and probe_overlap's k samples). Later lines win; unreadable lines are skipped, and so
// are lines without the overlap part (written before it was measured): such a key is probed again.
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
    std::size_t n = 0;
    if (!(in >> m.alpha >> m.beta >> n) || m.alpha < 0 || m.beta < 0) continue;
    bool ok = true;
    for (std::size_t i = 0; i < n && ok; ++i) {
      ProbeSample p;
      ok = static_cast<bool>(in >> p.bytes >> p.seconds) && p.seconds > 0 &&
           (m.curve.empty() || p.bytes > m.curve.back().bytes);
      m.curve.push_back(p);
    }
    std::string word;
    std::size_t k = 0;
    ok = ok && static_cast<bool>(in >> word >> k) && word == "overlap";
    auto const rate = [](double r) { return r > 0 && r <= 1; };
    for (std::size_t i = 0; i < k && ok; ++i) {
      OverlapSample o;
      ok = static_cast<bool>(in >> o.bytes >> o.compute >> o.comm) && rate(o.compute) && rate(o.comm) &&
           (m.overlap.curve.empty() || o.bytes > m.overlap.curve.back().bytes);
      m.overlap.curve.push_back(o);
    }
    if (ok) found = m;
  }
  return found;
}
namespace detail {
// 0 when `path` opens for appending (created if missing, as the append after a probe would), else the errno.
inline int append_errno(std::string const& path) noexcept {
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f != nullptr && std::fclose(f) == 0) return 0;
  return errno != 0 ? errno : EIO;
}
}  // namespace detail

inline void save_calibration(std::string const& path, std::string const& key, AlphaBeta const& m) {
  if (int const e = detail::append_errno(path); e != 0)
    throw IoError(detail::cat("save_calibration: cannot append to ", path, ": ", std::strerror(e)));
  std::ofstream f(path, std::ios::app);
  f.precision(17);
  f << m.alpha << ' ' << m.beta << ' ' << m.curve.size();
  for (auto const& p : m.curve) f << ' ' << p.bytes << ' ' << p.seconds;
  f << " overlap " << m.overlap.curve.size();
  for (auto const& o : m.overlap.curve) f << ' ' << o.bytes << ' ' << o.compute << ' ' << o.comm;
  f << '\t' << key << '\n';
  if (!f) throw IoError(detail::cat("save_calibration: cannot append to ", path));
}

struct CalibrateOptions {
  std::string cache;  // file of earlier fits ("" : always probe, write nothing)
  ProbeOptions probe{};
  OverlapProbeOptions overlap{};
};

// Rank 0 looks the key up in the cache; every rank follows its answer (so all use one model): a cached fit
// is broadcast, otherwise every rank probes (probe_alpha_beta, then probe_overlap) and rank 0 appends the fit
// to the cache. A cache rank 0 cannot append to fails on every rank before the probes (IoError naming the file
// and the reason), not after them on rank 0 alone. A cached curve that stops
// short of the largest size asked for (opts.probe.sizes) counts as a miss: the probe runs and its line, appended
// later, wins, so a larger model never reads an extrapolated time from an earlier, smaller calibration.
template <AsyncCommunicator C>
Calibration calibrate(C& comm, CalibrateOptions const& opts = {}) {
  std::string const key = calibration_key(comm);
  // Rank 0's find: alpha, beta, the curve's point count and (bytes, seconds) pairs, then the overlap's
  // (bytes, compute, comm) triples.
  std::vector<double> cached;
  if (comm.rank() == 0 && !opts.cache.empty()) {
    std::size_t const wanted =
        opts.probe.sizes.empty() ? 0 : *std::max_element(opts.probe.sizes.begin(), opts.probe.sizes.end());
    auto m = load_calibration(opts.cache, key);
    if (m && !m->curve.empty() && m->curve.back().bytes < wanted) m.reset();
    if (m) {
      cached = {m->alpha, m->beta, static_cast<double>(m->curve.size())};
      for (auto const& p : m->curve) cached.push_back(static_cast<double>(p.bytes)), cached.push_back(p.seconds);
      for (auto const& o : m->overlap.curve)
        cached.insert(cached.end(), {static_cast<double>(o.bytes), o.compute, o.comm});
    }
  }
  // The count of cached values, or minus the errno of a cache that a probe's fit could not be appended to.
  double size = static_cast<double>(cached.size());
  if (comm.rank() == 0 && !opts.cache.empty() && cached.empty()) {
    if (int const e = detail::append_errno(opts.cache); e != 0) size = -static_cast<double>(e);
  }
  host_broadcast(comm, std::span<double>(&size, 1), 0);
  if (size < 0) {
    throw IoError(detail::cat("calibrate: rank 0 cannot append to the calibration cache ", opts.cache, ": ",
                              std::strerror(static_cast<int>(-size)), " (nothing was probed)"));
  }
  if (size > 0) {
    cached.resize(static_cast<std::size_t>(size));
    host_broadcast(comm, std::span<double>(cached), 0);
    AlphaBeta m{cached[0], cached[1]};
    std::size_t const points = static_cast<std::size_t>(cached[2]);
    std::size_t i = 3;
    for (std::size_t k = 0; k < points; ++k, i += 2)
      m.curve.push_back({static_cast<std::size_t>(cached[i]), cached[i + 1]});
    for (; i + 2 < cached.size(); i += 3)
      m.overlap.curve.push_back({static_cast<std::size_t>(cached[i]), cached[i + 1], cached[i + 2]});
    return Calibration{key, std::move(m), {}, true};
  }
  Calibration cal = probe_alpha_beta(comm, opts.probe);
  cal.model.overlap = probe_overlap(comm, opts.overlap);
  if (comm.rank() == 0 && !opts.cache.empty()) save_calibration(opts.cache, key, cal.model);
  return cal;
}

}  // namespace ddp
