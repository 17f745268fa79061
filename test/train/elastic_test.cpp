// In-place shrink on threads (train/elastic.hpp): a rank that throws std::bad_alloc, or stalls past the deadline, is
// dropped; the others go on at N-1 from the interrupted step's start, kept in memory, and end with bitwise the weights
// of the run that never lost a rank (deterministic mode). Several losses in a row; below the minimum world size every
// survivor gets the same error, naming what was lost.
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/ddp.hpp"
#include "test/train/testing.hpp"

using namespace ddp;
using namespace std::chrono_literals;

namespace elastic_test {

using Model = decltype(test::make_blobs_model());
using Trainer = basic_trainer<Model, ThreadsBackend, optim::AdamW, SizeCapped, ExactSum, MicroBatches>;

inline Trainer make_trainer(Model& m, ThreadsBackend& comm) {
  // 12 micro-batches of one sample: the same bits at 1, 2, 3, 4, 6 and 12 ranks. 103 samples: 8 steps an epoch.
  return Trainer(m, comm, {.lr = 0.01}, {.seed = 3, .global_batch = 12}, {.batching = {.count = 12}});
}

inline std::vector<float> weights(Trainer& t) {
  std::vector<float> v;
  for (auto const& p : t.ddp().parameters().entries())
    v.insert(v.end(), p.var.value().data(), p.var.value().data() + p.numel);
  return v;
}

// Two epochs; before each step `fault(first_rank, global_step)` may throw or stall, then the state is kept and
// joiners are admitted (elastic_step). Every
// rank that finishes writes its weights into `out[first_rank]`, and the steps its last generation ran into `ran`
// (a resumption that started over would train every step again, and end with the same bits in deterministic mode).
inline std::vector<std::int64_t> ran(5);
// [first_rank]: the changes its fit_epoch results listed, every generation's, as (epoch, step, world size after).
inline std::vector<std::vector<std::array<std::int64_t, 3>>> listed(5);
template <class Fault>
void train(ThreadsBackend& comm, ElasticSession& session, std::vector<std::vector<float>>& out, Fault const& fault) {
  auto const data = test::blobs(103, 1);
  Model m = test::make_blobs_model();
  auto t = make_trainer(m, comm);
  TrainPosition pos;
  if (auto p = t.resume_kept(session)) pos = *p;
  std::int64_t steps = 0;
  for (std::int64_t e = pos.epoch; e < 2; ++e) {
    auto const r =
        t.fit_epoch(data, EpochStart{.epoch = e, .step = e == pos.epoch ? pos.step : 0, .global_step = pos.global_step},
                    [](Var const& o, auto const& mb) { return cross_entropy(o, mb.y); },
                    {.before_step =
                         [&](StepPosition const& p) {
                           fault(session.first_rank(), p.global_step);
                           t.elastic_step(session, p);
                           ++steps;
                         },
                     .after_step = {}});
    pos.global_step = r.global_step;
    for (auto const& c : r.membership_changes)
      listed[static_cast<std::size_t>(session.first_rank())].push_back({e, c.step, c.to_world_size});
  }
  out[static_cast<std::size_t>(session.first_rank())] = weights(t);
  ran[static_cast<std::size_t>(session.first_rank())] = steps;
}

inline std::vector<float> uninterrupted() {
  std::vector<std::vector<float>> out(4);
  auto const report =
      elastic_spawn(4, [&](ThreadsBackend& comm, ElasticSession& s) { train(comm, s, out, [](int, std::int64_t) {}); });
  CHECK(report.changes.empty());
  CHECK(report.final_world_size == 4);
  return out[0];
}

}  // namespace elastic_test

TEST_CASE("elastic: a rank that throws std::bad_alloc at step 5 is dropped; 3 ranks go on from step 5, bitwise") {
  using namespace elastic_test;
  auto const whole = uninterrupted();
  listed.assign(5, {});
  std::vector<std::vector<float>> out(4);
  std::vector<std::string> lines;
  auto const report = elastic_spawn(4,
                                    [&](ThreadsBackend& comm, ElasticSession& s) {
                                      train(comm, s, out, [](int first, std::int64_t step) {
                                        if (first == 2 && step == 5) throw std::bad_alloc();
                                      });
                                    },
                                    {.log = [&](std::string const& l) { lines.push_back(l); }});
  REQUIRE(report.changes.size() == 1);
  auto const& c = report.changes[0];
  CHECK(c.generation == 1);
  CHECK(c.from_world_size == 4);
  CHECK(c.to_world_size == 3);
  CHECK(c.step == 5);
  REQUIRE(c.lost.size() == 1);
  CHECK(c.lost[0].rank == 2);
  CHECK(c.lost[0].state == PeerState::kFailed);
  CHECK(c.lost[0].reason.find("bad_alloc") != std::string::npos);
  REQUIRE(lines.size() == 1);
  CAPTURE(lines[0]);
  CHECK(lines[0].starts_with("ddp elastic: rank 2 lost at step 5 (it failed: "));
  CHECK(lines[0].find("); continuing at world size 3 from step 5 after ") != std::string::npos);
  CHECK(report.final_world_size == 3);
  CHECK(out[2].empty());
  for (int r : {0, 1, 3}) CHECK(out[static_cast<std::size_t>(r)] == whole);
  CHECK(ran[0] == 16 - 5);  // generation 1 trained steps 5..15 only
  // basic_trainer's epoch results list the change in the epoch it resumed (epoch 0 of 8 steps), on every survivor.
  for (int r : {0, 1, 3})
    CHECK(listed[static_cast<std::size_t>(r)] == std::vector<std::array<std::int64_t, 3>>{{0, 5, 3}});
}

TEST_CASE("elastic: two losses in a row, 4 -> 3 -> 2, and a rank stalled past the deadline, bitwise") {
  using namespace elastic_test;
  auto const whole = uninterrupted();
  {
    listed.assign(5, {});
    std::vector<std::vector<float>> out(4);
    auto const report = elastic_spawn(4,
                                      [&](ThreadsBackend& comm, ElasticSession& s) {
                                        train(comm, s, out, [](int first, std::int64_t step) {
                                          if ((first == 2 && step == 3) || (first == 0 && step == 10))
                                            throw std::bad_alloc();
                                        });
                                      },
                                      {.log = [](std::string const&) {}});
    REQUIRE(report.changes.size() == 2);
    CHECK(report.changes[0].step == 3);
    CHECK(report.changes[0].lost[0].rank == 2);
    CHECK(report.changes[1].step == 10);
    CHECK(report.changes[1].from_world_size == 3);
    CHECK(report.changes[1].lost[0].rank == 0);  // first rank 0 was rank 0 of generation 1 too
    CHECK(report.final_world_size == 2);
    CHECK(out[1] == whole);
    CHECK(out[3] == whole);
    CHECK(ran[1] == 16 - 10);
    // Each epoch's result lists the change that resumed in it (steps 0-7 are epoch 0, 8-15 epoch 1): epoch 0's in
    // generation 1, epoch 1's in generation 2.
    CHECK(listed[3] == std::vector<std::array<std::int64_t, 3>>{{0, 3, 3}, {1, 10, 2}});
  }
  {  // Rank 1 sleeps through the collective deadline (0.3 s) and the regroup's (0.3 s): it is left out.
    std::vector<std::vector<float>> out(4);
    auto const report = elastic_spawn(
        4,
        [&](ThreadsBackend& comm, ElasticSession& s) {
          train(comm, s, out, [&](int first, std::int64_t step) {
            if (first == 1 && step == 4 && s.generation() == 0) std::this_thread::sleep_for(1500ms);
          });
        },
        {.regroup_timeout = 300ms, .threads = {.timeout = {.after = 300ms}}, .log = [](std::string const&) {}});
    REQUIRE(report.changes.size() == 1);
    CHECK(report.changes[0].step == 4);
    REQUIRE(report.changes[0].lost.size() == 1);
    CHECK(report.changes[0].lost[0].rank == 1);
    CHECK(report.changes[0].lost[0].state == PeerState::kStalled);
    CHECK(out[1].empty());
    for (int r : {0, 2, 3}) CHECK(out[static_cast<std::size_t>(r)] == whole);
  }
}

TEST_CASE("elastic: below the minimum world size every survivor ends with the same error, naming the rank lost") {
  using namespace elastic_test;
  std::vector<std::vector<float>> out(2);
  CHECK_THROWS_WITH_AS(elastic_spawn(2,
                                     [&](ThreadsBackend& comm, ElasticSession& s) {
                                       train(comm, s, out, [](int first, std::int64_t step) {
                                         if (first == 1 && step == 2) throw std::bad_alloc();
                                       });
                                     },
                                     {.min_world_size = 2}),
                       doctest::Contains("lost rank 1 (failed: std::bad_alloc"), CommError);
  CHECK_THROWS_WITH_AS(elastic_spawn(2, [](ThreadsBackend&, ElasticSession&) {}, {.min_world_size = 3}),
                       doctest::Contains("min_world_size must be in [1, 2]"), ArgumentError);
}

TEST_CASE("elastic: a rank added at a step boundary joins 3 -> 4, bitwise; then 4 -> 3 -> 2 -> 3") {
  using namespace elastic_test;
  auto const whole = uninterrupted();
  {
    listed.assign(5, {});
    std::vector<std::vector<float>> out(4);
    std::atomic<bool> reached{false};
    std::vector<std::string> lines;
    ElasticThreads job(3,
                       [&](ThreadsBackend& comm, ElasticSession& s) {
                         train(comm, s, out, [&](int first, std::int64_t step) {
                           if (first != 0 || step != 6 || s.generation() != 0) return;
                           reached = true;  // hold step 6 until the joiner has asked: it is admitted exactly there
                           while (s.joiners_waiting() == 0) std::this_thread::sleep_for(1ms);
                         });
                       },
                       {.max_world_size = 4, .log = [&](std::string const& l) { lines.push_back(l); }});
    while (!reached) std::this_thread::sleep_for(1ms);
    CHECK(job.add_rank() == 3);
    auto const report = job.wait();
    REQUIRE(report.changes.size() == 1);
    auto const& c = report.changes[0];
    CHECK(c.from_world_size == 3);
    CHECK(c.to_world_size == 4);
    CHECK(c.lost.empty());
    CHECK(c.joined == std::vector<int>{3});
    CHECK(c.step == 6);
    REQUIRE(lines.size() == 1);
    CAPTURE(lines[0]);
    CHECK(lines[0].starts_with("ddp elastic: rank 3 joined at step 6; continuing at world size 4 from step 6 after "));
    CHECK(report.final_world_size == 4);
    for (int r : {0, 1, 2, 3}) CHECK(out[static_cast<std::size_t>(r)] == whole);
    CHECK(ran[3] == 16 - 6);  // the joiner trained from step 6 on
  }
  {
    std::vector<std::vector<float>> out(5);
    std::atomic<bool> reached{false};
    ElasticThreads job(4,
                       [&](ThreadsBackend& comm, ElasticSession& s) {
                         train(comm, s, out, [&](int first, std::int64_t step) {
                           if ((first == 2 && step == 3) || (first == 0 && step == 7)) throw std::bad_alloc();
                           if (first == 1 && step == 10 && s.generation() == 2) {
                             reached = true;
                             while (s.joiners_waiting() == 0) std::this_thread::sleep_for(1ms);
                           }
                         });
                       },
                       {.max_world_size = 4, .log = [](std::string const&) {}});
    while (!reached) std::this_thread::sleep_for(1ms);
    CHECK(job.add_rank() == 4);
    auto const report = job.wait();
    REQUIRE(report.changes.size() == 3);
    CHECK(report.changes[0].to_world_size == 3);
    CHECK(report.changes[1].to_world_size == 2);
    CHECK(report.changes[2].from_world_size == 2);
    CHECK(report.changes[2].to_world_size == 3);
    CHECK(report.changes[2].joined == std::vector<int>{2});
    CHECK(report.changes[2].step == 10);
    CHECK(report.final_world_size == 3);
    for (int r : {1, 3, 4}) CHECK(out[static_cast<std::size_t>(r)] == whole);
    CHECK(ran[4] == 16 - 10);
  }
}

TEST_CASE("elastic: a rank that asks to join a job that ends first is told so, by name") {
  using namespace elastic_test;
  std::vector<std::vector<float>> out(4);
  ElasticThreads job(2,
                     [&](ThreadsBackend& comm, ElasticSession& s) { train(comm, s, out, [](int, std::int64_t) {}); });
  (void)job.add_rank();            // no growth allowed (max_world_size 0: the starting 2): never admitted
  auto const report = job.wait();  // the job itself finished
  CHECK(report.final_world_size == 2);
  REQUIRE(report.not_admitted.size() == 1);
  CHECK(report.not_admitted[0].find("rank 2 asked to join, but the job ended before the next step boundary") !=
        std::string::npos);
}

TEST_CASE("elastic: below the minimum the survivors wait for a joiner up to join_timeout, then go on, bitwise") {
  using namespace elastic_test;
  auto const whole = uninterrupted();
  std::vector<std::vector<float>> out(4);
  std::atomic<bool> failed{false};
  std::vector<std::string> lines;
  // 3 ranks, at least 3: rank 2 fails at step 5; a rank added after the failure takes its place.
  ElasticThreads job(
      3,
      [&](ThreadsBackend& comm, ElasticSession& s) {
        train(comm, s, out, [&](int first, std::int64_t step) {
          if (first == 2 && step == 5) {
            failed = true;
            throw std::bad_alloc();
          }
        });
      },
      {.min_world_size = 3, .join_timeout = 20s, .log = [&](std::string const& l) { lines.push_back(l); }});
  while (!failed) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(50ms);  // (the survivors are regrouping, below the minimum, when it asks)
  CHECK(job.add_rank() == 3);
  auto const report = job.wait();
  REQUIRE(report.changes.size() == 1);
  auto const& c = report.changes[0];
  CHECK(c.from_world_size == 3);
  CHECK(c.to_world_size == 3);
  REQUIRE(c.lost.size() == 1);
  CHECK(c.lost[0].rank == 2);
  CHECK(c.joined == std::vector<int>{2});
  CHECK(c.step == 5);
  REQUIRE(lines.size() == 1);
  CAPTURE(lines[0]);
  CHECK(
      lines[0].starts_with("ddp elastic: rank 2 lost at step 5 (it failed: std::bad_alloc); rank 2 joined; "
                           "continuing at world size 3 from step 5 after "));
  for (int r : {0, 1, 3}) CHECK(out[static_cast<std::size_t>(r)] == whole);
  CHECK(ran[3] == 16 - 5);  // the joiner trained from step 5 on
}

TEST_CASE("elastic: below the minimum with no joiner, every survivor ends after join_timeout, saying so") {
  using namespace elastic_test;
  std::vector<std::vector<float>> out(2);
  auto const t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(elastic_spawn(2,
                                     [&](ThreadsBackend& comm, ElasticSession& s) {
                                       train(comm, s, out, [](int first, std::int64_t step) {
                                         if (first == 1 && step == 2) throw std::bad_alloc();
                                       });
                                     },
                                     {.min_world_size = 2, .join_timeout = 200ms}),
                       doctest::Contains("the 1 left are fewer than the minimum world size 2, and no rank joined "
                                         "within 0.2 s"),
                       CommError);
  CHECK(std::chrono::steady_clock::now() - t0 >= 200ms);
  CHECK_THROWS_WITH_AS(elastic_spawn(2, [](ThreadsBackend&, ElasticSession&) {}, {.join_timeout = -1ms}),
                       doctest::Contains("join_timeout must not be negative"), ArgumentError);
}
