// basic_trainer's stages for real jobs: a global batch, an epoch started part-way (mid-epoch resume), per-step
// hooks with early stop, train-loss counts over ranks, the optimizer-step timeline span; and resume_position.
#include <doctest/doctest.h>

#include <sstream>

#include "ddp/ddp.hpp"
#include "test/train/testing.hpp"

using namespace ddp;

namespace {
using test::blobs;
using Model = decltype(test::make_blobs_model());
using Trainer = basic_trainer<Model, ThreadsBackend, optim::AdamW>;
auto const ce = [](Var const& out, auto const& batch) { return cross_entropy(out, batch.y); };

std::vector<float> weights(Trainer& t) {
  std::vector<float> w;
  for (auto const& p : t.ddp().parameters().entries())
    w.insert(w.end(), p.var.value().data(), p.var.value().data() + p.numel);
  return w;
}
}  // namespace

TEST_CASE("global_batch: each rank takes global / world; one that does not divide is an error naming both") {
  auto data = blobs(100, 1);
  spawn(4, [&](ThreadsBackend& comm) {
    auto m = test::make_blobs_model();
    Trainer t(m, comm, {.lr = 0.01}, {.drop_last = false, .global_batch = 32});
    CHECK(t.batch_size() == 8);
    CHECK(t.global_batch() == 32);
    CHECK(t.steps_per_epoch(data) == 4);  // 25 samples per rank: 8, 8, 8, 1
    auto const r = t.fit_epoch(data, EpochStart{}, ce, {});
    CHECK(r.steps == 4);
    CHECK(r.complete());
    CHECK(r.train.total == 100);  // every rank's samples, the last short batch included
  });
  spawn(3, [&](ThreadsBackend& comm) {
    auto m = test::make_blobs_model();
    CHECK_THROWS_WITH_AS(Trainer(m, comm, {.lr = 0.01}, {.global_batch = 32}),
                         "trainer: global batch 32 must be a multiple of the world size 3 (each rank takes global "
                         "batch / world size)",
                         ArgumentError);
  });
}

TEST_CASE("hooks see the position before and after each step; kStop ends the epoch after that step") {
  auto data = blobs(96, 2);
  std::vector<std::string> seen(2);
  spawn(2, [&](ThreadsBackend& comm) {
    auto m = test::make_blobs_model();
    Trainer t(m, comm, {.lr = 0.01}, {.batch_size = 8});
    std::ostringstream os;
    StepHooks const hooks{
        .before_step = [&](StepPosition const& p) { os << "b" << p.step << "/" << p.global_step << " "; },
        .after_step =
            [&](StepPosition const& p, double) {
              os << "a" << p.step << "/" << p.global_step << " ";
              return p.global_step == 12 ? StepControl::kStop : StepControl::kContinue;
            }};
    auto const r = t.fit_epoch(data, EpochStart{.epoch = 1, .step = 2, .global_step = 10}, ce, hooks);
    CHECK(r.stopped);
    CHECK(!r.complete());
    CHECK(r.steps == 2);
    CHECK(r.end_step == 4);
    CHECK(r.steps_in_epoch == 6);
    CHECK(r.global_step == 12);
    CHECK(r.train.total == 2 * 2 * 8);
    seen[comm.rank()] = os.str();
  });
  CHECK(seen[0] == "b2/10 a3/11 b3/11 a4/12 ");
  CHECK(seen[1] == seen[0]);
}

TEST_CASE("an epoch stopped part-way and continued from its step equals the uninterrupted epoch, bitwise") {
  auto data = blobs(150, 3);
  std::vector<std::vector<float>> straight(2), resumed(2);
  std::vector<Counts> straight_counts(2), resumed_counts(2);
  spawn(2, [&](ThreadsBackend& comm) {
    int const r = comm.rank();
    auto m1 = test::make_blobs_model();
    Trainer a(m1, comm, {.lr = 0.01}, {.seed = 5, .drop_last = false, .global_batch = 16});
    auto const full = a.fit_epoch(data, EpochStart{.epoch = 2, .global_step = 40}, ce, {});
    straight[r] = weights(a);
    straight_counts[r] = full.train;

    auto m2 = test::make_blobs_model();
    Trainer b(m2, comm, {.lr = 0.01}, {.seed = 5, .drop_last = false, .global_batch = 16});
    auto stop_at = [](std::int64_t g) {
      return StepHooks{.after_step = [g](StepPosition const& p, double) {
        return p.global_step == g ? StepControl::kStop : StepControl::kContinue;
      }};
    };
    auto const first = b.fit_epoch(data, EpochStart{.epoch = 2, .global_step = 40}, ce, stop_at(43));
    CHECK(first.end_step == 3);
    auto const rest =
        b.fit_epoch(data, EpochStart{.epoch = 2, .step = first.end_step, .global_step = first.global_step}, ce, {});
    CHECK(rest.complete());
    CHECK(rest.global_step == full.global_step);
    CHECK(first.steps + rest.steps == full.steps);
    resumed[r] = weights(b);
    resumed_counts[r] = rest.train;
    resumed_counts[r] += first.train;
  });
  CHECK(straight[0] == resumed[0]);
  CHECK(straight[1] == straight[0]);
  CHECK(resumed_counts[0].total == straight_counts[0].total);
  CHECK(resumed_counts[0].total == 150);
}

TEST_CASE("with DdpOptions::timeline set, every optimizer step is a span named \"optimizer step\"") {
  auto data = blobs(64, 4);
  std::vector<std::string> json(2);
  spawn(2, [&](ThreadsBackend& comm) {
    Timeline tl(comm.rank());
    auto m = test::make_blobs_model();
    Trainer t(m, comm, {.lr = 0.01}, {.batch_size = 8, .ddp = {.timeline = &tl}});
    t.fit_epoch(data, {.epoch = 0}, ce);
    std::ostringstream os;
    tl.write_json(os);
    json[comm.rank()] = os.str();
  });
  std::size_t n = 0;
  for (std::size_t at = json[0].find("\"name\":\"optimizer step\""); at != std::string::npos;
       at = json[0].find("\"name\":\"optimizer step\"", at + 1))
    ++n;
  CHECK(n == 4);
}

TEST_CASE("resume_position: mid-epoch needs the same global batch and seed; the world size may change") {
  TrainPosition const saved{
      .epoch = 1, .step = 8, .global_step = 40, .scheduler_epoch = 39, .world_size = 2, .global_batch = 64, .seed = 1};
  auto const p = resume_position(saved, {.world_size = 4, .global_batch = 64, .seed = 1}, "mid.ckpt");
  CHECK(p == TrainPosition{.epoch = 1,
                           .step = 8,
                           .global_step = 40,
                           .scheduler_epoch = 39,
                           .world_size = 4,
                           .global_batch = 64,
                           .seed = 1});
  CHECK_THROWS_WITH_AS(resume_position(saved, {.world_size = 2, .global_batch = 32, .seed = 1}, "mid.ckpt"),
                       "checkpoint mid.ckpt was taken at step 8 of an epoch with global batch 64 and seed 1; resuming "
                       "mid-epoch needs the same two (this run: 32, 1)",
                       ArgumentError);
  CHECK_THROWS_AS(resume_position(saved, {.world_size = 2, .global_batch = 64, .seed = 2}, "mid.ckpt"), ArgumentError);
  TrainPosition boundary = saved;
  boundary.step = 0;
  auto const q = resume_position(boundary, {.world_size = 3, .global_batch = 30, .seed = 9}, "end.ckpt");
  CHECK(q.global_batch == 30);
  CHECK(q.seed == 9);
  CHECK(q.world_size == 3);
  CHECK(q.global_step == 40);
}
