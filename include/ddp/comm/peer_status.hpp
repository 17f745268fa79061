// PeerStatus: what a rank has learned of a peer that is no longer in step with it, as data instead of a message. A
// peer left (it said it takes no further part, with its reason), ended (its process or connection ended
// unannounced), stalled (it was absent from a collective past the deadline) or failed (it raised an error). The
// backends that can go on without a peer (ThreadsBackend, GlooBackend) answer peer_failures(): every status they have
// learned, the first cause first, the same whichever rank asks once the failure has reached it. Membership decisions
// (elastic training) read these, never an error's text; the messages stay as they are.
#pragma once

#include <charconv>
#include <concepts>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddp {

enum class PeerState : std::uint8_t { kLeft, kEnded, kStalled, kFailed };

constexpr std::string_view state_name(PeerState s) noexcept {
  switch (s) {
    case PeerState::kLeft:
      return "left";
    case PeerState::kEnded:
      return "ended";
    case PeerState::kStalled:
      return "stalled";
    case PeerState::kFailed:
      return "failed";
  }
  return "?";
}

struct PeerStatus {
  int rank = -1;                         // the peer
  PeerState state = PeerState::kFailed;  // what happened to it
  int seen_by = -1;                      // the rank that found out (itself, for kLeft and kFailed)
  std::uint64_t seq = 0;                 // the collective it happened in (the backend's count; 0: none)
  std::string reason{};                  // its own words (kLeft, kFailed) or the observer's
  friend bool operator==(PeerStatus const&, PeerStatus const&) = default;
};

// A communicator that says which peers it has lost and why.
template <class C>
concept ObservesPeers = requires(C const& c) {
  { c.peer_failures() } -> std::same_as<std::vector<PeerStatus>>;
};

namespace detail {

// The statuses one rank (or, in one process, one group) has learned, in the order learned; the first status of a
// rank stands. Thread-safe.
class PeerLog {
 public:
  void note(PeerStatus s) {
    std::lock_guard lock(m_);
    for (auto const& have : log_)
      if (have.rank == s.rank) return;
    log_.push_back(std::move(s));
  }
  void note_all(std::vector<PeerStatus> const& all) {
    for (auto const& s : all) note(s);
  }
  std::vector<PeerStatus> all() const {
    std::lock_guard lock(m_);
    return log_;
  }

 private:
  mutable std::mutex m_;
  std::vector<PeerStatus> log_;
};

// A collective's cause as a store value: the statuses, one line each ("P <rank> <state> <seen_by> <seq> <reason
// length>:<reason>"), then the message text. A value without the statuses (text only) decodes to none.
inline std::string encode_cause(std::vector<PeerStatus> const& statuses, std::string_view text) {
  std::string out;
  for (auto const& s : statuses)
    out += "P " + std::to_string(s.rank) + " " + std::to_string(static_cast<int>(s.state)) + " " +
           std::to_string(s.seen_by) + " " + std::to_string(s.seq) + " " + std::to_string(s.reason.size()) + ":" +
           s.reason + "\n";
  return out + "T" + std::string(text);
}

inline std::pair<std::vector<PeerStatus>, std::string> decode_cause(std::string_view v) {
  std::vector<PeerStatus> statuses;
  auto number = [&](std::string_view& s, auto& x) {
    auto const [p, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
    if (ec != std::errc{}) return false;
    s.remove_prefix(static_cast<std::size_t>(p - s.data()));
    if (!s.empty() && (s.front() == ' ' || s.front() == ':')) s.remove_prefix(1);
    return true;
  };
  std::string_view s = v;
  while (s.size() > 2 && s.substr(0, 2) == "P ") {
    s.remove_prefix(2);
    PeerStatus p;
    int state = 0;
    std::size_t len = 0;
    if (!number(s, p.rank) || !number(s, state) || !number(s, p.seen_by) || !number(s, p.seq) || !number(s, len) ||
        state < 0 || state > 3 || s.size() < len + 1)
      return {{}, std::string(v)};
    p.state = static_cast<PeerState>(state);
    p.reason = std::string(s.substr(0, len));
    s.remove_prefix(len + 1);  // the reason and its newline
    statuses.push_back(std::move(p));
  }
  if (s.empty() || s.front() != 'T') return {{}, std::string(v)};  // text only (or not ours)
  s.remove_prefix(1);
  return {std::move(statuses), std::string(s)};
}

// The error every survivor of an elastic generation gets when the next would be smaller than the minimum: "ddp
// elastic: generation 0 of world size 4 lost rank 1 (ended: its connection closed), rank 2 (failed: std::bad_alloc);
// the 2 left are fewer than the minimum world size 3" and `after` (e.g. how long it waited for joiners).
inline std::string below_minimum_error(std::uint64_t generation, std::size_t world_size,
                                       std::vector<PeerStatus> const& lost, int left, int min_world_size,
                                       std::string_view after = {}) {
  std::string who;
  for (auto const& s : lost)
    who += (who.empty() ? "rank " : ", rank ") + std::to_string(s.rank) + " (" + std::string(state_name(s.state)) +
           ": " + s.reason + ")";
  return "ddp elastic: generation " + std::to_string(generation) + " of world size " + std::to_string(world_size) +
         " lost " + who + "; the " + std::to_string(left) + " left are fewer than the minimum world size " +
         std::to_string(min_world_size) + std::string(after);
}

// The store key a rank sets, in its backend's store, as soon as one of its collectives fails and before it looks for
// the cause: it is alive and handling the failure. Ranks fail at different collectives (one may be a collective
// behind its peers), so "posted no failure for this collective" does not mean "gone": a peer that set this key is
// never judged silent (GlooBackend's blame), nor counted lost by a regroup before it asks (StoreMembership).
inline std::string broken_key(int rank) { return "ddp_broken/" + std::to_string(rank); }

}  // namespace detail
}  // namespace ddp
