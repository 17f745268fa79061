// StoreMembership (include/ddp/comm/rendezvous/store_membership.hpp): how the survivors of an elastic generation agree
// on the next through the job's store. Ranks are threads sharing a LocalStore. Covers: the survivors form at once when
// every rank has asked or is known lost; a rank a peer judged silent but that is alive (it broke at another
// collective: broken_key) is waited for, not left out (the CI failure of 2026-12-02: a healthy rank dropped); a rank
// that asks after the deadline is left out with an error saying how the others formed; below the minimum every
// survivor gets the same error; a rank's own failure counts it lost even when it broke first.
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
  StoreMembership m(store, 1, 10s);
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
  StoreMembership m(store, 1, 10s);
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
  StoreMembership m(store, 1, 10s);
  auto const t0 = std::chrono::steady_clock::now();
  auto a = ask(m, 0, 3, {ended(2), ended(1)});
  auto const fa = a.get();
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(fa.members == std::vector<int>{0});
  CHECK(fa.lost.size() == 2);
}

TEST_CASE("a rank asking after the others formed is left out, told how they formed") {
  auto store = std::make_shared<ddp::LocalStore>();
  StoreMembership m(store, 1, 200ms);
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
  StoreMembership m(store, 3, 10s);
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
  StoreMembership m(store, 1, 10s);
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
