// StoreMembership (include/ddp/comm/rendezvous/store_membership.hpp): how the survivors of an elastic generation agree
// on the next through the job's store. Ranks are threads sharing a LocalStore. Covers: the survivors form at once when
// every rank has asked or is known lost; a rank a peer judged silent but that is alive (it broke at another
// collective: broken_key) is waited for, not left out (the CI failure of 2026-12-02: a healthy rank dropped); a rank
// that asks after the deadline is left out with an error saying how the others formed; below the minimum every
// survivor gets the same error; a rank's own failure counts it lost even when it broke first. Growth: a process that
// joins is admitted when the ranks regroup for it, after the survivors, up to the maximum; one whose identity differs is
// refused naming the item; one not admitted in time withdraws (never admitted afterwards); one asking a job that ended
// is told so; below the minimum the forming rank waits for a joiner up to join_timeout.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/rendezvous/store.hpp"
#include "ddp/comm/rendezvous/store_membership.hpp"

namespace {

using namespace std::chrono_literals;
using ddp::PeerState;
using ddp::PeerStatus;
using ddp::detail::StoreMembership;
using Formation = StoreMembership::Formation;
using ddp::JobIdentity;

PeerStatus ended(int rank, std::string reason = "its connection closed") {
  return {.rank = rank, .state = PeerState::kEnded, .seen_by = 0, .seq = 7, .reason = std::move(reason)};
}

// Regroup of generation 0 on a thread of its own, after `delay`.
std::future<Formation> ask(StoreMembership& m, int rank, int n, std::vector<PeerStatus> known,
                           std::chrono::milliseconds delay = 0ms) {
  return std::async(std::launch::async, [&m, rank, n, known = std::move(known), delay] {
    std::this_thread::sleep_for(delay);
    return m.regroup(0, rank, n, known);
  });
}

}  // namespace

TEST_CASE("the survivors form at once when every rank has asked or is known lost") {
  auto store = std::make_shared<ddp::LocalStore>();
  StoreMembership m(store, {.min_world_size = 1, .regroup_timeout = 10s});
  auto const t0 = std::chrono::steady_clock::now();
  auto a = ask(m, 0, 4, {ended(2)});
  auto b = ask(m, 1, 4, {});
  auto c = ask(m, 3, 4, {ended(2)});
  auto const fa = a.get(), fb = b.get(), fc = c.get();
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);  // not the 10 s deadline
  CHECK(fa.members == std::vector<int>{0, 1, 3});
  CHECK(fa.world_size == 3);
  CHECK(fa.rank == 0);
  CHECK(fb.rank == 1);
  CHECK(fc.rank == 2);
  REQUIRE(fa.lost.size() == 1);
  CHECK(fa.lost[0].rank == 2);
  CHECK(fa.lost[0].state == PeerState::kEnded);
}

TEST_CASE("a rank judged silent by a peer but alive (broken at another collective) is waited for, not left out") {
  auto store = std::make_shared<ddp::LocalStore>();
  StoreMembership m(store, {.min_world_size = 1, .regroup_timeout = 10s});
  // Rank 1's collective failed a collective behind rank 3's: rank 3 saw no failure post of rank 1 for its own
  // collective and judged it ended. Rank 1 set broken_key as it started handling its failure; it asks late.
  store->set(ddp::detail::broken_key(1), {'1'});
  auto a = ask(m, 0, 4, {ended(2)});
  auto c = ask(m, 3, 4, {ended(2), ended(1, "connection closed, no failure reported")});
  auto b = ask(m, 1, 4, {ended(2)}, 300ms);
  auto const fa = a.get(), fb = b.get(), fc = c.get();
  CHECK(fa.members == std::vector<int>{0, 1, 3});
  CHECK(fb.members == fa.members);
  CHECK(fc.members == fa.members);
  CHECK(fb.rank == 1);
}

TEST_CASE("without the broken key, a rank judged ended is counted lost at once") {
  auto store = std::make_shared<ddp::LocalStore>();
  StoreMembership m(store, {.min_world_size = 1, .regroup_timeout = 10s});
  auto const t0 = std::chrono::steady_clock::now();
  auto a = ask(m, 0, 3, {ended(2), ended(1)});
  auto const fa = a.get();
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(fa.members == std::vector<int>{0});
  CHECK(fa.lost.size() == 2);
}

TEST_CASE("a rank asking after the others formed is left out, told how they formed") {
  auto store = std::make_shared<ddp::LocalStore>();
  StoreMembership m(store, {.min_world_size = 1, .regroup_timeout = 200ms});
  auto a = ask(m, 0, 3, {});
  auto b = ask(m, 1, 3, {});
  auto const fa = a.get();
  b.get();
  CHECK(fa.members == std::vector<int>{0, 1});
  REQUIRE(fa.lost.size() == 1);
  CHECK(fa.lost[0].rank == 2);
  CHECK(fa.lost[0].state == PeerState::kStalled);
  CHECK(fa.lost[0].reason.find("did not ask to regroup within") != std::string::npos);
  auto late = ask(m, 2, 3, {});
  try {
    late.get();
    FAIL("rank 2 was admitted after the generation formed");
  } catch (ddp::CommError const& e) {
    std::string const what = e.what();
    CHECK(what.find("rank 2 of generation 0 was left out of generation 1") != std::string::npos);
    CHECK(what.find("at its deadline") != std::string::npos);
  }
}

TEST_CASE("below the minimum every survivor gets the same error, naming the rank lost") {
  auto store = std::make_shared<ddp::LocalStore>();
  StoreMembership m(store, {.min_world_size = 3, .regroup_timeout = 10s});
  auto a = ask(m, 0, 3, {ended(2)});
  auto b = ask(m, 1, 3, {ended(2)});
  std::vector<std::string> errors;
  for (auto* f : {&a, &b}) try {
      f->get();
    } catch (ddp::CommError const& e) {
      errors.push_back(e.what());
    }
  REQUIRE(errors.size() == 2);
  CHECK(errors[0] == errors[1]);
  CHECK(errors[0].find(
            "lost rank 2 (ended: its connection closed); the 2 left are fewer than the minimum world size 3") !=
        std::string::npos);
}

TEST_CASE("a rank that broke and then failed on its own is counted lost without waiting") {
  auto store = std::make_shared<ddp::LocalStore>();
  StoreMembership m(store, {.min_world_size = 1, .regroup_timeout = 10s});
  store->set(ddp::detail::broken_key(1), {'1'});
  m.post_failed(0, 1, "std::bad_alloc");
  auto const t0 = std::chrono::steady_clock::now();
  auto a = ask(m, 0, 2, {});
  auto const fa = a.get();
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(fa.members == std::vector<int>{0});
  REQUIRE(fa.lost.size() == 1);
  CHECK(fa.lost[0].state == PeerState::kFailed);
  CHECK(fa.lost[0].reason == "std::bad_alloc");
}

namespace {
JobIdentity const kJob{{"binary", "b1"}, {"model", "6 tensors"}, {"flag --lr", "0.01"}};
ddp::detail::StoreMembershipOptions growing(int min, int max, std::chrono::milliseconds join_timeout = 0ms) {
  return {.min_world_size = min, .max_world_size = max, .regroup_timeout = 10s, .join_timeout = join_timeout};
}
}  // namespace

TEST_CASE("a joiner is admitted after the survivors when the ranks regroup for it, up to the maximum") {
  auto store = std::make_shared<ddp::LocalStore>();
  StoreMembership m(store, growing(1, 4));
  m.publish(kJob, 3);
  CHECK(m.pending() == 0);
  StoreMembership j1(store, {}), j2(store, {});
  auto first = std::async(std::launch::async, [&] { return j1.join(kJob, 10s); });
  while (m.pending() < 1) std::this_thread::sleep_for(1ms);
  auto second = std::async(std::launch::async, [&] { return j2.join(kJob, 300ms); });
  while (m.pending() < 2) std::this_thread::sleep_for(1ms);
  // The ranks of generation 0 (3 of them) regroup with no loss: one joiner fits under the maximum of 4.
  auto a = ask(m, 0, 3, {});
  auto b = ask(m, 1, 3, {});
  auto c = ask(m, 2, 3, {});
  auto const fa = a.get(), fc = c.get();
  b.get();
  CHECK(fa.members == std::vector<int>{0, 1, 2});
  CHECK(fa.joined == std::vector<int>{3});
  CHECK(fa.world_size == 4);
  CHECK(fa.lost.empty());
  CHECK(fc.rank == 2);
  auto const admitted = first.get();
  CHECK(admitted.generation == 1);
  CHECK(admitted.id == 3);  // the first world size plus its ticket
  CHECK(admitted.formation.rank == 3);
  CHECK(admitted.formation.world_size == 4);
  CHECK(admitted.formation.joined == std::vector<int>{3});
  CHECK(j1.options().max_world_size == 4);  // the job's bounds, taken by the joiner
  // The second found no room and withdrew at its deadline; it stays withdrawn.
  try {
    second.get();
    FAIL("the second joiner was admitted past the maximum");
  } catch (ddp::CommError const& e) {
    CHECK(std::string(e.what()).find("was not admitted within 0.3 s (ticket 1)") != std::string::npos);
  }
  CHECK(m.pending() == 1);  // ticket 1, withdrawn, not yet passed over
}

TEST_CASE("a joiner whose identity differs is refused, naming what differs") {
  auto store = std::make_shared<ddp::LocalStore>();
  StoreMembership m(store, growing(1, 4));
  m.publish(kJob, 2);
  auto refused = [&](JobIdentity const& mine) {
    StoreMembership j(store, {});
    try {
      j.join(mine, 1s);
    } catch (ddp::ArgumentError const& e) {
      return std::string(e.what());
    }
    return std::string("admitted");
  };
  CHECK(refused({{"binary", "b2"}, {"model", "6 tensors"}, {"flag --lr", "0.01"}})
            .find("this process's binary is 'b2', the job's is 'b1'") != std::string::npos);
  CHECK(refused({{"binary", "b1"}, {"model", "8 tensors"}, {"flag --lr", "0.01"}})
            .find("this process's model is '8 tensors', the job's is '6 tensors'") != std::string::npos);
  CHECK(refused({{"binary", "b1"}, {"model", "6 tensors"}, {"flag --lr", "0.1"}})
            .find("this process's flag --lr is '0.1', the job's is '0.01'") != std::string::npos);
  CHECK(refused({{"binary", "b1"}, {"model", "6 tensors"}}).find("the job has a flag --lr ('0.01')") !=
        std::string::npos);
  CHECK(m.pending() == 0);  // none of them took a ticket
}

TEST_CASE("a joiner of a job that admits none, or that ended, is told so") {
  auto store = std::make_shared<ddp::LocalStore>();
  StoreMembership m(store, growing(1, 0));
  m.publish(kJob, 2);
  StoreMembership j(store, {});
  CHECK_THROWS_WITH_AS(j.join(kJob, 1s), doctest::Contains("it admits no joiners (it started at 2 ranks"),
                       ddp::ArgumentError);
  auto other = std::make_shared<ddp::LocalStore>();
  StoreMembership g(other, growing(1, 4));
  g.publish(kJob, 2);
  StoreMembership waiting(other, {});
  auto joiner = std::async(std::launch::async, [&] { return waiting.join(kJob, 10s); });
  while (g.pending() < 1) std::this_thread::sleep_for(1ms);
  g.post_ended();
  CHECK_THROWS_WITH_AS(joiner.get(), doctest::Contains("ended before it admitted this process (ticket 0)"),
                       ddp::CommError);
}

TEST_CASE("below the minimum the forming rank waits up to join_timeout for a joiner, which takes the lost place") {
  auto store = std::make_shared<ddp::LocalStore>();
  StoreMembership m(store, growing(3, 3, 5s));
  m.publish(kJob, 3);
  auto a = ask(m, 0, 3, {ended(2)});
  auto b = ask(m, 1, 3, {ended(2)});
  std::this_thread::sleep_for(100ms);
  StoreMembership j(store, {});
  auto const admitted = j.join(kJob, 10s);
  auto const fa = a.get();
  b.get();
  CHECK(fa.members == std::vector<int>{0, 1});
  CHECK(fa.joined == std::vector<int>{2});
  CHECK(fa.world_size == 3);
  REQUIRE(fa.lost.size() == 1);
  CHECK(fa.lost[0].rank == 2);
  CHECK(admitted.formation.rank == 2);
  CHECK(admitted.formation.lost.size() == 1);
  // With no joiner, the wait ends at join_timeout with the minimum's error, saying so.
  auto store2 = std::make_shared<ddp::LocalStore>();
  StoreMembership m2(store2, growing(2, 2, 200ms));
  m2.publish(kJob, 2);
  auto const t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(m2.regroup(0, 0, 2, {ended(1)}),
                       doctest::Contains("the 1 left are fewer than the minimum world size 2, and no process joined "
                                         "within 0.2 s"),
                       ddp::CommError);
  CHECK(std::chrono::steady_clock::now() - t0 >= 200ms);
}
