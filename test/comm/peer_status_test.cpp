// PeerStatus (comm/peer_status.hpp): the store encoding of a collective's cause round-trips, a value without
// statuses (text only) decodes to none, malformed headers fall back to text, and PeerLog keeps each rank's first
// status. The backends' peer_failures() are tested with their failures (threads_test, gloo_test).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ddp/comm/peer_status.hpp"

using ddp::PeerState;
using ddp::PeerStatus;

TEST_CASE("a cause with its statuses round-trips through the store encoding") {
  std::vector<PeerStatus> const statuses{
      {.rank = 2, .state = PeerState::kLeft, .seen_by = 2, .seq = 7, .reason = "its backend was destroyed"},
      {.rank = 3,
       .state = PeerState::kStalled,
       .seen_by = 0,
       .seq = 7,
       .reason = "a reason\nwith a newline: and a colon"},
      {.rank = 1, .state = PeerState::kEnded, .seen_by = 0, .seq = 7, .reason = ""}};
  std::string const text = "ranks 2 and 3 left (seen by rank 0)";
  auto const [back, words] = ddp::detail::decode_cause(ddp::detail::encode_cause(statuses, text));
  CHECK(back == statuses);
  CHECK(words == text);
  auto const [none, plain] = ddp::detail::decode_cause(ddp::detail::encode_cause({}, text));
  CHECK(none.empty());
  CHECK(plain == text);
}

TEST_CASE("a value that is text only, or a malformed header, decodes to no statuses and the whole text") {
  for (std::string const v : {"rank 1 ended (its connection closed; seen by rank 0)", "P x 1 2 3 4:abcd\nTtext",
                              "P 1 9 0 0 0:\nTtext", "P 1 0 0 0 99:short\nT"}) {
    CAPTURE(v);
    auto const [statuses, text] = ddp::detail::decode_cause(v);
    CHECK(statuses.empty());
    CHECK(text == v);
  }
}

TEST_CASE("PeerLog keeps the first status of each rank, in the order learned") {
  ddp::detail::PeerLog log;
  log.note({.rank = 1, .state = PeerState::kFailed, .seen_by = 1, .reason = "loss is NaN"});
  log.note({.rank = 1, .state = PeerState::kLeft, .seen_by = 1, .reason = "its backend was destroyed"});
  log.note({.rank = 0, .state = PeerState::kLeft, .seen_by = 0, .reason = "its backend was destroyed"});
  auto const all = log.all();
  REQUIRE(all.size() == 2);
  CHECK(all[0].rank == 1);
  CHECK(all[0].state == PeerState::kFailed);
  CHECK(all[1].rank == 0);
  CHECK(ddp::state_name(all[0].state) == "failed");
  CHECK(ddp::state_name(PeerState::kStalled) == "stalled");
}
