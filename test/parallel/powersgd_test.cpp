// DistributedDataParallel with PowerSgd (PowerSGD buckets, bucket/powersgd.hpp) on the threads backend: the
// gradients are the reference PowerSGD's at 1-4 ranks, with the collectives and bytes it promises; a full-rank
// approximation is the plain average; training follows the float run; bad options are refused.
#include <doctest/doctest.h>

#include "test/parallel/powersgd_cases.hpp"

using namespace ddp;

TEST_CASE("PowerSGD: each round's gradients are the reference's, with warm-up, warm start and error feedback") {
  for (int n : {1, 2, 3, 4}) {
    for (BucketConfig cfg : {BucketConfig{}, BucketConfig{.cap_bytes = 256, .first_cap_bytes = 64}}) {
      for (std::int64_t rank : {1, 2}) {
        CAPTURE(n);
        CAPTURE(cfg.cap_bytes);
        CAPTURE(rank);
        PowerSgdOptions const opts{.rank = rank, .warmup_steps = 2, .min_compression_rate = 1.0};
        spawn(n, [&](ThreadsBackend& comm) { test::powersgd_matches_reference(comm, opts, cfg, 6, 2e-4); });
      }
    }
  }
}

TEST_CASE("PowerSGD: without error feedback, without warm start, and without both, still the reference's") {
  for (auto [feedback, warm] : {std::pair{false, true}, std::pair{true, false}, std::pair{false, false}}) {
    CAPTURE(feedback);
    CAPTURE(warm);
    PowerSgdOptions const opts{
        .rank = 2, .warmup_steps = 1, .min_compression_rate = 1.0, .error_feedback = feedback, .warm_start = warm};
    for (BucketConfig cfg : {BucketConfig{}, BucketConfig{.cap_bytes = 256, .first_cap_bytes = 64}})
      spawn(2, [&](ThreadsBackend& comm) { test::powersgd_matches_reference(comm, opts, cfg, 4, 2e-4); });
  }
}

TEST_CASE("PowerSGD: a full-rank approximation is the plain average") {
  // r = min(rows, cols): P spans the mean's columns, so P P^T mean = mean (to rounding).
  PowerSgdOptions const opts{.rank = 64, .warmup_steps = 0, .min_compression_rate = 1e-6};
  for (int n : {2, 4}) {
    CAPTURE(n);
    std::vector<double> diff(n);
    spawn(n, [&](ThreadsBackend& comm) {
      auto data = test::make_data(4 * n * 3, 8, 4, 5);
      auto model = test::make_mlp(8, 32, 4, 1);
      auto plain = test::make_mlp(8, 32, 4, 1);
      nn::ParameterArena<float> plain_params(plain);
      DistributedDataParallel<decltype(model), ThreadsBackend, SizeCapped, PowerSgd> ddp(model, comm, {},
                                                                                         {.reduction = {opts}});
      for (int s = 0; s < 3; ++s) {
        Tensor<float> const x = test::rows(data.x, (s * n + comm.rank()) * 4, 4);
        Tensor<float> const y = test::rows(data.y, (s * n + comm.rank()) * 4, 4);
        ddp.parameters().zero_grad();
        backward(mse_loss(ddp(Var(x)), y));
        auto const all = test::gathered_local_grads(comm, plain, plain_params, x, y);
        std::size_t k = 0;
        for (auto const& e : ddp.parameters().entries())
          for (std::int64_t i = 0; i < e.numel; ++i, ++k) {
            double mean = 0;
            for (auto const& g : all) mean += g[k] / n;
            diff[comm.rank()] =
                std::max(diff[comm.rank()], std::abs(ddp.parameters().grads().data()[e.offset + i] - mean));
          }
      }
    });
    CAPTURE(diff[0]);
    for (double d : diff) CHECK(d <= 1e-5);
  }
}

TEST_CASE("PowerSGD: 30 steps train close to the float run") {
  for (int n : {1, 2, 4}) {
    std::vector<double> diff(n);
    spawn(n, [&](ThreadsBackend& comm) {
      diff[comm.rank()] =
          test::compressed_training(comm, PowerSgd{{.rank = 2, .warmup_steps = 5, .min_compression_rate = 1.0}}, 0.1);
    });
    CAPTURE(n);
    CAPTURE(diff[0]);
    for (int r = 0; r < n; ++r) CHECK(diff[r] == diff[0]);  // the same weights on every rank
    if (n == 1)
      CHECK(diff[0] == 0);  // nothing travels on one rank, so nothing is compressed
    else
      CHECK(diff[0] > 0);
  }
}

TEST_CASE("PowerSGD: bad options are an ArgumentError naming the option, on every rank") {
  auto refuse = [](PowerSgdOptions opts, std::string const& what) {
    spawn(2, [&](ThreadsBackend& comm) {
      auto model = test::make_mlp(8, 32, 4, 1);
      using D = DistributedDataParallel<decltype(model), ThreadsBackend, SizeCapped, PowerSgd>;
      try {
        D ddp(model, comm, {}, {.reduction = {opts}});
        FAIL("accepted");
      } catch (ArgumentError const& e) {
        CHECK(std::string(e.what()).find(what) != std::string::npos);
      }
    });
  };
  refuse({.rank = 0}, "rank must be at least 1, got 0");
  refuse({.warmup_steps = -1}, "warmup_steps must be >= 0");
  refuse({.min_compression_rate = 0}, "min_compression_rate must be positive");
}

TEST_CASE("PowerSgd names itself") {
  CHECK(PowerSgd{}.name() == "PowerSgd{rank=1, warmup=1000}");
  CHECK(PowerSgd{{.rank = 4, .warmup_steps = 0, .error_feedback = false}}.name() ==
        "PowerSgd{rank=4, warmup=0, no error feedback}");
}
