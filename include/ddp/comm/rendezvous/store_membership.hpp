// StoreMembership: the generations of an elastic job whose ranks are processes, agreed through the job's store (the
// rendezvous's: a TCP store served by rank 0 or torchrun's agent, or a file store). After generation g fails, each
// survivor posts that it asks for g+1, with the peers it knows to be lost (PeerStatus: ended, stalled, failed); a
// rank that fails on its own posts that too. The next generation forms once every rank of g has asked or is known
// lost, or at the regroup deadline without the ranks that did neither: the first rank to get there claims the
// formation (an atomic add) and writes the members, the askers in their old order; every other rank reads them.
// A peer's judgement from its collective alone (ended, stalled) does not count a rank lost while that rank is alive and
// handling a failure of its own (broken_key in generation g's store: it broke at another collective than the
// judge's); it will ask. Keys, under "elastic/<g>/": ask/<r> (its known losses, encode_cause), failed/<r> (its own
// failure), claim, why (how it formed, for a rank left out), members ("0 1 3"). The new generation's collectives use keys under "elastic/<g+1>/" (prefix()).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/peer_status.hpp"
#include "ddp/comm/rendezvous/store.hpp"
#include "ddp/comm/watch.hpp"
#include "ddp/error.hpp"

namespace ddp::detail {

class StoreMembership {
  using Clock = std::chrono::steady_clock;

 public:
  // What a survivor learns when generation g+1 forms.
  struct Formation {
    int rank = -1;                   // this rank's place in it
    int world_size = 0;              // its size
    std::vector<int> members{};      // old ranks, in new order
    std::vector<PeerStatus> lost{};  // old ranks not in it, with what was known of them
    Clock::time_point since{};       // when this rank asked
  };

  StoreMembership(std::shared_ptr<Store> store, int min_world_size, std::chrono::milliseconds regroup_timeout)
      : store_(std::move(store)), min_(min_world_size), timeout_(regroup_timeout) {}

  // The keys of generation g's collectives (generation 0 uses the store as it is).
  std::shared_ptr<Store> prefix(std::uint64_t generation) const {
    if (generation == 0) return store_;
    return std::make_shared<PrefixStore>(cat("elastic/", generation, "/"), store_);
  }

  // This rank failed on its own in `generation` (it takes no further part): its peers need not wait for it.
  void post_failed(std::uint64_t generation, int rank, std::string const& why) noexcept {
    try {
      PeerStatus s{.rank = rank, .state = PeerState::kFailed, .seen_by = rank, .reason = why};
      set(key(generation, cat("failed/", rank)), encode_cause({s}, ""));
    } catch (...) {  // the store is gone: the peers learn it otherwise (the connection, the deadline)
    }
  }

  // A survivor of `generation` (of `world_size` ranks) asks for the next; `known`: the losses it has seen. Throws
  // CommError when it was left out, or when the next generation would be smaller than the minimum (every survivor).
  Formation regroup(std::uint64_t generation, int rank, int world_size, std::vector<PeerStatus> const& known) {
    Formation f;
    f.since = Clock::now();
    std::vector<PeerStatus> lossy;  // only the losses that mean the rank will not ask (a rank that left may)
    for (auto const& s : known)
      if (s.state != PeerState::kLeft) lossy.push_back(s);
    set(key(generation, cat("ask/", rank)), encode_cause(lossy, ""));
    auto const deadline = f.since + timeout_;
    std::string const members_key = key(generation, "members");
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      if (store_->check({members_key})) break;
      auto const [askers, lost] = survey(generation, world_size);
      bool const settled = static_cast<int>(askers.size() + lost.size()) >= world_size;
      if (settled || Clock::now() >= deadline) {
        if (store_->add(key(generation, "claim"), 1) == 1) {
          auto const [final_askers, final_lost] = survey(generation, world_size);
          std::string list, why;
          for (int r : final_askers) list += cat(list.empty() ? "" : " ", r);
          for (auto const& s : final_lost)
            why += cat(why.empty() ? "" : ", ", "rank ", s.rank, " ", state_name(s.state), ": ", s.reason);
          // (for a rank left out: how the others decided without it; set before the members, which it waits for)
          set(key(generation, "why"), cat("formed by rank ", rank,
                                          settled ? " once every rank had asked or was known lost" : " at its deadline",
                                          why.empty() ? std::string() : cat(" (known lost: ", why, ")")));
          set(members_key, list);
        }
        break;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(20));
    }
    auto const text = store_->get(members_key, timeout_);
    std::istringstream in(std::string(text.begin(), text.end()));
    for (int r; in >> r;) f.members.push_back(r);
    auto const [askers, lost] = survey(generation, world_size);
    for (int r = 0; r < world_size; ++r) {
      if (std::find(f.members.begin(), f.members.end(), r) != f.members.end()) continue;
      auto const it = std::find_if(lost.begin(), lost.end(), [&](PeerStatus const& s) { return s.rank == r; });
      f.lost.push_back(it != lost.end()
                           ? *it
                           : PeerStatus{.rank = r,
                                        .state = PeerState::kStalled,
                                        .reason = cat("it did not ask to regroup within ", seconds_text(timeout_))});
    }
    f.world_size = static_cast<int>(f.members.size());
    auto const me = std::find(f.members.begin(), f.members.end(), rank);
    if (me == f.members.end()) {
      std::string why;
      try {
        auto const v = store_->get(key(generation, "why"), timeout_);
        why = cat("; ", std::string(v.begin(), v.end()));
      } catch (Error const&) {}
      throw CommError(cat("ddp elastic: rank ", rank, " of generation ", generation, " was left out of generation ",
                          generation + 1, ": it asked to regroup after the others had formed it", why),
                      rank);
    }
    if (f.world_size < min_)
      throw CommError(below_minimum_error(generation, static_cast<std::size_t>(world_size), f.lost, f.world_size, min_),
                      rank);
    f.rank = static_cast<int>(me - f.members.begin());
    return f;
  }

 private:
  static std::string key(std::uint64_t generation, std::string const& what) {
    return cat("elastic/", generation, "/", what);
  }
  void set(std::string const& k, std::string const& v) { store_->set(k, std::vector<char>(v.begin(), v.end())); }

  // Who has asked, and which of the others are known lost (by an asker, or by their own post).
  std::pair<std::vector<int>, std::vector<PeerStatus>> survey(std::uint64_t generation, int world_size) {
    std::vector<int> askers;
    std::vector<PeerStatus> lost;
    auto note = [&](PeerStatus const& s) {
      if (std::none_of(lost.begin(), lost.end(), [&](PeerStatus const& l) { return l.rank == s.rank; }))
        lost.push_back(s);
    };
    for (int r = 0; r < world_size; ++r) {
      std::string const ask = key(generation, cat("ask/", r)), failed = key(generation, cat("failed/", r));
      if (store_->check({ask})) {
        askers.push_back(r);
        auto const v = store_->get(ask, timeout_);
        for (auto const& s : decode_cause(std::string_view(v.data(), v.size())).first) note(s);
      } else if (store_->check({failed})) {
        auto const v = store_->get(failed, timeout_);
        for (auto const& s : decode_cause(std::string_view(v.data(), v.size())).first) note(s);
      }
    }
    // A rank a peer judged lost from its collective alone (ended, stalled) but that is handling a failure of its own
    // (broken_key) is alive: it will ask, or post its failure. Not lost until it does, or until the deadline.
    auto const gen_store = prefix(generation);
    std::erase_if(lost, [&](PeerStatus const& s) {
      if (s.rank < 0 || s.rank >= world_size || std::find(askers.begin(), askers.end(), s.rank) != askers.end())
        return true;
      bool const posted_failure = store_->check({key(generation, cat("failed/", s.rank))});
      return !posted_failure && gen_store->check({broken_key(s.rank)});
    });
    return {askers, lost};
  }

  std::shared_ptr<Store> store_;
  int min_;
  std::chrono::milliseconds timeout_;
};

}  // namespace ddp::detail
