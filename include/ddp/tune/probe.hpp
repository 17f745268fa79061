// The probes that calibrate the α–β model on a live backend: timed all-reduces of several sizes
// (probe_alpha_beta; every rank measures, the slowest rank's time counts, every rank gets the same fit) and how
// all-reduces and host compute share the machine while both run (probe_overlap). Collective.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <unistd.h>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"
#include "ddp/tensor/host_kernels.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tune/alpha_beta.hpp"

namespace ddp {

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
// One repetition of probe_overlap at one size, in the slowest rank's seconds: `compute_alone` for the GEMMs
// alone, `comm_alone` for one all-reduce alone, then both together: `compute_together` until the GEMMs ended,
// `total_together` until the last of `calls` all-reduces ended. The rates before they are clamped to (0, 1]:
// compute's, alone against together; the all-reduces', the work they did while compute ran (their time alone,
// less what ran after the compute) against the compute's time. Noise can put either outside (0, 1].
struct OverlapRates {
  double compute = 1;
  double comm = 1;
};
inline OverlapRates overlap_rates(double compute_alone, double comm_alone, double compute_together,
                                  double total_together, double calls) noexcept {
  double const work = calls * comm_alone;
  double const after = total_together - compute_together;
  return {compute_alone / compute_together, (work - after) / compute_together};
}

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
        detail::OverlapRates const raw = detail::overlap_rates(r[0], r[1], r[2], r[3], static_cast<double>(calls));
        compute_rate.push_back(std::clamp(raw.compute, 0.01, 1.0));
        comm_rate.push_back(std::clamp(raw.comm, 0.01, 1.0));
        ++rep;
      }
      out.curve.push_back({n * sizeof(float), detail::median_of(compute_rate), detail::median_of(comm_rate)});
    }
    return out;
  }
}

}  // namespace ddp
