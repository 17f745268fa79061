// ZeroRedundancyOptimizer (ZeRO-1 and 2, parallel/zero_redundancy.hpp) on the threads backend at world sizes 1, 2
// and 4: bitwise the unsharded optimizer's weights under every reduction policy, the state cut into 1/world pieces
// that put together give the unsharded state, stage 2's gradients kept 1/world, and bad options and shard states
// refused. Deterministic mode and
// resharded checkpoints: deterministic_test.cpp.
#include <doctest/doctest.h>

#include "test/parallel/zero_cases.hpp"

using namespace ddp;

TEST_CASE("ZeRO-1: the unsharded optimizer's weights, bit for bit, with the state cut 1/world") {
  for (int n : {1, 2, 4}) {
    for (BucketConfig cfg : {BucketConfig{}, BucketConfig{.cap_bytes = 512, .first_cap_bytes = 128}}) {
      for (auto which : {test::ZeroOpt::kSgdMomentum, test::ZeroOpt::kAdamW}) {
        CAPTURE(n);
        CAPTURE(cfg.cap_bytes);
        CAPTURE(int(which));
        spawn(n, [&](ThreadsBackend& comm) { test::zero_matches_unsharded(comm, which, cfg); });
      }
    }
  }
}

TEST_CASE("ZeRO-1 composes with compressed buckets and PowerSGD") {
  BucketConfig const cfg{.cap_bytes = 512, .first_cap_bytes = 128};
  for (int n : {2, 4}) {
    CAPTURE(n);
    spawn(n, [&](ThreadsBackend& comm) {
      test::zero_matches_unsharded(comm, test::ZeroOpt::kAdamW, cfg, 4, Bf16AllReduce{});
      test::zero_matches_unsharded(comm, test::ZeroOpt::kSgdMomentum, cfg, 4,
                                   PowerSgd{{.rank = 2, .warmup_steps = 1, .min_compression_rate = 1.0}});
    });
  }
}

TEST_CASE("ZeRO-2: stage 1's weights and state, bit for bit, keeping 1/world of the gradients after each step") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    spawn(n, [](ThreadsBackend& comm) { test::zero2_keeps_its_slices(comm); });
  }
}

TEST_CASE("OwnerReduce: the ZeRO optimizer reduces its own slices, bit for bit AverageAllReduce's") {
  for (int n : {1, 2, 4}) {
    for (BucketConfig cfg : {BucketConfig{}, BucketConfig{.cap_bytes = 512, .first_cap_bytes = 128}}) {
      CAPTURE(n);
      CAPTURE(cfg.cap_bytes);
      spawn(n, [&](ThreadsBackend& comm) {
        test::owner_reduce_matches(comm, test::ZeroOpt::kSgdMomentum, cfg, 1, UpdateAt::kStep, 1);
        test::owner_reduce_matches(comm, test::ZeroOpt::kAdamW, cfg, 1, UpdateAt::kBucketReduced, 1);
        test::owner_reduce_matches(comm, test::ZeroOpt::kSgdMomentum, cfg, 2, UpdateAt::kBucketReduced, 1);
        test::owner_reduce_matches(comm, test::ZeroOpt::kAdamW, cfg, 1, UpdateAt::kStep, 3);
      });
    }
  }
}

TEST_CASE("OwnerReduce in the loop, as the README shows it") {
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    auto data = test::make_data(16, 8, 4, 3);
    // The wrapper only agrees on each bucket's status words; the ZeRO optimizer reduces its own slices.
    DistributedDataParallel<test::Mlp, ThreadsBackend, SizeCapped, OwnerReduce> ddp(model, comm);
    ZeroRedundancyOptimizer<optim::SGD, ThreadsBackend> opt(ddp, {.optimizer = {.lr = 0.1}});
    CHECK(opt.owner_reduces());
    CHECK(opt.gather_bytes() == 0);
    for (int s = 0; s < 2; ++s) {
      Tensor<float> const x = test::rows(data.x, 8 * s + 4 * comm.rank(), 4);
      Tensor<float> const y = test::rows(data.y, 8 * s + 4 * comm.rank(), 4);
      opt.zero_grad();
      backward(mse_loss(ddp(Var(x)), y));
      opt.step();
    }
    // Every replica holds the same parameters.
    std::vector<float> const mine = test::weights(ddp.parameters());
    std::vector<float> theirs(mine.size());
    if (comm.rank() == 0) theirs = mine;
    comm.broadcast(std::span<float>(theirs), 0);
    CHECK(mine == theirs);
  });
}

TEST_CASE("OwnerReduce: a 6 MB bucket goes to the peers with streaming stores, with the same bits") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    spawn(n, [](ThreadsBackend& comm) {
      test::owner_reduce_matches(comm, test::ZeroOpt::kSgdMomentum, {}, 1, UpdateAt::kStep, 1, 2, 1 << 17);
      test::owner_reduce_matches(comm, test::ZeroOpt::kAdamW, {}, 2, UpdateAt::kBucketReduced, 2, 2, 1 << 17);
    });
  }
}

TEST_CASE("OwnerReduce refuses what would see unreduced gradients, on every rank") {
  spawn(2, [](ThreadsBackend& comm) {
    using Owner = DistributedDataParallel<test::Mlp, ThreadsBackend, SizeCapped, OwnerReduce>;
    auto data = test::make_data(8, 8, 4, 3);
    Tensor<float> const x = test::rows(data.x, 4 * comm.rank(), 4), y = test::rows(data.y, 4 * comm.rank(), 4);
    {  // a non-finite check needs reduced gradients
      auto model = test::make_mlp(8, 16, 4, 5);
      CHECK_THROWS_WITH_AS(Owner(model, comm, {.non_finite = NonFinite::kRaise}),
                           doctest::Contains("OwnerReduce leaves the gradients unreduced until the optimizer's step"),
                           ArgumentError);
    }
    {  // an optimizer that does not reduce: the first forward says so, before anything is launched
      auto model = test::make_mlp(8, 16, 4, 5);
      Owner ddp(model, comm);
      optim::SGD plain(ddp.parameters(), {.lr = 0.1});
      CHECK_THROWS_WITH_AS(ddp(Var(x)), doctest::Contains("no optimizer reduces them: build a ZeroRedundancyOptimizer"),
                           ArgumentError);
      // Stage 0 would leave every rank updating with unreduced gradients.
      using Zero = ZeroRedundancyOptimizer<optim::SGD, ThreadsBackend>;
      CHECK_THROWS_WITH_AS(Zero(ddp, {.zero = {.stage = 0}}), doctest::Contains("which needs stage 1 or 2"),
                           ArgumentError);
      {  // attached while it lives (one at a time), detached after: the next forward refuses again
        Zero zero(ddp, {.optimizer = {.lr = 0.1}});
        CHECK_THROWS_WITH_AS(Zero(ddp, {.optimizer = {.lr = 0.1}}),
                             doctest::Contains("already has an optimizer that reduces its gradients"), ArgumentError);
        zero.zero_grad();
        backward(mse_loss(ddp(Var(x)), y));
        zero.step();
      }
      CHECK_THROWS_WITH_AS(ddp(Var(x)), doctest::Contains("no optimizer reduces them"), ArgumentError);
    }
  });
}

TEST_CASE("ZeRO: bad stages and one rank's shard of the state are refused") {
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 48, 4, 5);
    DistributedDataParallel<test::Mlp, ThreadsBackend> ddp(model, comm);
    using Zero = ZeroRedundancyOptimizer<optim::AdamW, ThreadsBackend>;
    CHECK_THROWS_WITH_AS(Zero(ddp, {.zero = {.stage = 3}}),
                         doctest::Contains("stage must be 0 (unsharded), 1 (optimizer state sharded) or 2"),
                         ArgumentError);
    Zero zero(ddp, {});
    auto const shard = zero.state();
    CHECK_THROWS_WITH_AS(zero.load_state(shard), doctest::Contains("Load its consolidated_state()"), ArgumentError);
    optim::AdamW plain_layout(nn::ParameterArena<float>(test::make_mlp(8, 48, 4, 5)), {});
    CHECK_THROWS_WITH_AS(plain_layout.load_state(shard), doctest::Contains("one rank's shard of a ZeRO optimizer"),
                         ArgumentError);
    CHECK(zero.describe().find("ZeRO-1 adamw over 2 ranks: optimizer state") != std::string::npos);
    // Stage 0 is the optimizer itself: the whole state on every rank.
    Zero whole(ddp, {.zero = {.stage = 0}});
    CHECK(whole.state_bytes() == whole.unsharded_state_bytes());
  });
}

TEST_CASE("ZeRO-1 inside ddp::join is refused on every rank, with the optimizer passed or not") {
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    DistributedDataParallel<test::Mlp, ThreadsBackend> ddp(model, comm);
    ZeroRedundancyOptimizer<optim::SGD, ThreadsBackend> opt(ddp, {.optimizer = {.lr = 0.1}});
    auto data = test::make_data(8, 8, 4, 3);
    auto body = [&] {
      opt.zero_grad();
      backward(mse_loss(ddp(Var(test::rows(data.x, 4 * comm.rank(), 4))), test::rows(data.y, 4 * comm.rank(), 4)));
      opt.step();
    };
    CHECK_THROWS_WITH_AS(join(ddp, opt, body), doctest::Contains("ddp::join: the optimizer's state is sharded"),
                         ArgumentError);
    CHECK_THROWS_WITH_AS(join(ddp, body), doctest::Contains("a sharded optimizer cannot step inside ddp::join"),
                         ArgumentError);
    // Outside a join it steps as usual.
    body();
  });
}
