// DistributedDataParallel on the threads backend: equivalence, cross-rank errors, no_sync, buffers,
// collective order.
#include <doctest/doctest.h>

#include <mutex>

#include "test/parallel/ddp_cases.hpp"

using namespace ddp;

TEST_CASE("N ranks on B/N equal one process on B after 20 SGD-momentum steps") {
  for (int n : {1, 2, 4}) {
    for (BucketConfig cfg : {BucketConfig{}, BucketConfig{.cap_bytes = 256, .first_cap_bytes = 64},
                             BucketConfig{.cap_bytes = 0, .first_cap_bytes = 0}}) {
      CAPTURE(n);
      CAPTURE(cfg.cap_bytes);
      std::vector<double> rel(n);
      spawn(n, [&](ThreadsBackend& comm) { rel[comm.rank()] = test::equivalence(comm, 16, 20, cfg); });
      for (double d : rel) CHECK(d <= test::kEquivalenceTolerance);
    }
  }
}

TEST_CASE("a shape mismatch raises on every rank, naming the parameter and both shapes") {
  for (int n : {2, 3}) spawn(n, [](ThreadsBackend& comm) { test::shape_mismatch(comm); });
}

TEST_CASE("an unused parameter is an error on every rank; find_unused_parameters treats it as zero") {
  for (int n : {1, 2, 4}) spawn(n, [](ThreadsBackend& comm) { test::unused_parameter(comm); });
}

TEST_CASE("no_sync: k accumulated micro-batches then one synced step equal one big batch") {
  for (int n : {1, 2, 4}) {
    std::vector<double> d(n);
    spawn(n, [&](ThreadsBackend& comm) { d[comm.rank()] = test::no_sync_accumulation(comm); });
    for (double x : d) CHECK(x <= test::kEquivalenceTolerance);
  }
}

TEST_CASE("buffers are broadcast from rank 0 at construction and before each forward") {
  spawn(3, [](ThreadsBackend& comm) { test::buffer_broadcast(comm); });
}

TEST_CASE("collectives: one broadcast per parameter, one all-reduce per bucket per step, same order on every rank") {
  for (BucketConfig cfg :
       {BucketConfig{.cap_bytes = 0, .first_cap_bytes = 0}, BucketConfig{.cap_bytes = 1024, .first_cap_bytes = 256}}) {
    std::vector<std::vector<CollectiveRecord>> recs(2);
    spawn(2, [&](ThreadsBackend& comm) { recs[comm.rank()] = test::collective_order(comm, cfg); });
    auto const& a = recs[0];
    REQUIRE(a.size() == recs[1].size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].op == recs[1][i].op);
      CHECK(a[i].count == recs[1][i].count);
      CHECK(a[i].tag.id == recs[1][i].tag.id);
    }
    auto model = test::make_mlp(8, 64, 4, 1);
    auto plan = assign_buckets(std::vector<std::int64_t>{64 * 8, 64, 4 * 64, 4}, 4, cfg);
    std::size_t bcast = 0, reduces = 0;
    std::int64_t expect_bucket = 0;
    for (auto const& r : a) {
      if (r.op == CollectiveKind::kBroadcast && r.tag.label == std::string_view("ddp.param")) ++bcast;
      if (r.op == CollectiveKind::kAllReduce && r.tag.label == std::string_view("bucket")) {
        CHECK(r.tag.id == expect_bucket);        // plan order
        auto const& b = plan.buckets[r.tag.id];  // gradients, then 2 flags per parameter and one slot per rank
        CHECK(r.count == std::size_t(b.numel + 2 * std::int64_t(b.params.size()) + 2));
        expect_bucket = (expect_bucket + 1) % std::int64_t(plan.buckets.size());
        ++reduces;
      }
    }
    CHECK(bcast == 4);
    CHECK(reduces == 2 * plan.buckets.size());
  }
}

TEST_CASE("a rank that fails mid-step ends every rank with an error naming it, never a hang") {
  std::vector<std::string> seen(3);
  std::string thrown;
  try {
    spawn(3, [&](ThreadsBackend& comm) {
      auto model = test::make_mlp(8, 16, 4, 1);
      DistributedDataParallel ddp(model, comm);
      auto data = test::make_data(4, 8, 4, 1);
      try {
        for (int step = 0; step < 3; ++step) {
          if (step == 1 && comm.rank() == 2) throw std::runtime_error("rank 2: bad batch");
          ddp.parameters().zero_grad();
          backward(mse_loss(ddp(Var(data.x)), data.y));
        }
      } catch (CommError const& e) {
        seen[comm.rank()] = e.what();
        throw;
      }
    });
  } catch (std::exception const& e) {
    thrown = e.what();
  }
  CHECK(thrown == "rank 2: bad batch");  // spawn rethrows the failing rank's own error
  for (int r : {0, 1}) {
    CAPTURE(seen[r]);
    CHECK(seen[r].find("rank 2") != std::string::npos);
  }
}

TEST_CASE("a backward that throws does not leave the next step unsynchronised") {
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 1);
    DistributedDataParallel ddp(model, comm);
    auto data = test::make_data(4, 8, 4, 1 + static_cast<std::uint64_t>(comm.rank()));  // different data per rank
    Var out = ddp(Var(data.x));
    // A bad seed shape makes backward throw before any hook fires (same on both ranks).
    CHECK_THROWS_AS(backward(out, zeros<float>({3, 3})), ShapeError);
    CHECK_FALSE(post_backward_queued(&ddp));  // nothing queued: no hook ran
    ddp.parameters().zero_grad();
    Var loss = mse_loss(ddp(Var(data.x)), data.y);
    CHECK_FALSE(post_backward_queued(&ddp));  // queued by the first parameter hook of the backward, not by forward
    backward(loss);
    CHECK_FALSE(post_backward_queued(&ddp));
    // Synchronised: both ranks hold the same (averaged) gradient.
    std::vector<float> g(ddp.parameters().entries()[0].var.grad().data(),
                         ddp.parameters().entries()[0].var.grad().data() + 8),
        all(16);
    comm.all_gather(g, all);
    for (int i = 0; i < 8; ++i) CHECK(all[i] == all[8 + i]);
  });
}

TEST_CASE("world size 1: an unused parameter is still an error naming it; find_unused leaves it without a gradient") {
  spawn(1, [](ThreadsBackend& comm) {
    Generator g(5);
    test::Branchy model(g);
    model.use_extra = false;
    {
      DistributedDataParallel ddp(model, comm);
      CHECK_THROWS_WITH_AS(backward(sum(ddp(Var(full<float>({2, 4}, 1.0f))))), doctest::Contains("'extra.weight'"),
                           DdpError);
    }
    DistributedDataParallel ddp(model, comm, {.find_unused_parameters = true});
    ddp.parameters().zero_grad();
    backward(sum(ddp(Var(full<float>({2, 4}, 1.0f)))));
    CHECK_FALSE(ddp.parameters().find("extra.weight").var.has_grad());
    CHECK(ddp.parameters().find("fc1.bias").var.grad()[0] == 2.0f);
  });
}

TEST_CASE("a backward through another model between forward and backward does not consume DDP's sync") {
  for (bool find_unused : {false, true}) {
    for (int n : {1, 2, 4}) {
      CAPTURE(n);
      CAPTURE(find_unused);
      std::vector<double> d(n);
      spawn(n, [&](ThreadsBackend& comm) {
        d[comm.rank()] = test::unrelated_backward(comm, {.find_unused_parameters = find_unused});
      });
      for (double x : d) CHECK(x <= 1e-6);
    }
  }
}

TEST_CASE("find_unused_parameters: a parameter unused on every rank keeps no gradient and no optimizer moves it") {
  for (int n : {1, 2, 4}) spawn(n, [](ThreadsBackend& comm) { test::globally_unused_is_skipped(comm); });
}

TEST_CASE("wrapping a model whose parameters an earlier optimizer holds is an error that says what to do") {
  for (int n : {1, 2}) spawn(n, [](ThreadsBackend& comm) { test::optimizer_before_wrap(comm); });
}

TEST_CASE("frozen parameters are broadcast and skipped; user gradient hooks run before the reduction") {
  for (int n : {1, 2, 3}) spawn(n, [](ThreadsBackend& comm) { test::frozen_and_hooks(comm); });
}

TEST_CASE("buckets reduced against other buckets are caught exactly at any world size, naming the ranks") {
  for (int n : {2, 3, 4, 8}) {
    CAPTURE(n);
    spawn(n, [](ThreadsBackend& comm) { test::bucket_fingerprint(comm); });
  }
}

TEST_CASE("a user's bucket plan with a gap is an error on every rank, naming the bucket") {
  for (int n : {1, 2, 4}) spawn(n, [](ThreadsBackend& comm) { test::plan_with_gap(comm); });
}
