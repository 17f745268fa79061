// OverlappedOptimizer (parallel/overlapped_update.hpp) on the threads backend at world sizes 1, 2 and 4: each bucket
// updated as its reduction lands, bitwise the optimizer's step() after the round, alone and composed with
// compressed buckets, PowerSGD, ZeRO-1, deterministic mode and micro-batches; a missing gradient raises on every
// rank (or is zeros with find_unused_parameters); where a round needs every bucket first, it says so and steps
// after backward.
#include <doctest/doctest.h>

#include "test/parallel/overlapped_cases.hpp"

using namespace ddp;

TEST_CASE("overlapped update: bitwise the optimizer's step, bucket by bucket, at world sizes 1, 2 and 4") {
  for (int n : {1, 2, 4}) {
    for (BucketConfig cfg : {BucketConfig{}, BucketConfig{.cap_bytes = 512, .first_cap_bytes = 128}}) {
      for (auto which : {test::ZeroOpt::kSgdMomentum, test::ZeroOpt::kAdamW}) {
        CAPTURE(n);
        CAPTURE(cfg.cap_bytes);
        CAPTURE(int(which));
        spawn(n, [&](ThreadsBackend& comm) { test::overlapped_matches_step(comm, which, cfg); });
      }
    }
  }
}

TEST_CASE("overlapped update composes with compressed buckets, PowerSGD, ZeRO-1 and deterministic mode") {
  BucketConfig const cfg{.cap_bytes = 512, .first_cap_bytes = 128};
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    spawn(n, [&](ThreadsBackend& comm) {
      test::overlapped_matches_step(comm, test::ZeroOpt::kAdamW, cfg, 4, Bf16AllReduce{});
      test::overlapped_matches_step(comm, test::ZeroOpt::kSgdMomentum, cfg, 4,
                                    PowerSgd{{.rank = 2, .warmup_steps = 1, .min_compression_rate = 1.0}});
      test::overlapped_matches_step(comm, test::ZeroOpt::kAdamW, cfg, 4, AverageAllReduce{}, 1);
      test::overlapped_matches_step(comm, test::ZeroOpt::kSgdMomentum, cfg, 4, Fp16AllReduce{}, 1);
      test::overlapped_matches_step(comm, test::ZeroOpt::kAdamW, cfg, 4, ExactSum{});
      test::overlapped_matches_step(comm, test::ZeroOpt::kSgdMomentum, cfg, 4, ExactSum{}, 1);
    });
  }
}

TEST_CASE("overlapped update: a round that checks for non-finite gradients steps after backward, and says so") {
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    auto ref_model = test::make_mlp(8, 16, 4, 5);
    DistributedDataParallel<test::Mlp, ThreadsBackend> ddp(model, comm, {.non_finite = NonFinite::kSkipStep});
    DistributedDataParallel<test::Mlp, ThreadsBackend> ref_ddp(ref_model, comm);
    OverlappedOptimizer<optim::SGD> opt(ddp, {.optimizer = {.lr = 0.1}});
    optim::SGD ref(ref_ddp.parameters(), {.lr = 0.1});
    CHECK_FALSE(opt.updates_in_backward());
    CHECK(opt.waits_for().find("non_finite") != std::string::npos);
    CHECK(opt.describe().find("updated after backward (DdpOptions::non_finite") != std::string::npos);
    auto data = test::make_data(8, 8, 4, 3);
    auto const x = test::rows(data.x, 4 * comm.rank(), 4), y = test::rows(data.y, 4 * comm.rank(), 4);
    auto const before = test::weights(ddp.parameters());
    opt.zero_grad();
    backward(mse_loss(ddp(Var(x)), y));
    CHECK(test::weights(ddp.parameters()) == before);  // nothing moves before step()
    opt.step();
    ref.zero_grad();
    backward(mse_loss(ref_ddp(Var(x)), y));
    ref.step();
    CHECK(test::weights(ddp.parameters()) == test::weights(ref_ddp.parameters()));
    // Asked to update in step(): the optimizer as it is.
    auto model2 = test::make_mlp(8, 16, 4, 5);
    DistributedDataParallel<test::Mlp, ThreadsBackend> ddp2(model2, comm);
    OverlappedOptimizer<optim::SGD> later(ddp2, {.optimizer = {.lr = 0.1}, .overlap = {.update_at = UpdateAt::kStep}});
    CHECK_FALSE(later.updates_in_backward());
    CHECK(later.describe() == "sgd; updated after backward");
  });
}

TEST_CASE("overlapped update: a window that cuts a parameter, and clip_grad_norm in the trainer, are refused") {
  spawn(1, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    DistributedDataParallel<test::Mlp, ThreadsBackend> ddp(model, comm);
    optim::SGD sgd(ddp.parameters(), {.lr = 0.1});
    CHECK_THROWS_WITH_AS(sgd.update({0, 3}), doctest::Contains("cuts parameter"), ArgumentError);
    auto trainer_model = test::make_mlp(8, 16, 4, 5);
    using Trainer = basic_trainer<test::Mlp, ThreadsBackend, OverlappedOptimizer<optim::SGD>>;
    CHECK_THROWS_WITH_AS(
        Trainer(trainer_model, comm, {.optimizer = {.lr = 0.1}}, {.global_batch = 4, .clip_grad_norm = 1.0}),
        doctest::Contains("clip_grad_norm needs every gradient"), ArgumentError);
    Trainer fine(trainer_model, comm, {.optimizer = {.lr = 0.1}, .overlap = {.update_at = UpdateAt::kStep}},
                 {.global_batch = 4, .clip_grad_norm = 1.0});
    CHECK_FALSE(fine.optimizer().updates_in_backward());
  });
}

TEST_CASE(
    "overlapped update: a gradient missing on some rank is the same error on every rank, or zeros with "
    "find_unused_parameters, as without it") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    spawn(n, [&](ThreadsBackend& comm) {
      Generator g(5);
      test::Branchy model(g);
      model.use_extra = comm.rank() == 0;
      {
        DistributedDataParallel ddp(model, comm);
        OverlappedOptimizer<optim::SGD> opt(ddp, {.optimizer = {.lr = 0.1}});
        CHECK(opt.updates_in_backward());
        CHECK_THROWS_WITH_AS(backward(sum(ddp(Var(full<float>({2, 4}, 1.0f))))), doctest::Contains("'extra.weight'"),
                             DdpError);
      }
      Generator g2(5);
      test::Branchy ref_model(g2);
      ref_model.use_extra = comm.rank() == 0;
      DistributedDataParallel ddp(model, comm, {.find_unused_parameters = true});
      DistributedDataParallel ref(ref_model, comm, {.find_unused_parameters = true});
      OverlappedOptimizer<optim::SGD> opt(ddp, {.optimizer = {.lr = 0.1, .momentum = 0.9}});
      optim::SGD ref_opt(ref.parameters(), {.lr = 0.1, .momentum = 0.9});
      for (int s = 0; s < 3; ++s) {
        opt.zero_grad();
        backward(sum(ddp(Var(full<float>({2, 4}, 1.0f)))));
        opt.step();
        ref_opt.zero_grad();
        backward(sum(ref(Var(full<float>({2, 4}, 1.0f)))));
        ref_opt.step();
        CHECK(test::weights(ddp.parameters()) == test::weights(ref.parameters()));
      }
    });
  }
}

TEST_CASE("overlapped update with micro-batches (gradient accumulation): bitwise the optimizer's step") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    spawn(n, [&](ThreadsBackend& comm) {
      auto data = test::make_data(8 * 4, 8, 4, 13);
      auto m1 = test::make_mlp(8, 48, 4, 5), m2 = test::make_mlp(8, 48, 4, 5);
      using D = DistributedDataParallel<test::Mlp, ThreadsBackend, SizeCapped, AverageAllReduce, MicroBatches>;
      SizeCapped const buckets{{.cap_bytes = 512, .first_cap_bytes = 128}};
      D plain(m1, comm, {}, {.bucketer = buckets, .batching = {.count = 4}}),
          ov(m2, comm, {}, {.bucketer = buckets, .batching = {.count = 4}});
      optim::AdamW ref(plain.parameters(), {.lr = 1e-2});
      OverlappedOptimizer<optim::AdamW> opt(ov, {.optimizer = {.lr = 1e-2}});
      for (int s = 0; s < 4; ++s) {
        std::int64_t const local = 8 / n;
        auto const x = test::rows(data.x, s * 8 + comm.rank() * local, local);
        auto const y = test::rows(data.y, s * 8 + comm.rank() * local, local);
        ref.zero_grad();
        for (auto const& mb : plain.micro_batches(x, y)) backward(mse_loss(plain(mb), mb.y));
        ref.step();
        opt.zero_grad();
        for (auto const& mb : ov.micro_batches(x, y)) backward(mse_loss(ov(mb), mb.y));
        opt.step();
        CHECK(test::weights(ov.parameters()) == test::weights(plain.parameters()));
      }
    });
  }
}
