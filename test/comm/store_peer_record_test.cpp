// StorePeerRecord (include/ddp/comm/rendezvous/store_peer_record.hpp): the one store record of who failed, kept by
// GlooBackend's blame and StoreWatch. Its keys are the layouts those two always used (so a store shared with an older
// job or a test reading them sees the same names); the first cause of a collective is claimed once, so two ranks that
// see a failure at once report the same cause; the peers that left are listed with their reasons, in rank order.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/rendezvous/store.hpp"
#include "ddp/comm/rendezvous/store_peer_record.hpp"

using namespace std::chrono_literals;
using ddp::PeerState;
using ddp::PeerStatus;
using ddp::detail::StorePeerRecord;

TEST_CASE("StorePeerRecord: departures under the backend's prefix, listed with their reasons") {
  auto store = std::make_shared<ddp::LocalStore>();
  StorePeerRecord r0(store, "nccl/0/watch/", 0, 3), r1(store, "nccl/0/watch/", 1, 3), r2(store, "nccl/0/watch/", 2, 3);
  CHECK_FALSE(r0.any_left());
  CHECK(r0.left(1s).empty());
  r2.post_left("its backend was destroyed");
  r1.post_left("it failed: ddp nccl: all_reduce #9");
  CHECK(store->check({"nccl/0/watch/left/2", "nccl/0/watch/left/1", "nccl/0/watch/left_count"}));
  CHECK(r0.left_key(2) == "nccl/0/watch/left/2");
  REQUIRE(r0.any_left());
  auto const left = r0.left(1s);
  REQUIRE(left.size() == 2);
  CHECK(left[0].rank == 1);
  CHECK(left[0].state == PeerState::kLeft);
  CHECK(left[0].reason == "it failed: ddp nccl: all_reduce #9");
  CHECK(left[1].rank == 2);
  CHECK(r2.left(1s).size() == 1);  // (not itself)
}

TEST_CASE("StorePeerRecord: one cause per collective, whoever claims first; the roll call") {
  auto store = std::make_shared<ddp::LocalStore>();
  StorePeerRecord a(store, "gloo_", 0, 3), b(store, "gloo_", 1, 3);
  CHECK_FALSE(a.has_cause(7));
  a.report_failed(7);
  CHECK(store->check({"gloo_failed/7/0"}));
  CHECK(b.reported_failed(7, 0));
  CHECK_FALSE(b.reported_failed(7, 2));
  CHECK_FALSE(b.reported_failed(8, 0));
  std::vector<PeerStatus> const ended{
      {.rank = 2, .state = PeerState::kEnded, .seen_by = 0, .seq = 7, .reason = "its connection closed"}};
  auto const first = a.claim_cause(7, ended, "rank 2 ended (its connection closed; seen by rank 0)", 1s);
  CHECK(first.second == "rank 2 ended (its connection closed; seen by rank 0)");
  CHECK(store->check({"gloo_failure/7", "gloo_failure_claim/7", "gloo_failures/7"}));
  // Rank 1 saw the same failure a moment later and blamed another peer: the first cause stands for it too.
  auto const second = b.claim_cause(7, {{.rank = 0, .state = PeerState::kStalled, .seen_by = 1, .seq = 7}},
                                    "rank 0 was not in this collective", 1s);
  CHECK(second.second == first.second);
  REQUIRE(second.first.size() == 1);
  CHECK(second.first[0] == ended[0]);
  CHECK(b.has_cause(7));
  CHECK(b.cause(7, 1s).first == ended);
}
