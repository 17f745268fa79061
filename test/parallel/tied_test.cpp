// A tied parameter (the token table used by the embedding and by the output head) in every DDP composition on the
// threads backend at world sizes 1, 2 and 4: one SGD step gives w0 - lr * g, g the global batch's gradient as the
// sum of the table's two uses (double, tied_cases.hpp); the table is held, bucketed, verified and checkpointed once.
// The same cases run under mpirun and Gloo through ddp_suite.hpp.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>

#include "test/parallel/tied_cases.hpp"

using namespace ddp;

namespace {

// Float gradients in two buckets, {ln_f.bias} and {ln_f.weight, wte}; deterministic mode's int64 sums in three.
BucketConfig const kSeveralBuckets{.cap_bytes = 64, .first_cap_bytes = 16};

}  // namespace

TEST_CASE("a tied table's gradient is the sum of its two uses, and the tied graph computes that sum") {
  test::tied_reference();
}

TEST_CASE("tied weights under AverageAllReduce take the reference step at 1, 2 and 4 ranks, in one bucket or several") {
  for (int n : {1, 2, 4})
    for (BucketConfig cfg : {BucketConfig{}, kSeveralBuckets, BucketConfig{.cap_bytes = 0, .first_cap_bytes = 0}}) {
      CAPTURE(n);
      CAPTURE(cfg.cap_bytes);
      spawn(n, [&](ThreadsBackend& comm) { test::tied_average_all_reduce(comm, cfg); });
    }
}

TEST_CASE("tied weights accumulated over a no_sync micro-batch and a synced one take the reference step") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    spawn(n, [](ThreadsBackend& comm) { test::tied_no_sync(comm); });
  }
}

TEST_CASE("tied weights under ZeRO-1 and ZeRO-2 take the reference step at 1, 2 and 4 ranks") {
  for (int n : {1, 2, 4})
    for (int stage : {1, 2})
      for (BucketConfig cfg : {BucketConfig{}, kSeveralBuckets}) {
        CAPTURE(n);
        CAPTURE(stage);
        CAPTURE(cfg.cap_bytes);
        spawn(n, [&](ThreadsBackend& comm) { test::tied_zero(comm, stage, cfg); });
      }
}

TEST_CASE("tied weights with bf16 and fp16 buckets take the reference step within the 16-bit rounding") {
  for (int n : {1, 2, 4})
    for (BucketConfig cfg : {BucketConfig{}, kSeveralBuckets}) {
      CAPTURE(n);
      CAPTURE(cfg.cap_bytes);
      spawn(n, [&](ThreadsBackend& comm) {
        test::tied_compressed<bfloat16>(comm, cfg);
        test::tied_compressed<float16>(comm, cfg);
      });
    }
}

TEST_CASE("tied weights in deterministic mode are bitwise the same at world sizes 1, 2 and 4 and any bucket cap") {
  // Each rank compares itself with a one-rank run inside the case; here the runs are also compared with each other.
  std::vector<test::tied::Weights> seen;
  for (int n : {1, 2, 4})
    for (BucketConfig cfg : {BucketConfig{}, kSeveralBuckets}) {
      CAPTURE(n);
      CAPTURE(cfg.cap_bytes);
      std::vector<test::tied::Weights> w(static_cast<std::size_t>(n));
      spawn(n, [&](ThreadsBackend& comm) {
        test::tied_deterministic(comm, cfg);
        w[static_cast<std::size_t>(comm.rank())] = test::tied::deterministic_step(comm, cfg);
      });
      seen.insert(seen.end(), w.begin(), w.end());
    }
  for (auto const& w : seen) CHECK(w == seen.front());
  CHECK(seen.front() != test::tied::weights_of(test::tied::TiedLm(test::tied::kModelSeed)));  // it trained
}

TEST_CASE("tied weights loaded from a checkpoint take the next step bitwise as the uninterrupted run") {
  char const* tmp = std::getenv("TEST_TMPDIR");
  std::filesystem::path const dir = tmp ? std::filesystem::path(tmp) : std::filesystem::temp_directory_path();
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    spawn(n, [&](ThreadsBackend& comm) {
      test::tied_checkpoint(comm, dir / detail::cat("ddp_tied_test_ws", n, ".ckpt"));
    });
  }
}

TEST_CASE("DDP's cross-rank check counts a tied table once and names it once per rank") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    spawn(n, [](ThreadsBackend& comm) { test::tied_shape_mismatch(comm); });
  }
}
