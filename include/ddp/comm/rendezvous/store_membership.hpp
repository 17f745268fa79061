// StoreMembership: the generations of an elastic job whose ranks are processes, agreed through the job's store (the
// rendezvous's: a TCP store served by rank 0 or torchrun's agent, or a file store).
// Shrink: after generation g fails, each survivor posts that it asks for g+1, with the peers it knows to be lost
// (PeerStatus: ended, stalled, failed); a rank that fails on its own posts that too. The next generation forms once
// every rank of g has asked or is known lost, or at the regroup deadline without the ranks that did neither: the first
// rank to get there claims the formation (an atomic add) and writes the members, the askers in their old order; every
// other rank reads them. A peer's judgement from its collective alone (ended, stalled) does not count a rank lost
// while that rank is alive and handling a failure of its own (broken_key in generation g's store: it broke at another
// collective than the judge's); it will ask.
// Grow: a process that wants to join (join()) first compares the job's identity (model, flags, binary: whatever the
// job's rank 0 published with publish()) with its own and is refused, naming the first difference, before it disturbs
// anything; then it takes a ticket (an atomic add) and waits. The ranks agree at a step boundary to regroup when
// tickets wait (pending(), read by their rank 0: admit_joiners); the rank that forms the next generation admits the
// waiting tickets in order, up to the maximum world size, each by claiming it (an atomic add a joiner that gives up
// also races for, so a ticket is either admitted or withdrawn, never both), and appends them to the members. Below the
// minimum the forming rank waits up to join_timeout for tickets.
// Keys, under "elastic/": identity, sizes ("<first world size> <max>"), ended; join/tickets, join/next (the first
// ticket not yet decided), join/<t>/claim, join/<t>/admitted ("<g> <rank> <world size>"); and per generation,
// "<g>/": ask/<r> (its known losses, encode_cause), failed/<r> (its own failure), claim, why (how it formed, for a rank
// left out), members ("0 1 3 | 7 8": old ranks, then tickets admitted). The new generation's collectives use keys
// under "elastic/<g+1>/" (prefix()).
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/comm/peer_status.hpp"
#include "ddp/comm/rendezvous/store.hpp"
#include "ddp/comm/watch.hpp"
#include "ddp/error.hpp"

namespace ddp {

// One thing a joiner must share with the job it joins: what ("model", "flag --lr", "binary") and its value.
struct IdentityItem {
  std::string what;
  std::string value;
  friend bool operator==(IdentityItem const&, IdentityItem const&) = default;
};
using JobIdentity = std::vector<IdentityItem>;

namespace detail {

struct StoreMembershipOptions {
  int min_world_size = 1;
  int max_world_size = 0;  // joiners are admitted up to this many ranks (0: none are)
  std::chrono::milliseconds regroup_timeout{std::chrono::seconds(30)};
  std::chrono::milliseconds join_timeout{0};  // below the minimum, how long the forming rank waits for joiners
};

class StoreMembership {
  using Clock = std::chrono::steady_clock;

 public:
  // What a rank learns when generation g+1 forms.
  struct Formation {
    int rank = -1;                   // this rank's place in it
    int world_size = 0;              // its size
    std::vector<int> members{};      // old ranks, in new order (first)
    std::vector<int> joined{};       // the new ranks of the joiners admitted (after the members)
    std::vector<PeerStatus> lost{};  // old ranks not in it, with what was known of them
    Clock::time_point since{};       // when this rank asked
  };
  // What a joiner learns when it is admitted.
  struct Admission {
    std::uint64_t generation = 0;  // the generation it joins
    int id = 0;                    // its id: the first world size plus its ticket
    Formation formation{};         // of that generation (rank: its place)
  };

  StoreMembership(std::shared_ptr<Store> store, StoreMembershipOptions opts) : store_(std::move(store)), o_(opts) {
    if (o_.join_timeout.count() < 0)
      throw ArgumentError(cat("elastic: join_timeout must not be negative, got ", o_.join_timeout.count(), " ms"));
  }

  // The keys of generation g's collectives (generation 0 uses the store as it is).
  std::shared_ptr<Store> prefix(std::uint64_t generation) const {
    if (generation == 0) return store_;
    return std::make_shared<PrefixStore>(cat("elastic/", generation, "/"), store_);
  }

  // Generation 0's rank 0, at the start: what a joiner must match, and the job's bounds and deadlines (a joiner takes
  // them: options()).
  void publish(JobIdentity const& identity, int first_world_size) {
    set("elastic/sizes", cat(first_world_size, " ", o_.max_world_size, " ", o_.min_world_size, " ",
                             o_.join_timeout.count(), " ", o_.regroup_timeout.count()));
    set("elastic/identity", encode(identity));
  }
  // The job finished (any rank, when its body returned): joiners still waiting are told so.
  void post_ended() noexcept {
    try {
      set("elastic/ended", "1");
    } catch (...) {}
  }
  StoreMembershipOptions const& options() const noexcept { return o_; }
  // Tickets waiting to be admitted: the job's rank 0 asks at every step boundary, so it only reads (one check of a key
  // while no process ever asked to join; an add of 0 would write the counter, a file rewrite on a file store).
  std::int64_t pending() {
    if (!store_->check({"elastic/join/tickets"})) return 0;
    return counter("elastic/join/tickets") - (store_->check({"elastic/join/next"}) ? counter("elastic/join/next") : 0);
  }

  // This rank failed on its own in `generation` (it takes no further part): its peers need not wait for it.
  void post_failed(std::uint64_t generation, int rank, std::string const& why) noexcept {
    try {
      PeerStatus s{.rank = rank, .state = PeerState::kFailed, .seen_by = rank, .reason = why};
      set(key(generation, cat("failed/", rank)), encode_cause({s}, ""));
    } catch (...) {  // the store is gone: the peers learn it otherwise (the connection, the deadline)
    }
  }

  // A rank of `generation` (of `world_size` ranks) asks for the next: after losses (`known`: those it has seen), or at
  // a step boundary where joiners wait. Throws CommError when it was left out, or when the next generation would be
  // smaller than the minimum (every survivor).
  Formation regroup(std::uint64_t generation, int rank, int world_size, std::vector<PeerStatus> const& known) {
    auto const since = Clock::now();
    std::vector<PeerStatus> lossy;  // only the losses that mean the rank will not ask (a rank that left may)
    for (auto const& s : known)
      if (s.state != PeerState::kLeft) lossy.push_back(s);
    set(key(generation, cat("ask/", rank)), encode_cause(lossy, ""));
    auto const deadline = since + o_.regroup_timeout;
    std::string const members_key = key(generation, "members");
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      if (store_->check({members_key})) break;
      auto const [askers, lost] = survey(generation, world_size);
      bool const settled = static_cast<int>(askers.size() + lost.size()) >= world_size;
      if (settled || Clock::now() >= deadline) {
        if (store_->add(key(generation, "claim"), 1) == 1) form(generation, world_size, rank, settled);
        break;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(20));
    }
    Formation f = formed(generation, world_size);
    f.since = since;
    auto const me = std::find(f.members.begin(), f.members.end(), rank);
    if (me == f.members.end()) {
      std::string why;
      try {
        auto const v = store_->get(key(generation, "why"), o_.regroup_timeout);
        why = cat("; ", std::string(v.begin(), v.end()));
      } catch (Error const&) {}
      throw CommError(cat("ddp elastic: rank ", rank, " of generation ", generation, " was left out of generation ",
                          generation + 1, ": it asked to regroup after the others had formed it", why),
                      rank);
    }
    if (f.world_size < o_.min_world_size)
      throw CommError(
          below_minimum_error(generation, static_cast<std::size_t>(world_size), f.lost, f.world_size, o_.min_world_size,
                              o_.join_timeout.count() > 0 && o_.max_world_size > 0
                                  ? cat(", and no process joined within ", seconds_text(o_.join_timeout))
                                  : std::string()),
          rank);
    f.rank = static_cast<int>(me - f.members.begin());
    return f;
  }

  // A process that is not in the job asks to join it: refused (ArgumentError) when `mine` differs from the job's
  // identity, naming the first difference, or when the job does not grow; else it waits up to `wait` to be admitted
  // at a step boundary (CommError when it is not, or when the job ends first: its ticket is withdrawn).
  Admission join(JobIdentity const& mine, std::chrono::milliseconds wait) {
    auto const start = Clock::now();
    std::string text;
    try {
      auto const v = store_->get("elastic/identity", wait);
      text.assign(v.begin(), v.end());
    } catch (CommError const& e) {
      throw CommError(cat("ddp elastic: a process asking to join found no elastic job at ", store_->describe(),
                          " within ", seconds_text(wait), " (", e.what(), ")"));
    }
    if (auto const differs = mismatch(decode(text), mine); !differs.empty())
      throw ArgumentError(cat("ddp elastic: refused to join the job at ", store_->describe(), ": ", differs));
    // The job's bounds and deadlines become this process's: every rank must take the same decisions.
    int first = 0;
    {
      std::int64_t join_ms = 0, regroup_ms = 0;
      std::istringstream(get_text("elastic/sizes")) >> first >> o_.max_world_size >> o_.min_world_size >> join_ms >>
          regroup_ms;
      o_.join_timeout = std::chrono::milliseconds(join_ms);
      o_.regroup_timeout = std::chrono::milliseconds(regroup_ms);
    }
    int const max = o_.max_world_size;
    if (max <= 0)
      throw ArgumentError(cat("ddp elastic: refused to join the job at ", store_->describe(),
                              ": it admits no joiners (it started at ", first,
                              " ranks without a maximum world size above them)"));
    if (store_->check({"elastic/ended"}))
      throw CommError(cat("ddp elastic: the job at ", store_->describe(), " has ended; nothing to join"));
    std::int64_t const ticket = store_->add("elastic/join/tickets", 1) - 1;
    std::string const admitted = cat("elastic/join/", ticket, "/admitted");
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      if (store_->check({admitted})) break;
      bool const ended = store_->check({"elastic/ended"});
      if (ended || Clock::now() >= start + wait) {
        if (store_->add(cat("elastic/join/", ticket, "/claim"), 1) == 1)
          throw CommError(ended ? cat("ddp elastic: the job at ", store_->describe(),
                                      " ended before it admitted this process (ticket ", ticket, ")")
                                : cat("ddp elastic: this process was not admitted within ", seconds_text(wait),
                                      " (ticket ", ticket,
                                      "): the job admits joiners at step boundaries while it "
                                      "has fewer than ",
                                      max, " ranks"));
        break;  // admitted meanwhile
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(20));
    }
    std::istringstream in(get_text(admitted));
    Admission a;
    int rank = -1, world_size = 0;
    int from = 0;
    in >> a.generation >> rank >> world_size >> from;
    a.id = first + static_cast<int>(ticket);
    a.formation = formed(a.generation - 1, from);
    a.formation.rank = rank;
    a.formation.since = start;
    return a;
  }

 private:
  static std::string key(std::uint64_t generation, std::string const& what) {
    return cat("elastic/", generation, "/", what);
  }
  void set(std::string const& k, std::string const& v) { store_->set(k, std::vector<char>(v.begin(), v.end())); }
  // A counter's value, read without writing it (every store keeps counters as decimal text).
  std::int64_t counter(std::string const& k) {
    auto const v = store_->get(k, o_.regroup_timeout);
    std::int64_t x = 0;
    std::from_chars(v.data(), v.data() + v.size(), x);
    return x;
  }
  std::string get_text(std::string const& k) {
    auto const v = store_->get(k, o_.regroup_timeout);
    return std::string(v.begin(), v.end());
  }

  // Identity items, one a line: "what\tvalue" (tabs and newlines in either become spaces).
  static std::string encode(JobIdentity const& id) {
    auto clean = [](std::string s) {
      std::replace_if(
          s.begin(), s.end(), [](char c) { return c == '\t' || c == '\n'; }, ' ');
      return s;
    };
    std::string out;
    for (auto const& i : id) out += cat(clean(i.what), "\t", clean(i.value), "\n");
    return out;
  }
  static JobIdentity decode(std::string const& text) {
    JobIdentity id;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      auto const tab = line.find('\t');
      if (tab != std::string::npos) id.push_back({line.substr(0, tab), line.substr(tab + 1)});
    }
    return id;
  }
  // The first item where the joiner differs from the job ("its flag --lr is '0.01', the job's '0.001'"), or "".
  static std::string mismatch(JobIdentity const& job, JobIdentity const& mine) {
    for (auto const& j : job) {
      auto const it = std::find_if(mine.begin(), mine.end(), [&](IdentityItem const& m) { return m.what == j.what; });
      if (it == mine.end()) return cat("the job has a ", j.what, " ('", j.value, "') this process does not");
      if (it->value != j.value)
        return cat("this process's ", j.what, " is '", it->value, "', the job's is '", j.value, "'");
    }
    for (auto const& m : mine)
      if (std::none_of(job.begin(), job.end(), [&](IdentityItem const& j) { return j.what == m.what; }))
        return cat("this process has a ", m.what, " ('", m.value, "') the job does not");
    return {};
  }

  // The forming rank: the askers in their old order, then the waiting joiners the maximum admits (below the minimum,
  // waiting up to join_timeout for them); then why (for a rank left out) and the members.
  void form(std::uint64_t generation, int world_size, int rank, bool settled) {
    auto const [askers, lost] = survey(generation, world_size);
    std::vector<std::int64_t> admitted;
    int const room = o_.max_world_size > 0 ? o_.max_world_size - static_cast<int>(askers.size()) : 0;
    auto const join_deadline = Clock::now() + o_.join_timeout;
    for (auto pause = std::chrono::milliseconds(1);;) {
      admit(admitted, room);
      if (static_cast<int>(askers.size() + admitted.size()) >= o_.min_world_size || room <= 0 ||
          Clock::now() >= join_deadline)
        break;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(20));
    }
    std::string list, why;
    for (int r : askers) list += cat(list.empty() ? "" : " ", r);
    list += " |";
    for (auto t : admitted) list += cat(" ", t);
    for (auto const& s : lost)
      why += cat(why.empty() ? "" : ", ", "rank ", s.rank, " ", state_name(s.state), ": ", s.reason);
    // (for a rank left out: how the others decided without it; set before the members, which it waits for)
    set(key(generation, "why"),
        cat("formed by rank ", rank, settled ? " once every rank had asked or was known lost" : " at its deadline",
            why.empty() ? std::string() : cat(" (known lost: ", why, ")")));
    set(key(generation, "members"), list);
    int const n = static_cast<int>(askers.size() + admitted.size());
    for (std::size_t k = 0; k < admitted.size(); ++k)
      set(cat("elastic/join/", admitted[k], "/admitted"),
          cat(generation + 1, " ", askers.size() + k, " ", n, " ", world_size));
  }
  // Claims the waiting tickets in order while there is room (a ticket its joiner withdrew is passed over).
  void admit(std::vector<std::int64_t>& admitted, int room) {
    std::int64_t next = store_->add("elastic/join/next", 0);
    std::int64_t const tickets = store_->add("elastic/join/tickets", 0);
    std::int64_t const first = next;
    for (; next < tickets && static_cast<int>(admitted.size()) < room; ++next)
      if (store_->add(cat("elastic/join/", next, "/claim"), 1) == 1) admitted.push_back(next);
    if (next > first) store_->add("elastic/join/next", next - first);
  }

  // Generation g+1 as the forming rank wrote it (waiting for it), with the old ranks not in it and why.
  Formation formed(std::uint64_t generation, int world_size) {
    Formation f;
    auto const text = store_->get(key(generation, "members"), o_.regroup_timeout + o_.join_timeout);
    std::istringstream in(std::string(text.begin(), text.end()));
    std::string word;
    bool joiners = false;
    while (in >> word) {
      if (word == "|")
        joiners = true;
      else if (joiners)
        f.joined.push_back(static_cast<int>(f.members.size() + f.joined.size()));
      else
        f.members.push_back(std::stoi(word));
    }
    auto const [askers, lost] = survey(generation, world_size);
    for (int r = 0; r < world_size; ++r) {
      if (std::find(f.members.begin(), f.members.end(), r) != f.members.end()) continue;
      auto const it = std::find_if(lost.begin(), lost.end(), [&](PeerStatus const& s) { return s.rank == r; });
      f.lost.push_back(it != lost.end() ? *it
                                        : PeerStatus{.rank = r,
                                                     .state = PeerState::kStalled,
                                                     .reason = cat("it did not ask to regroup within ",
                                                                   seconds_text(o_.regroup_timeout))});
    }
    f.world_size = static_cast<int>(f.members.size() + f.joined.size());
    return f;
  }

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
        auto const v = store_->get(ask, o_.regroup_timeout);
        for (auto const& s : decode_cause(std::string_view(v.data(), v.size())).first) note(s);
      } else if (store_->check({failed})) {
        auto const v = store_->get(failed, o_.regroup_timeout);
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
  StoreMembershipOptions o_;
};

}  // namespace detail
}  // namespace ddp
