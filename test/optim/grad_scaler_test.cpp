// GradScaler (optim/grad_scaler.hpp): dynamic loss scaling under DistributedDataParallel on the threads backend at
// world sizes 1, 2 and 4. The scaled run is bitwise the unscaled one; an overflow on one rank skips the step on
// every rank and backs the scale off alike; the scale grows after a run of finite steps; float16 buckets keep
// tiny gradients only with it; bad options, and an optimizer that steps inside backward, are refused.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "test/parallel/ddp_cases.hpp"

using namespace ddp;

namespace {

using Ddp = DistributedDataParallel<test::Mlp, ThreadsBackend>;

// Rank r's rows of step s: 4 per rank.
Tensor<float> step_rows(Tensor<float> const& t, int s, ThreadsBackend& comm) {
  return test::rows(t, (s * comm.world_size() + comm.rank()) * 4, 4);
}

// The largest |a - b| / max|b| over the arenas' gradients (b: the reference), a divided by `a_scale` first.
double grad_rel_diff(nn::ParameterArena<float> const& a, double a_scale, nn::ParameterArena<float> const& b) {
  double worst = 0, top = 0;
  for (auto const& e : b.entries())  // the parameters' gradients only (not the buckets' status words)
    for (std::int64_t i = 0; i < e.numel; ++i) top = std::max(top, std::abs(double(b.grads().data()[e.offset + i])));
  for (std::size_t p = 0; p < b.count(); ++p) {
    auto const& e = b.entries()[p];
    for (std::int64_t i = 0; i < e.numel; ++i) {
      double const x = a.grads().data()[a.entries()[p].offset + i] / a_scale, y = b.grads().data()[e.offset + i];
      worst = std::max(worst, std::abs(x - y));
    }
  }
  return worst / top;
}

}  // namespace

TEST_CASE("GradScaler: the scaled run is bitwise the unscaled one, at world sizes 1, 2 and 4") {
  auto data = test::make_data(4 * 4 * 6, 8, 4, 21);
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    spawn(n, [&](ThreadsBackend& comm) {
      auto m1 = test::make_mlp(8, 32, 4, 3), m2 = test::make_mlp(8, 32, 4, 3);
      Ddp plain(m1, comm), scaled(m2, comm);
      optim::SGD o1(plain.parameters(), {.lr = 0.05, .momentum = 0.9}),
          o2(scaled.parameters(), {.lr = 0.05, .momentum = 0.9});
      optim::GradScaler scaler(scaled.parameters());
      for (int s = 0; s < 6; ++s) {
        auto const x = step_rows(data.x, s, comm), y = step_rows(data.y, s, comm);
        o1.zero_grad();
        backward(mse_loss(plain(Var(x)), y));
        o1.step();
        o2.zero_grad();
        backward(scaler.scale(mse_loss(scaled(Var(x)), y)));
        CHECK(scaler.step(o2));
      }
      CHECK(test::weights(scaled.parameters()) == test::weights(plain.parameters()));
      CHECK(o2.state() == o1.state());
      CHECK(scaler.get_scale() == 65536.0);
      CHECK(scaler.skipped_steps() == 0);
    });
  }
}

TEST_CASE("GradScaler: an overflow on one rank skips the step on every rank, and the scale backs off and grows") {
  auto data = test::make_data(4 * 4 * 8, 8, 4, 5);
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    spawn(n, [&](ThreadsBackend& comm) {
      auto model = test::make_mlp(8, 32, 4, 3);
      Ddp ddp(model, comm);
      optim::AdamW opt(ddp.parameters(), {.lr = 1e-2});
      optim::GradScaler scaler(ddp.parameters(), {.init_scale = 1024.0, .growth_interval = 3});
      std::vector<double> scales;
      for (int s = 0; s < 8; ++s) {
        auto x = step_rows(data.x, s, comm);
        auto const y = step_rows(data.y, s, comm);
        bool const poisoned = s == 2;  // the last rank's inputs overflow the loss: Inf/NaN after the all-reduce
        if (poisoned && comm.rank() == comm.world_size() - 1) x[0] = std::numeric_limits<float>::max();
        auto const before = test::weights(ddp.parameters());
        auto const state = opt.state();
        opt.zero_grad();
        backward(scaler.scale(mse_loss(ddp(Var(x)), y)));
        bool const stepped = scaler.step(opt);
        CHECK(stepped == !poisoned);
        if (poisoned) {
          CHECK(test::weights(ddp.parameters()) == before);  // nothing moved: weights, moments, step counts
          CHECK(opt.state() == state);
        }
        scales.push_back(scaler.get_scale());
      }
      // 1024 for steps 0-1, halved by the overflow at step 2, doubled after 3 finite steps (3, 4, 5), ...
      CHECK(scales == std::vector<double>{1024, 1024, 512, 512, 512, 1024, 1024, 1024});
      CHECK(scaler.skipped_steps() == 1);
      CHECK(scaler.state() == optim::GradScalerState{.scale = 1024, .growth_tracker = 2});
      // The same scale on every rank.
      std::vector<double> all(static_cast<std::size_t>(comm.world_size()));
      double const mine = scaler.get_scale();
      host_all_gather(comm, std::span<double const>(&mine, 1), std::span<double>(all));
      for (double v : all) CHECK(v == mine);
    });
  }
}

TEST_CASE("GradScaler: float16 buckets keep tiny gradients only with loss scaling") {
  auto data = test::make_data(4 * 2, 8, 4, 9);
  spawn(2, [&](ThreadsBackend& comm) {
    using Fp16Ddp = DistributedDataParallel<test::Mlp, ThreadsBackend, SizeCapped, Fp16AllReduce>;
    auto m0 = test::make_mlp(8, 32, 4, 3), m1 = test::make_mlp(8, 32, 4, 3), m2 = test::make_mlp(8, 32, 4, 3);
    Ddp reference(m0, comm);
    Fp16Ddp unscaled(m1, comm), scaled(m2, comm);
    optim::GradScaler scaler(scaled.parameters());
    auto const x = step_rows(data.x, 0, comm), y = step_rows(data.y, 0, comm);
    // A loss 1e-7 of the MSE: gradients near 1e-9, below float16's smallest subnormal (6e-8).
    auto tiny = [&](auto& d) { return scale(mse_loss(d(Var(x)), y), 1e-7f); };
    backward(tiny(reference));
    backward(tiny(unscaled));
    backward(scaler.scale(tiny(scaled)));
    double const without = grad_rel_diff(unscaled.parameters(), 1.0, reference.parameters());
    double const with = grad_rel_diff(scaled.parameters(), scaler.get_scale(), reference.parameters());
    CAPTURE(without);
    CAPTURE(with);
    CHECK(without > 0.5);  // flushed to zero on the wire
    CHECK(with < 2e-3);    // float16's precision, times the scale back
  });
}

TEST_CASE("GradScaler: clipping sees the unscaled gradients; bad options and in-backward optimizers are refused") {
  spawn(2, [](ThreadsBackend& comm) {
    auto data = test::make_data(8, 8, 4, 2);
    auto const x = step_rows(data.x, 0, comm), y = step_rows(data.y, 0, comm);
    auto m1 = test::make_mlp(8, 16, 4, 5), m2 = test::make_mlp(8, 16, 4, 5);
    Ddp plain(m1, comm), scaled(m2, comm);
    optim::SGD o1(plain.parameters(), {.lr = 0.1}), o2(scaled.parameters(), {.lr = 0.1});
    optim::GradScaler scaler(scaled.parameters());
    backward(mse_loss(plain(Var(x)), y));
    float const norm = nn::clip_grad_norm(plain.parameters(), 0.01);
    o1.step();
    backward(scaler.scale(mse_loss(scaled(Var(x)), y)));
    float seen = -1;
    CHECK(scaler.step(o2, [&] { seen = nn::clip_grad_norm(scaled.parameters(), 0.01); }));
    CHECK(seen == norm);
    CHECK(test::weights(scaled.parameters()) == test::weights(plain.parameters()));

    using Bad = optim::GradScalerOptions;
    CHECK_THROWS_WITH_AS(optim::GradScaler(scaled.parameters(), Bad{.init_scale = 0}),
                         doctest::Contains("init_scale must be a positive finite number"), ArgumentError);
    CHECK_THROWS_WITH_AS(optim::GradScaler(scaled.parameters(), Bad{.growth_factor = 1}),
                         doctest::Contains("growth_factor must be > 1"), ArgumentError);
    CHECK_THROWS_WITH_AS(optim::GradScaler(scaled.parameters(), Bad{.backoff_factor = 1}),
                         doctest::Contains("backoff_factor must be in (0, 1)"), ArgumentError);
    CHECK_THROWS_WITH_AS(optim::GradScaler(scaled.parameters(), Bad{.growth_interval = 0}),
                         doctest::Contains("growth_interval must be at least 1"), ArgumentError);
    CHECK_THROWS_WITH_AS(scaler.load_state({.scale = -1}), doctest::Contains("positive finite scale"), ArgumentError);

    auto m3 = test::make_mlp(8, 16, 4, 5);
    Ddp overlapped(m3, comm);
    OverlappedOptimizer<optim::SGD> ov(overlapped, {.optimizer = {.lr = 0.1}});
    optim::GradScaler ov_scaler(overlapped.parameters());
    backward(ov_scaler.scale(mse_loss(overlapped(Var(x)), y)));
    CHECK_THROWS_WITH_AS(ov_scaler.step(ov), doctest::Contains("updates each bucket as its reduction lands"),
                         ArgumentError);
  });
}
