// ThreadsMembership: the generations of an elastic in-process job (elastic_spawn, train/elastic.hpp). Generation 0 is
// a ThreadsGroup of n ranks. When a rank fails, its group fails (every survivor's collective throws, naming it);
// each survivor then asks for the next generation (regroup), and the failed rank leaves (leave). The next generation
// forms once every rank of the old one has asked or left, or at the regroup deadline without the ranks that did
// neither (a rank stalled outside ddp): a fresh ThreadsGroup of the survivors, renumbered 0..k-1 in their old order.
// Below the minimum world size the survivors wait for joiners up to the join deadline (0: not at all); then, still
// below it, every survivor gets the same CommError. A rank left out that asks later is
// told so, by name. Growth: a new rank asks to join (join); the ranks see it (waiting(), agreed on at a step
// boundary), all ask for the next generation, and it forms with the joiners after the survivors, up to the maximum
// world size; a joiner still waiting when the job ends is told so. Nothing here knows about training: what the ranks
// restore is train/elastic.hpp's.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/peer_status.hpp"
#include "ddp/comm/threads/backend.hpp"
#include "ddp/comm/watch.hpp"
#include "ddp/error.hpp"

namespace ddp::detail {

class ThreadsMembership {
  using Clock = std::chrono::steady_clock;

 public:
  // One generation's outcome, for the ranks that asked.
  struct Formation {
    std::shared_ptr<ThreadsGroup> group;  // the next generation's (null when the job could not go on)
    std::vector<int> new_rank;            // per rank of the old generation: its rank in the new one, -1 if not in it
    std::vector<PeerStatus> lost;         // the old generation's ranks not in the new one, with what the group knew
    std::vector<std::pair<int, int>> joined{};  // (joiner id, its rank in the new generation)
    std::string error;                          // set when the job could not go on (below the minimum world size)
    Clock::time_point first_ask{};  // when the first survivor asked (the failure's time, to within a collective)
  };

  ThreadsMembership(int world_size, ThreadsOptions opts, int min_world_size, int max_world_size,
                    std::chrono::milliseconds regroup_timeout, std::chrono::milliseconds join_timeout = {})
      : opts_(std::move(opts)),
        min_(min_world_size),
        max_(max_world_size),
        timeout_(regroup_timeout),
        join_timeout_(join_timeout) {
    if (min_world_size < 1 || min_world_size > world_size)
      throw ArgumentError(
          cat("elastic: min_world_size must be in [1, ", world_size, "] (the world size), got ", min_world_size));
    if (max_world_size < world_size)
      throw ArgumentError(cat("elastic: max_world_size ", max_world_size, " is below the world size ", world_size));
    if (regroup_timeout.count() <= 0)
      throw ArgumentError(cat("elastic: regroup_timeout must be positive, got ", regroup_timeout.count(), " ms"));
    if (join_timeout.count() < 0)
      throw ArgumentError(cat("elastic: join_timeout must not be negative, got ", join_timeout.count(), " ms"));
    groups_.push_back(make_threads_group(world_size, opts_));
    state_.assign(static_cast<std::size_t>(world_size), kActive);
  }

  std::shared_ptr<ThreadsGroup> group(std::uint64_t generation) const {
    std::lock_guard lock(m_);
    return groups_.at(generation);
  }
  std::uint64_t generation() const {
    std::lock_guard lock(m_);
    return groups_.size() - 1;
  }
  Formation formation(std::uint64_t generation) const {  // of generation + 1
    std::lock_guard lock(m_);
    return formed_.at(generation);
  }

  // Rank `rank` of `generation` takes no further part (it failed, or it finished). When every rank has, the job is
  // over: joiners still waiting are told.
  void leave(std::uint64_t generation, int rank) {
    std::lock_guard lock(m_);
    if (generation + 1 != groups_.size()) return;  // that generation is over
    state_[static_cast<std::size_t>(rank)] = kGone;
    if (std::all_of(state_.begin(), state_.end(), [](int x) { return x == kGone; })) ended_ = true;
    cv_.notify_all();
  }

  // Joiners waiting to be admitted, when the job may still grow (0 otherwise): read by every rank at a step boundary
  // and agreed on there (the ranks may read it at different moments).
  int waiting() const {
    std::lock_guard lock(m_);
    return groups_.back() && groups_.back()->world_size() < max_ ? static_cast<int>(waiting_.size()) : 0;
  }

  // A new rank (`id`, unique in the job) asks to join: blocks until a generation admits it (returns its formation and
  // generation; its rank is in `joined`), or throws CommError when the job ended first (or cannot go on).
  std::pair<Formation, std::uint64_t> join(int id) {
    std::unique_lock lock(m_);
    waiting_.push_back(id);
    cv_.notify_all();
    std::size_t seen = formed_.size();
    for (;;) {
      cv_.wait(lock, [&] { return formed_.size() > seen || ended_; });
      for (; seen < formed_.size(); ++seen) {
        auto const& f = formed_[seen];
        if (!f.error.empty()) throw CommError(f.error, id);
        for (auto const& [who, at] : f.joined)
          if (who == id) return {f, seen + 1};
      }
      if (ended_) {
        std::erase(waiting_, id);
        throw CommError(
            cat("ddp elastic: rank ", id, " asked to join, but the job ended before the next step boundary"), id);
      }
    }
  }

  // A survivor of `generation` asks for the next one: returns its formation, this rank's place in it being
  // new_rank[rank]. Throws CommError when the job cannot go on (every survivor the same), or when this rank was left
  // out (it asked after the deadline).
  Formation regroup(std::uint64_t generation, int rank) {
    std::unique_lock lock(m_);
    if (generation + 1 == groups_.size()) {
      state_[static_cast<std::size_t>(rank)] = kAsking;
      if (first_ask_ == Clock::time_point{}) first_ask_ = Clock::now();
      cv_.notify_all();
      auto const deadline = Clock::now() + timeout_;
      auto const settled = [&] {
        return generation + 1 != groups_.size() ||
               std::none_of(state_.begin(), state_.end(), [](int s) { return s == kActive; });
      };
      cv_.wait_until(lock, deadline, settled);
      if (generation + 1 == groups_.size() && join_timeout_.count() > 0 && short_of_minimum()) {
        // Below the minimum: wait for joiners (add_rank) to make up the difference, up to the join deadline.
        cv_.wait_until(lock, Clock::now() + join_timeout_,
                       [&] { return generation + 1 != groups_.size() || !short_of_minimum(); });
      }
      if (generation + 1 == groups_.size()) form(generation);
    }
    Formation const& f = formed_.at(generation);
    if (!f.error.empty()) throw CommError(f.error, rank);
    if (f.new_rank[static_cast<std::size_t>(rank)] < 0)
      throw CommError(
          cat("ddp elastic: rank ", rank, " of generation ", generation, " was left out of generation ", generation + 1,
              ": it did not ask to regroup within ", seconds_text(timeout_), " of the first survivor"),
          rank);
    return f;
  }

 private:
  enum : int { kActive, kAsking, kGone };

  bool short_of_minimum() const {  // holding m_: the askers and the joiners that fit are fewer than the minimum
    int const askers = static_cast<int>(std::count(state_.begin(), state_.end(), kAsking));
    return askers + std::min(static_cast<int>(waiting_.size()), std::max(0, max_ - askers)) < min_;
  }

  void form(std::uint64_t generation) {  // holding m_
    auto const& old = groups_.back();
    Formation f;
    f.first_ask = first_ask_;
    f.new_rank.assign(state_.size(), -1);
    int k = 0;
    for (std::size_t r = 0; r < state_.size(); ++r)
      if (state_[r] == kAsking) f.new_rank[r] = k++;
    auto const known = old->peers().all();
    for (std::size_t r = 0; r < state_.size(); ++r) {
      if (f.new_rank[r] >= 0) continue;
      auto const it =
          std::find_if(known.begin(), known.end(), [&](PeerStatus const& s) { return s.rank == static_cast<int>(r); });
      PeerStatus s = it != known.end()
                         ? *it
                         : PeerStatus{.rank = static_cast<int>(r),
                                      .state = PeerState::kStalled,
                                      .reason = cat("it did not ask to regroup within ", seconds_text(timeout_))};
      f.lost.push_back(std::move(s));
    }
    for (int id : waiting_) {
      if (k >= max_) break;
      f.joined.emplace_back(id, k++);
    }
    for (auto const& j : f.joined) std::erase(waiting_, j.first);
    if (k < min_) {
      f.error = below_minimum_error(
          generation, state_.size(), f.lost, k, min_,
          join_timeout_.count() > 0 ? cat(", and no rank joined within ", seconds_text(join_timeout_)) : "");
    } else {
      f.group = make_threads_group(k, opts_);
    }
    formed_.push_back(f);
    if (f.group) {
      groups_.push_back(f.group);
      state_.assign(static_cast<std::size_t>(k), kActive);
    } else {
      groups_.push_back(nullptr);
      state_.clear();
    }
    first_ask_ = {};
    cv_.notify_all();
  }

  ThreadsOptions opts_;
  int min_, max_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds join_timeout_;  // below the minimum, how long the survivors wait for joiners
  std::vector<int> waiting_;                // joiners' ids, in the order they asked
  bool ended_ = false;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<ThreadsGroup>> groups_;  // per generation
  std::vector<Formation> formed_;                      // per generation: how the next one formed
  std::vector<int> state_;                             // the current generation's ranks
  Clock::time_point first_ask_{};
};

}  // namespace ddp::detail
