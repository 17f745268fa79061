// The α–β fit, the probe on the threads backend, and the calibration cache (ddp/tune/alpha_beta.hpp, probe.hpp, calibration.hpp).
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/recording.hpp"
#include "ddp/comm/threads.hpp"
#include "ddp/tune/tune.hpp"

using namespace ddp;

namespace {
// A backend whose async all-reduces have finished by the time all_reduce_async returns, as a progress thread
// can finish them before the caller looks (the caller descheduled on a busy host). Recording: the test reads
// the calls back.
template <class C>
struct FinishedOnReturn : Recording<C> {
  using Recording<C>::Recording;
  template <detail::BufferLike B>
  Work all_reduce_async(B&& buf, ReduceOp op, CollectiveTag tag = {}) {
    Work w = Recording<C>::all_reduce_async(std::forward<B>(buf), op, tag);
    w.wait();
    return w;
  }
};
static_assert(AsyncCommunicator<FinishedOnReturn<ThreadsBackend>>);

// What save_calibration throws for `path` ("" if it does not).
std::string errors_of_save(std::string const& path) {
  try {
    save_calibration(path, "key", {.alpha = 1e-5, .beta = 1e-9});
  } catch (IoError const& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("fit_alpha_beta recovers a line exactly and clamps what cannot be negative") {
  std::vector<ProbeSample> s;
  for (std::size_t b : {std::size_t{4096}, std::size_t{1} << 20, std::size_t{16} << 20})
    s.push_back({b, 20e-6 + 0.5e-9 * double(b)});
  AlphaBeta const m = fit_alpha_beta(s);
  CHECK(m.alpha == doctest::Approx(20e-6).epsilon(1e-9));
  CHECK(m.beta == doctest::Approx(0.5e-9).epsilon(1e-9));
  CHECK(m.bandwidth() == doctest::Approx(2e9).epsilon(1e-9));
  // Time falling with size (noise): β clamps to 0, α is the weighted mean.
  AlphaBeta const flat = fit_alpha_beta({{1000, 2e-3}, {2000, 1e-3}});
  CHECK(flat.beta == 0);
  CHECK(flat.alpha > 1e-3);  // between the two, nearer the smaller time (weights 1/t²)
  CHECK(flat.alpha < 2e-3);
  CHECK_THROWS_WITH_AS(fit_alpha_beta({{1000, 1e-3}}), doctest::Contains("2 or more"), ArgumentError);
  CHECK_THROWS_WITH_AS(fit_alpha_beta({{1000, 1e-3}, {1000, 2e-3}}), doctest::Contains("two different sizes"),
                       ArgumentError);
  CHECK_THROWS_AS(fit_alpha_beta({{1000, 0.0}, {2000, 1e-3}}), ArgumentError);
}

TEST_CASE("AlphaBeta::predict follows the probe's curve where it has one, the line otherwise") {
  AlphaBeta m{.alpha = 1e-5, .beta = 1e-9};
  CHECK(m.predict(1000) == doctest::Approx(1e-5 + 1e-6));
  m.curve = {{1000, 2e-5}, {3000, 4e-5}, {5000, 1e-4}};
  CHECK(m.predict(10) == 2e-5);                                   // below the smallest: its time
  CHECK(m.predict(3000) == doctest::Approx(4e-5));                // on a point: the point
  CHECK(m.predict(2000) == doctest::Approx(3e-5));                // between: the segment
  CHECK(m.predict(4000) == doctest::Approx(7e-5));                // the next segment, its own slope
  CHECK(m.predict(9000) == doctest::Approx(1e-4 + 4000 * 3e-8));  // past the largest: the last slope
  m.curve = {{1000, 5e-5}, {2000, 4e-5}};                         // time falling with size: held flat
  CHECK(m.predict(1500) == doctest::Approx(5e-5));
}

TEST_CASE("with_probe_samples: later samples replace the curve's points at their sizes, the line is refitted") {
  // A calibration on the line 10 us + 1 ns/B at 4 KiB, 64 KiB and 1 MiB, with an overlap curve.
  AlphaBeta cal{10e-6, 1e-9, {{4096, 10e-6 + 4096e-9}, {65536, 10e-6 + 65536e-9}, {1 << 20, 10e-6 + 1048576e-9}}};
  cal.overlap.curve = {{65536, 0.5, 0.25}};
  // Between steps: 4 KiB took 20 us more, 64 KiB as calibrated; and a size the calibration lacks.
  std::vector<ProbeSample> const later = {
      {4096, 30e-6 + 4096e-9}, {65536, 10e-6 + 65536e-9}, {16384, 30e-6 + 16384e-9}};
  AlphaBeta const m = with_probe_samples(cal, later);
  REQUIRE(m.curve.size() == 4);
  CHECK(m.curve[0].bytes == 4096);
  CHECK(m.curve[0].seconds == doctest::Approx(30e-6 + 4096e-9));  // replaced
  CHECK(m.curve[1].bytes == 16384);
  CHECK(m.curve[1].seconds == doctest::Approx(30e-6 + 16384e-9));  // added
  CHECK(m.curve[3].bytes == (1u << 20));
  CHECK(m.curve[3].seconds == doctest::Approx(10e-6 + 1048576e-9));  // kept
  CHECK(m.predict(4096) == doctest::Approx(30e-6 + 4096e-9));
  CHECK(m.alpha > cal.alpha);  // the line follows the slower small sizes
  CHECK(m.overlap.comm_rate(65536) == doctest::Approx(0.25));
  // The fit is the one of the merged curve.
  AlphaBeta const refit = fit_alpha_beta(m.curve);
  CHECK(m.alpha == doctest::Approx(refit.alpha));
  CHECK(m.beta == doctest::Approx(refit.beta));
  // No samples: the calibration's model.
  AlphaBeta const same = with_probe_samples(cal, {});
  CHECK(same.alpha == doctest::Approx(cal.alpha));
  CHECK(same.beta == doctest::Approx(cal.beta));
  // One size in all is no line.
  CHECK_THROWS_AS(with_probe_samples(AlphaBeta{}, {{4096, 1e-5}}), ArgumentError);
}

TEST_CASE("calibrate: every rank gets the same fit; the cache is written once and read back") {
  // Bazel's per-test directory (concurrent runs of this test share /tmp and, in their sandboxes, pids).
  char const* test_tmp = std::getenv("TEST_TMPDIR");
  auto const dir = (test_tmp ? std::filesystem::path(test_tmp) : std::filesystem::temp_directory_path()) /
                   ("ddp_ab_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string const cache = (dir / "cache.txt").string();
  std::vector<AlphaBeta> first(2), second(2);
  std::vector<int> cached(2, -1);
  ProbeOptions const small{.sizes = {1024, 65536, 262144}, .warmup = 1, .reps = 3};
  OverlapProbeOptions const quick{.sizes = {65536, 262144}, .seconds = 2e-3, .reps = 1};
  spawn(2, [&](ThreadsBackend& comm) {
    Calibration const a = calibrate(comm, {.cache = cache, .probe = small, .overlap = quick});
    first[comm.rank()] = a.model;
    CHECK_FALSE(a.from_cache);
    CHECK(a.samples.size() == 3);
    CHECK(a.model.curve.size() == 3);
    // On a probe point: its time, or the smaller size's when a loaded machine timed that one slower (the curve
    // never falls with size).
    CHECK(a.model.predict(65536) ==
          doctest::Approx(std::max(a.samples[0].seconds, a.samples[1].seconds)).epsilon(1e-12));
    CHECK(a.key.find("threads world 2") != std::string::npos);
    Calibration const b = calibrate(comm, {.cache = cache, .probe = small, .overlap = quick});
    second[comm.rank()] = b.model;
    cached[comm.rank()] = b.from_cache ? 1 : 0;
  });
  CHECK(first[0].alpha == first[1].alpha);
  CHECK(first[0].beta == first[1].beta);
  CHECK(cached == std::vector<int>{1, 1});
  CHECK(second[0].alpha == doctest::Approx(first[0].alpha).epsilon(1e-12));
  CHECK(second[1].beta == doctest::Approx(first[0].beta).epsilon(1e-12));
  CHECK(second[1].curve.size() == 3);  // the probe's points come back from the cache on every rank
  CHECK(second[1].predict(100000) == doctest::Approx(first[0].predict(100000)).epsilon(1e-12));
  // The overlap rates: measured, the same on every rank, and back from the cache.
  REQUIRE(first[0].overlap.curve.size() == 2);
  REQUIRE(second[1].overlap.curve.size() == 2);
  for (std::size_t k = 0; k < 2; ++k) {
    CHECK(first[0].overlap.curve[k].compute == first[1].overlap.curve[k].compute);
    CHECK(first[0].overlap.curve[k].comm == first[1].overlap.curve[k].comm);
    CHECK(second[1].overlap.curve[k].bytes == first[0].overlap.curve[k].bytes);
    CHECK(second[1].overlap.curve[k].compute == doctest::Approx(first[0].overlap.curve[k].compute).epsilon(1e-12));
    CHECK(second[0].overlap.curve[k].comm == doctest::Approx(first[0].overlap.curve[k].comm).epsilon(1e-12));
  }
  // One line, written by rank 0; another key is not found; garbage lines are skipped.
  {
    std::ifstream f(cache);
    int lines = 0;
    for (std::string l; std::getline(f, l);) ++lines;
    CHECK(lines == 1);
  }
  // A larger size than the cached curve reaches: probed again (every rank alike), its line appended and used
  // from then on.
  {
    ProbeOptions larger = small;
    larger.sizes.push_back(1 << 20);
    std::vector<int> reprobed(2, -1), hit(2, -1);
    spawn(2, [&](ThreadsBackend& comm) {
      Calibration const c = calibrate(comm, {.cache = cache, .probe = larger, .overlap = quick});
      reprobed[comm.rank()] = c.from_cache ? 0 : 1;
      CHECK(c.model.curve.size() == 4);
      Calibration const d = calibrate(comm, {.cache = cache, .probe = larger, .overlap = quick});
      hit[comm.rank()] = d.from_cache ? 1 : 0;
      CHECK(d.model.curve.back().bytes == std::size_t{1} << 20);
    });
    CHECK(reprobed == std::vector<int>{1, 1});
    CHECK(hit == std::vector<int>{1, 1});
  }
  CHECK_FALSE(load_calibration(cache, "threads world 3 host nowhere").has_value());
  {
    std::ofstream f(cache, std::ios::app);
    f << "not numbers\tkey x\n-1 2\tkey y\n";
  }
  CHECK_FALSE(load_calibration(cache, "key x").has_value());
  CHECK_FALSE(load_calibration(cache, "key y").has_value());
  {
    std::ofstream f(cache, std::ios::app);  // a curve whose sizes do not ascend, one cut short
    f << "1e-5 1e-9 2 4096 1e-5 1024 2e-5\tkey z\n1e-5 1e-9 3 4096 1e-5\tkey z\n";
  }
  CHECK_FALSE(load_calibration(cache, "key z").has_value());
  {
    std::ofstream f(cache, std::ios::app);  // lines from before the overlap rates, and rates out of (0, 1]
    f << "1e-5 1e-9\tkey w\n1e-5 1e-9 1 4096 1e-5\tkey w\n1e-5 1e-9 0 overlap 1 4096 0 0.5\tkey w\n"
      << "1e-5 1e-9 0 overlap 2 4096 1 0.5\tkey w\n";
  }
  CHECK_FALSE(load_calibration(cache, "key w").has_value());
  save_calibration(cache, "key x",
                   {.alpha = 1e-5, .beta = 2e-10, .overlap = {{{.bytes = 65536, .compute = 0.75, .comm = 0.25}}}});
  auto const x = load_calibration(cache, "key x");
  REQUIRE(x.has_value());
  CHECK(x->alpha == 1e-5);
  CHECK(x->beta == 2e-10);
  CHECK(x->curve.empty());
  REQUIRE(x->overlap.curve.size() == 1);
  CHECK(x->overlap.curve[0].bytes == 65536);
  CHECK(x->overlap.curve[0].compute == 0.75);
  CHECK(x->overlap.curve[0].comm == 0.25);
  save_calibration(cache, "key x", {.alpha = 1e-5, .beta = 2e-10, .curve = {{4096, 3e-5}, {65536, 4e-5}}});
  auto const xc = load_calibration(cache, "key x");  // the later line wins
  REQUIRE(xc.has_value());
  REQUIRE(xc->curve.size() == 2);
  CHECK(xc->curve[1].bytes == 65536);
  CHECK(xc->curve[1].seconds == 4e-5);
  CHECK_FALSE(load_calibration((dir / "missing.txt").string(), "key x").has_value());
  std::filesystem::remove_all(dir);
}

TEST_CASE("calibrate: a cache that cannot be appended to fails on every rank before the probes, naming it") {
  char const* test_tmp = std::getenv("TEST_TMPDIR");
  auto const dir = (test_tmp ? std::filesystem::path(test_tmp) : std::filesystem::temp_directory_path()) /
                   ("ddp_ab_bad_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ProbeOptions const small{.sizes = {1024, 65536}, .warmup = 1, .reps = 1};
  OverlapProbeOptions const quick{.sizes = {65536}, .seconds = 1e-3, .reps = 1};
  // A missing directory, and a directory where the file should be.
  for (std::string const& cache : {(dir / "missing" / "cache.txt").string(), dir.string()}) {
    CAPTURE(cache);
    std::vector<std::string> errors(2);
    spawn(2, [&](ThreadsBackend& comm) {
      try {
        (void)calibrate(comm, {.cache = cache, .probe = small, .overlap = quick});
      } catch (IoError const& e) {
        errors[static_cast<std::size_t>(comm.rank())] = e.what();
      }
    });
    for (auto const& e : errors) {
      CHECK(e.find("calibration cache " + cache + ": ") != std::string::npos);
      CHECK(e.find("nothing was probed") != std::string::npos);
    }
    CHECK(errors[0] == errors[1]);  // the same words on every rank, rank 0's reason included
  }
  CHECK(std::string(errors_of_save(dir.string())).find(dir.string() + ": ") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "missing"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("overlap_rates: the rates probe_overlap clamps, from hand-computed timelines") {
  // GEMMs 1 s alone, 2 s beside 20 all-reduces of 0.1 s each that ended 0.5 s after them: compute ran at half
  // speed, and the all-reduces did 2 - 0.5 = 1.5 s of their 2 s of work in the compute's 2 s.
  auto const half = ddp::detail::overlap_rates(1.0, 0.1, 2.0, 2.5, 20);
  CHECK(half.compute == doctest::Approx(0.5));
  CHECK(half.comm == doctest::Approx(0.75));
  // Every all-reduce done within the compute, which did not slow down: both rates 1.
  auto const unhindered = ddp::detail::overlap_rates(1.0, 0.05, 1.0, 1.0, 20);
  CHECK(unhindered.compute == doctest::Approx(1.0));
  CHECK(unhindered.comm == doctest::Approx(1.0));
  // Noise: compute faster beside the all-reduces than alone, and more work left after it than there was. These
  // are the values outside (0, 1] that probe_overlap clamps.
  auto const noisy = ddp::detail::overlap_rates(1.0, 0.01, 0.8, 1.3, 20);
  CHECK(noisy.compute == doctest::Approx(1.25));
  CHECK(noisy.comm == doctest::Approx((0.2 - 0.5) / 0.8));
}

TEST_CASE("probe_overlap: a sample per size, rates in (0, 1], the same on every rank; one rank and bad options") {
  std::vector<Overlap> got(2);
  spawn(2, [&](ThreadsBackend& comm) {
    got[comm.rank()] = probe_overlap(comm, {.sizes = {262144, 65536}, .seconds = 2e-3, .reps = 2});
  });
  for (auto const& o : got) {
    REQUIRE(o.curve.size() == 2);
    CHECK(o.curve[0].bytes == 65536);  // ascending
    CHECK(o.curve[1].bytes == 262144);
    for (auto const& s : o.curve) {
      CHECK(s.compute > 0);
      CHECK(s.compute <= 1);
      CHECK(s.comm > 0);
      CHECK(s.comm <= 1);
    }
  }
  for (std::size_t k = 0; k < 2; ++k) {
    CHECK(got[0].curve[k].compute == got[1].curve[k].compute);
    CHECK(got[0].curve[k].comm == got[1].curve[k].comm);
  }
  // Every round issues all the all-reduces the ranks agreed on, even when each has finished before the caller
  // looks (issue 13, session 24: a round stopped at the four first launched, so under load one rank issued
  // fewer than its peer and the MPI job hung). The overlap probe's all-reduces in runs between other
  // collectives: 1 (the warm-up and the five timed alone), or a round: at least 14 (8 all-reduces' time at
  // least, x1.5, +2), the two rounds of a repetition alike.
  std::vector<std::vector<std::size_t>> runs(2);
  spawn(2, [&](ThreadsBackend& inner) {
    FinishedOnReturn<ThreadsBackend> comm(inner);
    Overlap const o = probe_overlap(comm, {.sizes = {16384}, .seconds = 1e-3, .reps = 2});
    CHECK(o.curve.size() == 1);
    std::size_t run = 0;
    for (auto const& r : comm.records()) {
      if (r.async && r.tag.label == "overlap probe") {
        ++run;
      } else if (run > 0) {
        runs[static_cast<std::size_t>(comm.rank())].push_back(run);
        run = 0;
      }
    }
  });
  CHECK(runs[0] == runs[1]);
  std::vector<std::size_t> rounds;
  for (std::size_t n : runs[0]) {
    CHECK((n == 1 || n >= 14));
    if (n > 1) rounds.push_back(n);
  }
  CHECK(std::count(runs[0].begin(), runs[0].end(), std::size_t{1}) == 6);
  REQUIRE(rounds.size() >= 4);  // two repetitions (a round repeated with twice as many adds a pair)
  for (std::size_t k = 0; k + 1 < rounds.size(); k += 2) CHECK(rounds[k] == rounds[k + 1]);

  spawn(1, [&](ThreadsBackend& comm) {
    CHECK(probe_overlap(comm).curve.empty());  // nothing to share: not measured
    CHECK_THROWS_WITH_AS(probe_overlap(comm, {.seconds = 0}), doctest::Contains("seconds > 0"), ArgumentError);
    CHECK_THROWS_AS(probe_overlap(comm, {.reps = 0}), ArgumentError);
    CHECK_THROWS_AS(probe_overlap(comm, {.sizes = {2}}), ArgumentError);
    CHECK_THROWS_AS(probe_overlap(comm, {.sizes = {}}), ArgumentError);
  });
}
