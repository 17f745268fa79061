// Deterministic mode (DistributedDataParallel with ExactSum and MicroBatches) on the threads backend: the final weights are bitwise identical for world sizes
// 1, 2 and 4 and bucket caps 1 KiB, 1 MiB and 25 MiB (MLP and CNN with dropout; SGD with momentum and
// AdamW), a checkpoint taken at one world size resumes bit for bit at another, the gradients are the
// global batch's mean gradient, and misuse is reported.
#include <doctest/doctest.h>

#include <cmath>
#include <mutex>

#include "test/parallel/deterministic_cases.hpp"

using namespace det_cases;

namespace {

// Trains `run` on `world` thread ranks; checks every rank ends with the same bytes and returns them.
std::vector<std::uint8_t> on_threads(int world, Run const& run, CheckpointData<float> const* resume = nullptr,
                                     std::int64_t checkpoint_after = -1, CheckpointData<float>* captured = nullptr) {
  std::vector<std::vector<std::uint8_t>> bytes(static_cast<std::size_t>(world));
  ddp::spawn(world, [&](ddp::ThreadsBackend& c) {
    bytes[static_cast<std::size_t>(c.rank())] =
        train(c, run, resume, checkpoint_after, c.rank() == 0 ? captured : nullptr);
  });
  for (int r = 1; r < world; ++r) REQUIRE(bytes[static_cast<std::size_t>(r)] == bytes[0]);
  return bytes[0];
}

}  // namespace

TEST_CASE("deterministic mode: the same weights, bit for bit, for world sizes 1, 2, 4 and every bucket cap") {
  for (Run const& run : all_runs()) {
    CAPTURE(describe(run));
    auto const reference = on_threads(1, Run{run.model, run.optimizer, kDefaultBucketCapBytes, run.steps});
    REQUIRE(reference != weight_bytes(make_model(run.model)));  // it trained
    for (int world : {1, 2, 4}) {
      CAPTURE(world);
      CHECK(on_threads(world, run) == reference);
    }
  }
}

TEST_CASE("deterministic mode: a checkpoint written at world size 2 resumes bit for bit at 1 and 4") {
  for (auto model : {ModelKind::kMlp, ModelKind::kCnn}) {
    for (auto opt : {OptKind::kSgdMomentum, OptKind::kAdamW}) {
      Run const run{.model = model, .optimizer = opt, .steps = 6};
      CAPTURE(describe(run));
      auto const straight = on_threads(2, run);
      CheckpointData<float> midway;
      on_threads(2, run, nullptr, 3, &midway);
      REQUIRE(midway.position.global_step == 3);
      for (int world : {1, 2, 4}) {
        CAPTURE(world);
        CHECK(on_threads(world, run, &midway) == straight);
      }
    }
  }
}

TEST_CASE("deterministic mode: a ZeRO-1 checkpoint is re-cut at load, sharded or not, bit for bit") {
  for (auto model : {ModelKind::kMlp, ModelKind::kCnn}) {
    for (auto opt : {OptKind::kSgdMomentum, OptKind::kAdamW}) {
      Run const plain{.model = model, .optimizer = opt, .cap_bytes = std::size_t{1} << 10, .steps = 6};
      Run sharded = plain;
      sharded.zero = 1;
      CAPTURE(describe(sharded));
      auto const straight = on_threads(2, plain);
      CHECK(on_threads(2, sharded) == straight);
      CheckpointData<float> midway, unsharded_midway;
      on_threads(2, sharded, nullptr, 3, &midway);
      on_threads(2, plain, nullptr, 3, &unsharded_midway);
      CHECK(midway.optimizer == unsharded_midway.optimizer);  // the whole state, put together
      for (int world : {1, 2, 4}) {
        CAPTURE(world);
        CHECK(on_threads(world, sharded, &midway) == straight);
        CHECK(on_threads(world, plain, &midway) == straight);
        CHECK(on_threads(world, sharded, &unsharded_midway) == straight);
      }
    }
  }
}

TEST_CASE("deterministic mode computes the global batch's mean gradient") {
  // Without dropout, the deterministic gradient equals the plain full-batch gradient up to float rounding.
  Data const data;
  auto make = [] {
    Generator g(5);
    return nn::Sequential(nn::Flatten(), nn::Linear(64, 16, g), nn::Tanh(), nn::Linear(16, 10, g));
  };
  auto plain = make();
  nn::ParameterArena<float> pa(plain);
  Tensor<float> x(Shape{kGlobalBatch, 1, 8, 8});
  Tensor<std::int32_t> y(Shape{kGlobalBatch});
  std::memcpy(x.data(), data.x.data(), static_cast<std::size_t>(x.numel()) * sizeof(float));
  std::memcpy(y.data(), data.y.data(), kGlobalBatch * sizeof(std::int32_t));
  backward(cross_entropy(plain(Var(x)), y));
  std::vector<float> want(pa.grads().data(), pa.grads().data() + pa.numel());
  std::mutex m;
  ddp::spawn(2, [&](ddp::ThreadsBackend& c) {
    auto model = make();
    DeterministicDataParallel<decltype(model), ddp::ThreadsBackend> dp(model, c, {}, {.batching = {.count = 4}});
    std::int64_t const share = kGlobalBatch / 2;
    Tensor<float> xs(Shape{share, 1, 8, 8});
    Tensor<std::int32_t> ys(Shape{share});
    std::memcpy(xs.data(), x.data() + c.rank() * share * 64, static_cast<std::size_t>(xs.numel()) * sizeof(float));
    std::memcpy(ys.data(), y.data() + c.rank() * share, static_cast<std::size_t>(share) * sizeof(std::int32_t));
    double loss = 0;
    for (auto const& mb : dp.micro_batches(xs, ys, {.step = 0})) {
      Var l = cross_entropy(dp(mb), mb.y);
      backward(l);
      loss += l.item();
    }
    std::lock_guard lock(m);
    CHECK(std::isfinite(loss));
    auto const& g = dp.parameters().grads();
    REQUIRE(g.numel() == static_cast<std::int64_t>(want.size()));
    for (std::int64_t i = 0; i < g.numel(); ++i)
      REQUIRE(g[i] == doctest::Approx(want[static_cast<std::size_t>(i)]).epsilon(1e-5).scale(1e-3));
  });
}

TEST_CASE("deterministic mode: a world size that does not divide the micro-batches, and bad batches") {
  CHECK_THROWS_WITH_AS(ddp::spawn(3,
                                  [](ddp::ThreadsBackend& c) {
                                    auto model = make_model(ModelKind::kMlp);
                                    DeterministicDataParallel<nn::AnySequential<float>, ddp::ThreadsBackend> dp(
                                        model, c, {}, {.batching = {.count = 4}});
                                  }),
                       doctest::Contains("the world size 3 does not divide micro_batches = 4"), ddp::ArgumentError);
  ddp::spawn(2, [](ddp::ThreadsBackend& c) {
    auto model = make_model(ModelKind::kMlp);
    DeterministicDataParallel<nn::AnySequential<float>, ddp::ThreadsBackend> dp(model, c, {},
                                                                                {.batching = {.count = 4}});
    Tensor<float> x(Shape{3, 1, 8, 8});  // 3 rows are not 2 equal micro-batches
    Tensor<std::int32_t> y(Shape{3});
    CHECK_THROWS_WITH_AS(dp.micro_batches(x, y, {.step = 0}),
                         doctest::Contains("batch has 3 rows (shape [3, 1, 8, 8]), which is not 2 equal micro-batches"),
                         ddp::ShapeError);
  });
}

TEST_CASE("deterministic mode: a non-finite gradient on one rank is an error naming the parameter on every rank") {
  std::vector<std::string> seen(2);
  try {
    ddp::spawn(2, [&](ddp::ThreadsBackend& c) {
      auto model = make_model(ModelKind::kMlp);
      DeterministicDataParallel<nn::AnySequential<float>, ddp::ThreadsBackend> dp(model, c, {},
                                                                                  {.batching = {.count = 2}});
      Tensor<float> x(Shape{1, 1, 8, 8});
      Tensor<std::int32_t> y(Shape{1});
      for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = c.rank() == 1 && i == 5 ? NAN : 0.5f;
      y[0] = 1;
      try {
        for (auto const& mb : dp.micro_batches(x, y, {.step = 0})) backward(cross_entropy(dp(mb), mb.y));
      } catch (ddp::DdpError const& e) {
        seen[static_cast<std::size_t>(c.rank())] = e.what();
        throw;
      }
    });
    FAIL("no error");
  } catch (ddp::DdpError const&) {}
  for (auto const& s : seen) {
    CAPTURE(s);
    CHECK(s.find("non-finite gradients (NaN or Inf) at step 0 in parameters 'fc1.weight'") != std::string::npos);
  }
}

TEST_CASE("deterministic mode refuses unequal shares and partial micro-batches on every rank (world sizes 1, 2, 4)") {
  for (int n : {1, 2, 4}) ddp::spawn(n, [](ddp::ThreadsBackend& c) { unequal_rows(c); });
}

TEST_CASE("deterministic mode refuses ranks that pass different steps, on every rank (world sizes 2, 4)") {
  for (int n : {2, 4}) ddp::spawn(n, [](ddp::ThreadsBackend& c) { mismatched_step(c); });
}

TEST_CASE("deterministic mode: dropout seeded per rank is made rank 0's; reseeded per rank later, refused (1, 2, 4)") {
  for (int n : {1, 2, 4}) ddp::spawn(n, [](ddp::ThreadsBackend& c) { per_rank_dropout_seeds(c); });
}

TEST_CASE("deterministic mode refuses BatchNorm in training mode on every rank, and trains it in eval (1, 2, 4)") {
  for (int n : {1, 2, 4}) ddp::spawn(n, [](ddp::ThreadsBackend& c) { batch_norm_in_training(c); });
}
