// DistributedDataParallel with CompressedAllReduce (buckets as bfloat16 / float16 on the wire) on the threads
// backend: the gradients are exactly what the wire promises, the buckets travel as 16-bit floats, training
// follows the float run, and a float16 overflow is reported on every rank.
#include <doctest/doctest.h>

#include "test/parallel/compressed_cases.hpp"

using namespace ddp;

TEST_CASE_TEMPLATE("compressed buckets: each rank's gradient is the 16-bit sum of the ranks' 16-bit shares", H,
                   bfloat16, float16) {
  for (int n : {1, 2, 3, 4}) {
    for (BucketConfig cfg : {BucketConfig{}, BucketConfig{.cap_bytes = 256, .first_cap_bytes = 64}}) {
      CAPTURE(n);
      CAPTURE(cfg.cap_bytes);
      spawn(n, [&](ThreadsBackend& comm) { test::compressed_gradients_exact<H>(comm, cfg); });
    }
  }
}

TEST_CASE("compressed buckets: 30 steps stay close to the float run and train") {
  for (int n : {1, 2, 4}) {
    std::vector<double> bf(n), fp(n);
    spawn(n, [&](ThreadsBackend& comm) {
      bf[comm.rank()] = test::compressed_training(comm, Bf16AllReduce{});
      fp[comm.rank()] = test::compressed_training(comm, Fp16AllReduce{});
    });
    CAPTURE(n);
    CAPTURE(bf[0]);
    CAPTURE(fp[0]);
    for (int r = 0; r < n; ++r) {
      CHECK(bf[r] == bf[0]);  // the same weights on every rank
      CHECK(fp[r] == fp[0]);
    }
    if (n == 1) {  // nothing travels on one rank: the float run exactly
      CHECK(bf[0] == 0);
      CHECK(fp[0] == 0);
    } else {
      CHECK(bf[0] > 0);      // something was rounded
      CHECK(bf[0] <= 2e-3);  // measured 4.4e-4 to 4.8e-4 at 2 and 4 ranks
      CHECK(fp[0] <= 4e-4);  // measured 4.6e-5 to 5.3e-5
    }
  }
}

TEST_CASE("compressed buckets: a float16 overflow is an error on every rank under NonFinite::kRaise") {
  for (int n : {2, 4}) spawn(n, [](ThreadsBackend& comm) { test::fp16_overflow_is_reported(comm); });
}

TEST_CASE("CompressedAllReduce names itself") {
  CHECK(Bf16AllReduce{}.name() == "CompressedAllReduce<bfloat16>");
  CHECK(Fp16AllReduce{}.name() == "CompressedAllReduce<float16>");
}

TEST_CASE("a bucket plan with more buckets than a 16-bit wire has distinct ids is refused on every rank") {
  // 129 Linear(1, 1) layers: 258 parameters, one bucket each at cap 0. bf16 holds 256 distinct ids, fp16 2048.
  spawn(2, [](ThreadsBackend& comm) {
    Generator gen(1);
    nn::AnySequential<float> model;
    for (int i = 0; i < 129; ++i) model.push_back(nn::Linear(1, 1, gen));
    SizeCapped const one_each{{.cap_bytes = 0, .first_cap_bytes = 0}};
    CHECK_THROWS_WITH_AS(
        (DistributedDataParallel<nn::AnySequential<float>, ThreadsBackend, SizeCapped, Bf16AllReduce>(
            model, comm, {}, {.bucketer = one_each})),
        "DistributedDataParallel: the bucket plan has 258 buckets, but the 16-bit wire of this reduction holds "
        "distinct bucket ids only up to 256; use a larger bucket cap (fewer buckets) or a float wire",
        ArgumentError);
    DistributedDataParallel<nn::AnySequential<float>, ThreadsBackend, SizeCapped, Fp16AllReduce> fp16(
        model, comm, {}, {.bucketer = one_each});
    CHECK(fp16.plan().buckets.size() == 258);
  });
}
