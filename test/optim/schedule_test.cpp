// optim::Schedule: the run-time schedule choice (none, step per epoch, cosine and warm-up + cosine per step), its
// counter and restore.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>

#include "ddp/ddp.hpp"

using namespace ddp;

namespace {
struct ScheduleSetup {
  Var w{from_values<float>({2}, {0.5f, -1.0f}), RequiresGrad::kYes};
  nn::ParameterArena<float> arena{std::vector<nn::NamedParameter<float, HostSpace>>{{"w", w}}};
};
}  // namespace

TEST_CASE("schedule names parse and print; an unknown one is an error naming it") {
  for (auto k : {optim::ScheduleKind::kNone, optim::ScheduleKind::kStep, optim::ScheduleKind::kCosine,
                 optim::ScheduleKind::kWarmupCosine})
    CHECK(optim::parse_schedule_kind(optim::schedule_name(k)) == k);
  CHECK(optim::schedule_name(optim::ScheduleKind::kCosine) == "cosine");
  CHECK_THROWS_WITH_AS(optim::parse_schedule_kind("linear"),
                       "schedule must be one of none|step|cosine|warmup-cosine, got 'linear'", ArgumentError);
}

TEST_CASE("none leaves the lr alone and keeps counter 0") {
  ScheduleSetup s;
  optim::SGD opt(s.arena, {.lr = 0.3});
  optim::Schedule sched(opt, {.kind = optim::ScheduleKind::kNone});
  sched.start_step(7);
  sched.end_epoch(3);
  sched.restore(5);
  CHECK(opt.lr() == 0.3);
  CHECK(sched.counter() == 0);
  CHECK(sched.name() == "none");
}

TEST_CASE("step moves once per epoch (not per step), as StepLR's closed form") {
  ScheduleSetup s;
  optim::SGD opt(s.arena, {.lr = 1.0});
  optim::Schedule sched(opt, {.kind = optim::ScheduleKind::kStep, .step = {.step_size = 1, .gamma = 0.7}});
  sched.start_step(100);
  CHECK(opt.lr() == 1.0);
  sched.end_epoch(1);
  CHECK(opt.lr() == 0.7);
  sched.end_epoch(2);
  CHECK(opt.lr() == std::pow(0.7, 2.0));
  CHECK(sched.counter() == 2);
}

TEST_CASE("cosine moves before every step (its counter is the global step) and ignores epoch ends") {
  ScheduleSetup s;
  optim::SGD opt(s.arena, {.lr = 0.1});
  optim::Schedule sched(opt, {.kind = optim::ScheduleKind::kCosine, .cosine = {.t_max = 4}});
  sched.start_step(2);
  CHECK(opt.lr() == doctest::Approx(0.05));
  sched.end_epoch(1);
  CHECK(opt.lr() == doctest::Approx(0.05));
  CHECK(sched.counter() == 2);
  sched.start_step(3);
  CHECK(opt.lr() == 0.1 * (1 + std::cos(std::numbers::pi * 3.0 / 4.0)) / 2);
}

TEST_CASE("restore(counter) gives a new schedule the lr and counter of the one that saved it, bitwise") {
  for (auto kind : {optim::ScheduleKind::kStep, optim::ScheduleKind::kCosine}) {
    CAPTURE(optim::schedule_name(kind));
    optim::ScheduleOptions const o{.kind = kind, .step = {.gamma = 0.7}, .cosine = {.t_max = 50}};
    ScheduleSetup s;
    optim::SGD a(s.arena, {.lr = 0.01}), b(s.arena, {.lr = 0.01});
    optim::Schedule first(a, o);
    for (int e = 0; e < 3; ++e) {
      for (int k = 0; k < 10; ++k) first.start_step(e * 10 + k);
      first.end_epoch(e + 1);
    }
    optim::Schedule resumed(b, o);
    resumed.restore(first.counter());
    CHECK(resumed.counter() == first.counter());
    CHECK(b.lr() == a.lr());
    first.start_step(30);
    resumed.start_step(30);
    CHECK(b.lr() == a.lr());
  }
}

TEST_CASE("only the chosen kind's options are checked") {
  ScheduleSetup s;
  optim::SGD opt(s.arena, {.lr = 0.1});
  CHECK_NOTHROW(optim::Schedule(opt, {.kind = optim::ScheduleKind::kStep, .cosine = {.t_max = 0}}));
  CHECK_THROWS_AS(optim::Schedule(opt, {.kind = optim::ScheduleKind::kCosine, .cosine = {.t_max = 0}}), ArgumentError);
  CHECK_THROWS_AS(optim::Schedule(opt, {.kind = optim::ScheduleKind::kStep, .step = {.step_size = 0}}), ArgumentError);
  optim::Schedule sched(opt, {.kind = optim::ScheduleKind::kStep});
  CHECK_THROWS_AS(sched.restore(-1), ArgumentError);
}

TEST_CASE(
    "warmup-cosine: linear warm-up to the base lr, cosine to eta_min at t_max, then eta_min; a restore is exact") {
  ScheduleSetup s;
  optim::AdamW opt(s.arena, {.lr = 1e-3});
  optim::Schedule sched(opt, {.kind = optim::ScheduleKind::kWarmupCosine,
                              .warmup_cosine = {.warmup = 100, .t_max = 2000, .eta_min = 1e-4}});
  sched.start_step(0);
  CHECK(opt.lr() == doctest::Approx(1e-5));  // (0 + 1)/100 of 1e-3
  sched.start_step(99);
  CHECK(opt.lr() == doctest::Approx(1e-3));
  sched.start_step(100);
  CHECK(opt.lr() == 1e-3);  // cos(0): exactly the base
  sched.start_step(1050);   // half way: the mean of the two
  CHECK(opt.lr() == doctest::Approx(5.5e-4));
  sched.start_step(2000);
  CHECK(opt.lr() == doctest::Approx(1e-4));
  sched.start_step(2500);
  CHECK(opt.lr() == 1e-4);
  sched.start_step(777);
  double const at = opt.lr();
  CHECK(sched.counter() == 777);
  optim::AdamW other(s.arena, {.lr = 1e-3});
  optim::Schedule again(other, {.kind = optim::ScheduleKind::kWarmupCosine,
                                .warmup_cosine = {.warmup = 100, .t_max = 2000, .eta_min = 1e-4}});
  again.restore(777);
  CHECK(other.lr() == at);
  CHECK_THROWS_WITH_AS(optim::WarmupCosineLR<optim::AdamW>(opt, {.warmup = 10, .t_max = 10}),
                       "WarmupCosineLR: t_max (10) must be past warmup (10)", ArgumentError);
}
