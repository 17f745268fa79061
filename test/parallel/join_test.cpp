// Uneven inputs and non-finite gradients on the threads backend, world sizes 1, 2 and 4 (join_cases.hpp).
#include <doctest/doctest.h>

#include "test/parallel/join_cases.hpp"

using namespace ddp;

TEST_CASE("join: uneven batch counts equal one process over the same samples, divided by the world size") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    std::vector<double> d(n);
    spawn(n, [&](ThreadsBackend& comm) { d[comm.rank()] = test::join_equivalence(comm, {}); });
    for (double x : d) CHECK(x <= 1e-5);
  }
}

TEST_CASE("join: divide_by_initial_world_size = false divides each step by the ranks still training") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    std::vector<double> d(n);
    spawn(n, [&](ThreadsBackend& comm) {
      d[comm.rank()] = test::join_equivalence(comm, {.divide_by_initial_world_size = false});
    });
    for (double x : d) CHECK(x <= 1e-5);
  }
}

TEST_CASE("join: full-rank PowerSGD under uneven inputs is plain averaging (joined ranks keep their error too)") {
  // Without warm start: a warm-started Q spans only the last round's gradient, which here has lower rank than the
  // next one (two samples a rank), so even full rank would not be exact.
  PowerSgd const full{{.rank = 64, .warmup_steps = 1, .min_compression_rate = 1e-6, .warm_start = false}};
  for (int n : {2, 4}) {
    CAPTURE(n);
    std::vector<double> d(n);
    spawn(n, [&](ThreadsBackend& comm) { d[comm.rank()] = test::join_equivalence(comm, {}, full); });
    for (double x : d) CHECK(x <= 1e-5);
  }
}

TEST_CASE("join: buffers follow the ranks still training, and every rank leaves with the same buffers") {
  for (int n : {2, 4}) spawn(n, [](ThreadsBackend& comm) { test::join_buffers(comm); });
}

TEST_CASE("join: throw_on_early_termination raises on every rank at the first uneven step, naming the ranks") {
  for (int n : {2, 4}) spawn(n, [](ThreadsBackend& comm) { test::join_throw_on_early_termination(comm); });
}

TEST_CASE("without join: uneven batch counts are the same error on every rank, naming ranks and counts") {
  for (int n : {2, 4}) spawn(n, [](ThreadsBackend& comm) { test::uneven_without_join(comm); });
}

TEST_CASE("trainer: EpochSplit::kJoin trains uneven epochs in step; kPad with uneven datasets raises everywhere") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    spawn(n, [](ThreadsBackend& comm) { test::trainer_uneven(comm); });
  }
}

TEST_CASE("non-finite gradients: kRaise names the parameter and the rank on every rank") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    spawn(n, [](ThreadsBackend& comm) { test::non_finite_raise(comm); });
  }
}

TEST_CASE("non-finite gradients: kSkipStep skips on every rank; parameters and optimizer state unchanged") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    spawn(n, [](ThreadsBackend& comm) { test::non_finite_skip(comm); });
  }
}

TEST_CASE("trainer: skipped non-finite steps are counted and their losses left out") {
  for (int n : {1, 2}) {
    CAPTURE(n);
    spawn(n, [](ThreadsBackend& comm) { test::trainer_skips_non_finite(comm); });
  }
}

TEST_CASE("join: a timeline still records while joined ranks shadow") {
  spawn(2, [](ThreadsBackend& comm) {
    Timeline tl;
    auto model = test::make_mlp(8, 16, 4, 1);
    DistributedDataParallel ddp(model, comm, {.timeline = &tl});
    optim::SGD opt(ddp.parameters(), {.lr = 0.1});
    auto data = test::make_data(4, 8, 4, 1);
    JoinResult const r = join(ddp, opt, [&] {
      for (int s = 0; s < 2 + comm.rank(); ++s) {
        opt.zero_grad();
        backward(mse_loss(ddp(Var(data.x)), data.y));
        opt.step();
      }
    });
    CHECK(r.rounds == 3);
    CHECK(r.last_rank == 1);
    CHECK(test::same_on_every_rank(comm, test::weights(ddp.parameters())));
  });
}

TEST_CASE("join: the joined ranks' shadow rounds issue the active ranks' collectives, in order") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    std::vector<std::vector<CollectiveRecord>> recs(n);
    spawn(n, [&](ThreadsBackend& comm) { recs[comm.rank()] = test::join_collective_order(comm); });
    for (int r = 1; r < n; ++r) {
      CAPTURE(r);
      REQUIRE(recs[r].size() == recs[0].size());
      for (std::size_t i = 0; i < recs[0].size(); ++i) {
        CHECK(recs[r][i].op == recs[0][i].op);
        CHECK(recs[r][i].count == recs[0][i].count);
        CHECK(recs[r][i].root == recs[0][i].root);
        CHECK(recs[r][i].tag.id == recs[0][i].tag.id);
      }
    }
    int buckets = 0, joins = 0;
    for (auto const& rec : recs[0]) {
      buckets += rec.tag.label == std::string_view("bucket");
      joins += rec.tag.label == std::string_view("ddp.join");
    }
    int most = 0;
    for (int k = 0; k < n; ++k) most = std::max(most, test::uneven_batches(k));
    CHECK(joins == most + 1);  // the longest rank's steps, then the round in which every rank has joined
    CHECK(buckets > 0);
  }
}

TEST_CASE("join: one join at a time per DDP; an exception in the body leaves the DDP usable") {
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 1);
    DistributedDataParallel ddp(model, comm);
    optim::SGD opt(ddp.parameters(), {.lr = 0.1});
    auto data = test::make_data(4, 8, 4, 1);
    auto step = [&] {
      opt.zero_grad();
      backward(mse_loss(ddp(Var(data.x)), data.y));
      opt.step();
    };
    CHECK_THROWS_WITH_AS(join(ddp, [&] { join(ddp, step); }), doctest::Contains("already inside a join"),
                         ArgumentError);
    JoinResult const r = join(ddp, opt, [&] {
      for (int s = 0; s < 3; ++s) step();
    });
    CHECK(r.rounds == 3);
    CHECK_FALSE(r.uneven);
    step();  // outside any join again
    CHECK(test::same_on_every_rank(comm, test::weights(ddp.parameters())));
  });
}
