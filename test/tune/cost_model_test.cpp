// The step-time model (ddp/tune/cost_model.hpp): predictions checked against hand-computed timelines, the
// cap choice on profiles whose best cap is known, and the report's contents.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/tune/tune.hpp"

using namespace ddp;

namespace {
// Four parameters of 1 MiB each (float), ready at 1, 2, 3, 4 ms after backward began (the last registered
// first, as backward finishes them); backward's compute ends at 4 ms.
BackwardProfile four_mib() {
  std::int64_t const m = (std::int64_t{1} << 20) / 4;
  return BackwardProfile{
      .numels = {m, m, m, m}, .ready = {4e-3, 3e-3, 2e-3, 1e-3}, .forward = 2e-3, .backward = 4e-3, .update = 1e-3};
}
}  // namespace

TEST_CASE("predict_step: buckets start when ready and after the previous one, and the tail is exposed") {
  BackwardProfile const prof = four_mib();
  AlphaBeta const model{.alpha = 0.5e-3, .beta = 1e-3 / double(1 << 20)};  // 0.5 ms + 1 ms per MiB
  SUBCASE("one bucket per parameter: each 1.5 ms, back to back from 1 ms") {
    BucketPlan const plan = assign_buckets(prof.numels, 4, {.cap_bytes = 0, .first_cap_bytes = 0});
    REQUIRE(plan.buckets.size() == 4);
    StepPrediction const p = predict_step(plan, prof, model, 4);
    CHECK(p.buckets[0].ready == doctest::Approx(1e-3));
    CHECK(p.buckets[0].end == doctest::Approx(2.5e-3));
    CHECK(p.buckets[1].start == doctest::Approx(2.5e-3));  // ready at 2 ms, but bucket 0 runs until 2.5
    CHECK(p.buckets[3].end == doctest::Approx(7e-3));
    CHECK(p.exposed == doctest::Approx(3e-3));
    CHECK(p.step == doctest::Approx(2e-3 + 4e-3 + 3e-3 + 1e-3));
  }
  SUBCASE("one bucket: nothing overlaps") {
    BucketPlan const plan = SingleBucket{}.plan(prof.numels, 4);
    StepPrediction const p = predict_step(plan, prof, model, 4);
    REQUIRE(p.buckets.size() == 1);
    CHECK(p.buckets[0].bytes == std::size_t{4} << 20);
    CHECK(p.buckets[0].start == doctest::Approx(4e-3));
    CHECK(p.exposed == doctest::Approx(4.5e-3));
  }
  SUBCASE("mismatched profile and plan are errors that say so") {
    BackwardProfile bad = prof;
    bad.ready.pop_back();
    CHECK_THROWS_WITH_AS(predict_step(SingleBucket{}.plan(prof.numels, 4), bad, model, 4),
                         doctest::Contains("3 ready times for 4 parameters"), ArgumentError);
  }
}

TEST_CASE("predict_step: an all-reduce that shares the cores with backward runs and lets run at the measured rates") {
  BackwardProfile const prof = four_mib();
  BucketPlan const plan = assign_buckets(prof.numels, 4, {.cap_bytes = 0, .first_cap_bytes = 0});
  AlphaBeta model{.alpha = 0.5e-3, .beta = 1e-3 / double(1 << 20)};  // 1.5 ms per 1 MiB bucket alone
  SUBCASE("rates 1: the free overlap of separate cores, as without the overlap term") {
    StepPrediction const p = predict_step(plan, prof, model, 4);
    CHECK(p.backward == doctest::Approx(4e-3));
    CHECK(p.exposed == doctest::Approx(3e-3));
  }
  SUBCASE("the all-reduce at half its rate: bucket 0 takes until backward ends, the rest follow alone") {
    model.overlap.curve = {{.bytes = 1 << 20, .compute = 1, .comm = 0.5}};
    StepPrediction const p = predict_step(plan, prof, model, 4);
    CHECK(p.buckets[0].start == doctest::Approx(1e-3));
    CHECK(p.buckets[0].end == doctest::Approx(4e-3));  // 3 ms of backward left at half rate: 1.5 ms of work
    CHECK(p.buckets[1].start == doctest::Approx(4e-3));
    CHECK(p.buckets[3].end == doctest::Approx(8.5e-3));
    CHECK(p.backward == doctest::Approx(4e-3));
    CHECK(p.exposed == doctest::Approx(4.5e-3));
    CHECK(p.step == doctest::Approx(2e-3 + 4e-3 + 4.5e-3 + 1e-3));
  }
  SUBCASE("compute at half its rate while an all-reduce runs: backward ends later, ready times move with it") {
    model.overlap.curve = {{.bytes = 1 << 20, .compute = 0.5, .comm = 1}};
    StepPrediction const p = predict_step(plan, prof, model, 4);
    CHECK(p.buckets[0].end == doctest::Approx(2.5e-3));     // compute done by then: 1 + 0.75 ms
    CHECK(p.buckets[1].ready == doctest::Approx(2.75e-3));  // 0.25 ms of compute alone to reach 2 ms
    CHECK(p.buckets[1].end == doctest::Approx(4.25e-3));
    CHECK(p.buckets[2].ready == doctest::Approx(4.5e-3));
    CHECK(p.buckets[3].ready == doctest::Approx(6.25e-3));
    CHECK(p.backward == doctest::Approx(6.25e-3));
    CHECK(p.exposed == doctest::Approx(1.5e-3));
    CHECK(p.step == doctest::Approx(2e-3 + 6.25e-3 + 1.5e-3 + 1e-3));
  }
  SUBCASE("an all-reduce that cannot run during backward: everything after it, the latencies add up") {
    model.overlap.curve = {{.bytes = 1 << 20, .compute = 1, .comm = 1e-9}};  // clamped to 1e-3
    StepPrediction const p = predict_step(plan, prof, model, 4);
    CHECK(p.backward == doctest::Approx(4e-3));
    CHECK(p.exposed == doctest::Approx(6e-3 - 3e-6));  // four buckets after backward, less 3 ms at 1e-3
  }
}

TEST_CASE("Overlap: rates interpolated in log size between samples, held past the ends, 1 without samples") {
  Overlap o;
  CHECK(o.compute_rate(123) == 1);
  CHECK(o.comm_rate(std::size_t{1} << 30) == 1);
  o.curve = {{.bytes = 1 << 16, .compute = 1, .comm = 0.01}, {.bytes = 1 << 22, .compute = 0.7, .comm = 0.31}};
  CHECK(o.comm_rate(1024) == doctest::Approx(0.01));
  CHECK(o.comm_rate(std::size_t{1} << 30) == doctest::Approx(0.31));
  CHECK(o.compute_rate(1 << 19) == doctest::Approx(0.85));  // halfway in log2: 16 .. 22
  CHECK(o.comm_rate(1 << 20) == doctest::Approx(0.01 + 4.0 / 6.0 * 0.3));
}

TEST_CASE("choose_bucket_cap: latency-bound links want big buckets, bandwidth-bound ones small buckets") {
  BackwardProfile const prof = four_mib();
  std::vector<std::size_t> const caps = {std::size_t{1} << 20, std::size_t{2} << 20, std::size_t{4} << 20};
  // Latency 10 ms per all-reduce, bandwidth free: one bucket (one latency) is best.
  CapChoice const big = choose_bucket_cap(prof, {.alpha = 10e-3, .beta = 0}, 4, caps);
  CHECK(big.config.cap_bytes == (std::size_t{4} << 20));
  CHECK(big.tried.size() == 3);
  // No latency, 1 ms per MiB: per-parameter buckets overlap everything but the last MiB.
  CapChoice const small = choose_bucket_cap(prof, {.alpha = 0, .beta = 1e-3 / double(1 << 20)}, 4, caps);
  CHECK(small.config.cap_bytes == (std::size_t{1} << 20));
  CHECK(small.prediction.exposed == doctest::Approx(1e-3));
  // Every candidate's prediction is what predict_step says for its plan.
  for (auto const& c : small.tried) {
    auto const plan = assign_buckets(prof.numels, 4, c.config);
    CHECK(c.buckets == plan.buckets.size());
    CHECK(c.prediction.step ==
          doctest::Approx(predict_step(plan, prof, {.alpha = 0, .beta = 1e-3 / double(1 << 20)}, 4).step));
  }
  CHECK_THROWS_AS(choose_bucket_cap(prof, {}, 4, {}), ArgumentError);
}

TEST_CASE("choose_bucket_cap: where all-reduces cannot progress during backward, fewer buckets win") {
  BackwardProfile const prof = four_mib();
  std::vector<std::size_t> const caps = {std::size_t{1} << 20, std::size_t{2} << 20, std::size_t{4} << 20};
  AlphaBeta model{.alpha = 0.5e-3, .beta = 1e-3 / double(1 << 20)};
  // Free overlap: 1 and 2 MiB both leave 3 ms exposed (the tie goes to the larger cap); 4 MiB (a 1 MiB first
  // bucket, then 3 MiB) leaves 3.5.
  CapChoice const free = choose_bucket_cap(prof, model, 4, caps);
  CHECK(free.config.cap_bytes == (std::size_t{2} << 20));
  CHECK(free.prediction.exposed == doctest::Approx(3e-3));
  // Stalled during backward: every bucket runs after it, so each extra bucket costs its latency: 4 MiB's two
  // buckets take 1.5 + 3.5 ms (less the 3 µs bucket 0 gets done at 1e-3 during backward).
  model.overlap.curve = {{.bytes = 1 << 20, .compute = 1, .comm = 1e-3}};
  CapChoice const stalled = choose_bucket_cap(prof, model, 4, caps);
  CHECK(stalled.config.cap_bytes == (std::size_t{4} << 20));
  CHECK(stalled.prediction.exposed == doctest::Approx(5e-3 - 3e-6));
}

TEST_CASE("cost_report lists every bucket and the step error") {
  BackwardProfile const prof = four_mib();
  StepPrediction const p = predict_step(assign_buckets(prof.numels, 4, {.cap_bytes = 0, .first_cap_bytes = 0}), prof,
                                        {.alpha = 0.5e-3, .beta = 1e-3 / double(1 << 20)}, 4);
  std::string const r = cost_report(p, {1.4e-3, 1.6e-3}, 11e-3);
  CHECK(r.find("1048576") != std::string::npos);
  CHECK(r.find("1.500") != std::string::npos);  // predicted per bucket
  CHECK(r.find("1.600") != std::string::npos);  // measured bucket 1
  CHECK(r.find("predicted 10.000 ms") != std::string::npos);
  CHECK(r.find("measured 11.000 ms") != std::string::npos);
  CHECK(r.find("error -9.1%") != std::string::npos);
}
