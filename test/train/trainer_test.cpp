// basic_trainer: the standard loop equals the explicit DDP loop, and its evaluation counts every sample once.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ddp/ddp.hpp"
#include "test/train/testing.hpp"

using namespace ddp;

namespace {
using test::blobs;

std::vector<float> values(nn::ParameterArena<float> const& a) {
  std::vector<float> v;
  for (auto const& p : a.entries()) v.insert(v.end(), p.var.value().data(), p.var.value().data() + p.numel);
  return v;
}
}  // namespace

TEST_CASE("trainer: fit_epoch equals the explicit DDP loop, bitwise, on every rank") {
  auto data = blobs(103, 1);
  std::vector<std::vector<float>> a(2), b(2);
  spawn(2, [&](ThreadsBackend& comm) {
    auto ce = [](Var const& out, auto const& batch) { return cross_entropy(out, batch.y); };
    auto m1 = test::make_blobs_model();
    trainer<decltype(m1), ThreadsBackend> t(m1, comm, {.lr = 0.1, .momentum = 0.9}, {.batch_size = 8, .seed = 3});
    for (int e = 0; e < 2; ++e) t.fit_epoch(data, {.epoch = e}, ce);
    for (auto const& p : t.ddp().parameters().entries())
      a[comm.rank()].insert(a[comm.rank()].end(), p.var.value().data(), p.var.value().data() + p.numel);

    auto m2 = test::make_blobs_model();
    DistributedDataParallel ddp(m2, comm);
    optim::SGD opt(ddp.parameters(), {.lr = 0.1, .momentum = 0.9});
    for (int e = 0; e < 2; ++e) {
      DistributedSampler sampler(data.size(), comm, {.shuffle = true, .seed = 3});
      sampler.set_epoch(e);
      DataLoader loader(data, sampler, {.batch_size = 8, .drop_last = true});
      for (auto const& batch : loader) {
        opt.zero_grad();
        backward(cross_entropy(ddp(Var(batch.x)), batch.y));
        opt.step();
      }
    }
    for (auto const& p : ddp.parameters().entries())
      b[comm.rank()].insert(b[comm.rank()].end(), p.var.value().data(), p.var.value().data() + p.numel);
  });
  REQUIRE(a[0].size() == b[0].size());
  for (std::size_t i = 0; i < a[0].size(); ++i) {
    CHECK(a[0][i] == b[0][i]);
    CHECK(a[1][i] == a[0][i]);
  }
}

TEST_CASE("trainer: clip_grad_norm clips before every step, bitwise as the explicit loop with nn::clip_grad_norm") {
  auto data = blobs(103, 1);
  std::vector<std::vector<float>> a(2), b(2);
  std::vector<double> norm_t(2), norm_loop(2);
  std::vector<int> clipped(2);
  spawn(2, [&](ThreadsBackend& comm) {
    auto const r = static_cast<std::size_t>(comm.rank());
    auto ce = [](Var const& out, auto const& batch) { return cross_entropy(out, batch.y); };
    auto m1 = test::make_blobs_model();
    trainer<decltype(m1), ThreadsBackend> t(m1, comm, {.lr = 0.1, .momentum = 0.9},
                                            {.batch_size = 8, .seed = 3, .clip_grad_norm = 0.05});
    CHECK(std::isnan(t.last_grad_norm()));
    for (int e = 0; e < 2; ++e) t.fit_epoch(data, {.epoch = e}, ce);
    norm_t[r] = t.last_grad_norm();
    for (auto const& p : t.ddp().parameters().entries())
      a[r].insert(a[r].end(), p.var.value().data(), p.var.value().data() + p.numel);

    auto m2 = test::make_blobs_model();
    DistributedDataParallel ddp(m2, comm);
    optim::SGD opt(ddp.parameters(), {.lr = 0.1, .momentum = 0.9});
    for (int e = 0; e < 2; ++e) {
      DistributedSampler sampler(data.size(), comm, {.shuffle = true, .seed = 3});
      sampler.set_epoch(e);
      DataLoader loader(data, sampler, {.batch_size = 8, .drop_last = true});
      for (auto const& batch : loader) {
        opt.zero_grad();
        backward(cross_entropy(ddp(Var(batch.x)), batch.y));
        norm_loop[r] = double(nn::clip_grad_norm(ddp.parameters(), 0.05));
        clipped[r] += norm_loop[r] > 0.05;
        opt.step();
      }
    }
    for (auto const& p : ddp.parameters().entries())
      b[r].insert(b[r].end(), p.var.value().data(), p.var.value().data() + p.numel);
  });
  CHECK(clipped[0] > 0);  // the cap was below the gradient norm at some steps: clipping changed the run
  CHECK(norm_t[0] == norm_loop[0]);
  CHECK(norm_t[1] == norm_t[0]);
  REQUIRE(a[0].size() == b[0].size());
  for (std::size_t i = 0; i < a[0].size(); ++i) {
    CHECK(a[0][i] == b[0][i]);
    CHECK(a[1][i] == a[0][i]);
  }
  // A cap that is not a finite number >= 0 is an error when the trainer is built, on every rank.
  spawn(2, [&](ThreadsBackend& comm) {
    auto m = test::make_blobs_model();
    std::string msg;
    try {
      trainer<decltype(m), ThreadsBackend> t(m, comm, {.lr = 0.1}, {.clip_grad_norm = -1.0});
    } catch (ArgumentError const& e) {
      msg = e.what();
    }
    CHECK(msg.find("clip_grad_norm must be a finite number >= 0, got -1") != std::string::npos);
  });
}

TEST_CASE("trainer: training reduces the loss; evaluate counts each sample once across ranks") {
  auto train = blobs(200, 2), test = blobs(101, 3);
  std::vector<Counts> counts(3);
  std::vector<double> first(3), last(3);
  spawn(3, [&](ThreadsBackend& comm) {
    auto m = test::make_blobs_model();
    trainer<decltype(m), ThreadsBackend> t(m, comm, {.lr = 0.1, .momentum = 0.9}, {.batch_size = 8});
    for (int e = 0; e < 4; ++e) {
      auto r = t.fit_epoch(train, {.epoch = e},
                           [](Var const& out, auto const& batch) { return cross_entropy(out, batch.y); });
      if (e == 0) first[comm.rank()] = r.train.mean_loss();
      last[comm.rank()] = r.train.mean_loss();
    }
    counts[comm.rank()] = t.evaluate(test, 16);
  });
  for (int r = 0; r < 3; ++r) {
    CHECK(counts[r].total == 101);  // EvalSampler: no padding double count
    CHECK(counts[r].correct == counts[0].correct);
    CHECK(last[r] == last[0]);  // the reported mean is the all-ranks mean, the same everywhere
  }
  CHECK(last[0] < first[0]);
  CHECK(double(counts[0].correct) / 101.0 > 0.9);  // separable blobs
}

TEST_CASE(
    "trainer: the deterministic composition trains through the same loop, bitwise the same at world sizes 1, 2, 4") {
  auto data = blobs(103, 1);  // 6 global batches of 16; the tail of 7 is dropped at every world size
  std::vector<std::vector<float>> weights;
  std::vector<double> losses;
  for (int n : {1, 2, 4}) {
    std::vector<std::vector<float>> w(static_cast<std::size_t>(n));
    std::vector<double> l(static_cast<std::size_t>(n));
    spawn(n, [&](ThreadsBackend& comm) {
      auto m = test::make_blobs_model();
      basic_trainer<decltype(m), ThreadsBackend, optim::AdamW, SizeCapped, ExactSum, MicroBatches> t(
          m, comm, {.lr = 0.01}, {.seed = 3, .global_batch = 16}, {.batching = {.count = 4}});
      CHECK(t.steps_per_epoch(data) == 6);
      double loss = 0;
      for (int e = 0; e < 2; ++e)
        loss = t.fit_epoch(data, {.epoch = e}, [](Var const& out, auto const& mb) {
                  return cross_entropy(out, mb.y);
                }).train.mean_loss();
      auto const r = static_cast<std::size_t>(comm.rank());
      l[r] = loss;
      for (auto const& p : t.ddp().parameters().entries())
        w[r].insert(w[r].end(), p.var.value().data(), p.var.value().data() + p.numel);
    });
    for (int r = 1; r < n; ++r) CHECK(w[static_cast<std::size_t>(r)] == w[0]);
    weights.push_back(w[0]);
    losses.push_back(l[0]);
  }
  CHECK(weights[1] == weights[0]);
  CHECK(weights[2] == weights[0]);
  CHECK(losses[1] == losses[0]);  // the epoch's mean loss too, to the bit
  CHECK(losses[2] == losses[0]);
}

TEST_CASE("trainer: OwnerReduce with ZeRO trains bitwise as AverageAllReduce; clipping and loss scaling are refused") {
  auto data = blobs(103, 1);
  spawn(2, [&](ThreadsBackend& comm) {
    auto ce = [](Var const& out, auto const& batch) { return cross_entropy(out, batch.y); };
    using M = decltype(test::make_blobs_model());
    using Zero = ZeroRedundancyOptimizer<optim::SGD, ThreadsBackend>;
    auto m1 = test::make_blobs_model(), m2 = test::make_blobs_model();
    basic_trainer<M, ThreadsBackend, optim::SGD> plain(m1, comm, {.lr = 0.1, .momentum = 0.9},
                                                       {.batch_size = 8, .seed = 3});
    basic_trainer<M, ThreadsBackend, Zero, SizeCapped, OwnerReduce> owner(
        m2, comm, {.optimizer = {.lr = 0.1, .momentum = 0.9}}, {.batch_size = 8, .seed = 3});
    for (int e = 0; e < 2; ++e) {
      plain.fit_epoch(data, {.epoch = e}, ce);
      owner.fit_epoch(data, {.epoch = e}, ce);
    }
    CHECK(values(owner.ddp().parameters()) == values(plain.ddp().parameters()));
    auto m3 = test::make_blobs_model();
    using Owner = basic_trainer<M, ThreadsBackend, Zero, SizeCapped, OwnerReduce>;
    CHECK_THROWS_WITH_AS(Owner(m3, comm, {}, {.batch_size = 8, .clip_grad_norm = 1.0}),
                         doctest::Contains("clip_grad_norm reads the averaged gradients before the step, but under "
                                           "OwnerReduce"),
                         ArgumentError);
    CHECK_THROWS_WITH_AS(Owner(m3, comm, {}, {.batch_size = 8, .loss_scaling = optim::GradScalerOptions{}}),
                         doctest::Contains("loss_scaling reads the averaged gradients"), ArgumentError);
  });
}

TEST_CASE("trainer: deterministic training without a global batch, or with EpochSplit::kJoin, is refused") {
  spawn(1, [](ThreadsBackend& comm) {
    using T = basic_trainer<decltype(test::make_blobs_model()), ThreadsBackend, optim::SGD, SizeCapped, ExactSum,
                            MicroBatches>;
    auto m = test::make_blobs_model();
    CHECK_THROWS_WITH_AS(T(m, comm, {.lr = 0.1}, {.batch_size = 8}),
                         doctest::Contains("needs TrainerOptions::global_batch"), ArgumentError);
    CHECK_THROWS_WITH_AS(T(m, comm, {.lr = 0.1}, {.global_batch = 8, .split = EpochSplit::kJoin}),
                         doctest::Contains("EpochSplit::kJoin does not apply"), ArgumentError);
  });
}

TEST_CASE("trainer: loss_scaling is bitwise the unscaled run (clipping included); an overflowing scale backs off") {
  auto data = blobs(103, 1);
  auto ce = [](Var const& out, auto const& batch) { return cross_entropy(out, batch.y); };
  spawn(2, [&](ThreadsBackend& comm) {
    auto m1 = test::make_blobs_model(), m2 = test::make_blobs_model();
    TrainerOptions const base{.batch_size = 8, .seed = 3, .clip_grad_norm = 0.05};
    TrainerOptions scaled_opts = base;
    scaled_opts.loss_scaling = optim::GradScalerOptions{};
    trainer<decltype(m1), ThreadsBackend> plain(m1, comm, {.lr = 0.1, .momentum = 0.9}, base);
    trainer<decltype(m2), ThreadsBackend> scaled(m2, comm, {.lr = 0.1, .momentum = 0.9}, scaled_opts);
    CHECK_FALSE(plain.loss_scale().has_value());
    for (int e = 0; e < 2; ++e) {
      auto const a = plain.fit_epoch(data, {.epoch = e}, ce), b = scaled.fit_epoch(data, {.epoch = e}, ce);
      CHECK(a.train.mean_loss() == b.train.mean_loss());
      CHECK(b.skipped_steps == 0);
    }
    CHECK(values(scaled.ddp().parameters()) == values(plain.ddp().parameters()));
    CHECK(scaled.loss_scale() == 65536.0);
    CHECK(scaled.last_grad_norm() == plain.last_grad_norm());

    // A scale of 2^130 is past float's range (2^128): the first steps overflow and are skipped on both ranks, each
    // halving the scale, until the scaled gradients fit; then training goes on.
    auto m3 = test::make_blobs_model();
    TrainerOptions huge = base;
    huge.loss_scaling = optim::GradScalerOptions{.init_scale = std::ldexp(1.0, 130)};
    trainer<decltype(m3), ThreadsBackend> t(m3, comm, {.lr = 0.1, .momentum = 0.9}, huge);
    auto const before = values(t.ddp().parameters());
    auto const r = t.fit_epoch(data, {.epoch = 0}, ce);
    CHECK(r.skipped_steps >= 3);
    CHECK(r.skipped_steps < r.steps);
    CHECK(t.loss_scale_skipped_steps() == r.skipped_steps);
    CHECK(*t.loss_scale() == std::ldexp(1.0, 130 - static_cast<int>(r.skipped_steps)));
    CHECK(std::isfinite(r.train.mean_loss()));
    CHECK(values(t.ddp().parameters()) != before);

    // Refused where the scale could not stay in step, or would come too late.
    TrainerOptions join_opts = scaled_opts;
    join_opts.split = EpochSplit::kJoin;
    using Trainer = trainer<decltype(m3), ThreadsBackend>;
    CHECK_THROWS_WITH_AS(Trainer(m3, comm, {.lr = 0.1}, join_opts),
                         doctest::Contains("loss_scaling with EpochSplit::kJoin"), ArgumentError);
  });
}

TEST_CASE("trainer: loss_every N reads the loss every N steps: the same mean loss and weights as every step") {
  auto data = blobs(203, 1);
  spawn(2, [&](ThreadsBackend& comm) {
    auto ce = [](Var const& out, auto const& batch) { return cross_entropy(out, batch.y); };
    auto train = [&](std::int64_t every, std::vector<double>& seen) {
      auto m = test::make_blobs_model();
      trainer<decltype(m), ThreadsBackend> t(m, comm, {.lr = 0.1, .momentum = 0.9},
                                             {.batch_size = 8, .seed = 3, .loss_every = every});
      StepHooks const hooks{.after_step = [&](StepPosition const&, double l) {
        seen.push_back(l);
        return StepControl::kContinue;
      }};
      EpochResult const r = t.fit_epoch(data, EpochStart{}, ce, hooks);
      return std::pair{r.train.mean_loss(), values(t.ddp().parameters())};
    };
    std::vector<double> each, every5;
    auto const one = train(1, each);
    auto const five = train(5, every5);
    CHECK(one.first == five.first);  // the same losses, accounted in the same order
    CHECK(one.second == five.second);
    REQUIRE(each.size() == 12);  // 101 or 102 samples per rank, 8 per batch, the last dropped
    REQUIRE(every5.size() == each.size());
    for (std::size_t i = 0; i < each.size(); ++i) {
      CAPTURE(i);
      bool const read = (i + 1) % 5 == 0 || i + 1 == each.size();
      // A step that reads sees its own loss; the others the latest one read (none before step 5).
      CHECK(every5[i] == (read ? each[i] : i >= 5 ? each[(i / 5) * 5 - 1] : 0.0));
    }
  });
  spawn(1, [&](ThreadsBackend& comm) {
    auto m = test::make_blobs_model();
    CHECK_THROWS_WITH_AS((trainer<decltype(m), ThreadsBackend>(m, comm, {.lr = 0.1}, {.loss_every = 0})),
                         doctest::Contains("loss_every must be at least 1"), ArgumentError);
  });
}
