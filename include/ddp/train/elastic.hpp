// In-place shrink on the threads backend: a rank that fails (throws, e.g. std::bad_alloc, or stalls past the
// deadline) is dropped and the others go on at N-1 without a restart, from the state at the start of the step it
// interrupted, kept in memory.
//
//   auto report = ddp::elastic_spawn(4, [&](ddp::ThreadsBackend& comm, ddp::ElasticSession& session) {
//     auto model = make_model();
//     ddp::basic_trainer<...> t(model, comm, ...);
//     ddp::TrainPosition pos;
//     if (auto p = t.resume_kept(session)) pos = *p;       // after a shrink: the interrupted step's start
//     ... t.fit_epoch(data, {...from pos...}, loss, {.before_step = [&](ddp::StepPosition const& p) {
//           t.keep_state(session, p);                       // every step: a copy of the state, in memory
//         }});
//   }, {.min_world_size = 2});
//
// elastic_spawn runs the body once per generation on every surviving rank's thread: the body builds its model and
// trainer on the generation's ThreadsBackend and resumes from what was kept. keep_state copies the model, the optimizer
// state and the position (capture_checkpoint: no collective, so a failing peer cannot stall it) and keeps the last two.
// resume_kept (collective, in the new generation) agrees on the earliest step every survivor still holds, has the new
// rank 0 send its copy, and loads it as load_checkpoint loads a file at another world size. In deterministic mode
// (ExactSum with MicroBatches) every later step's weights are bitwise those of the run that never lost a rank; with
// another reduction, within float reordering. Each change is one line ("rank 2 lost at step 5 (it failed:
// std::bad_alloc); continuing at world size 3 from step 5 after 0.02 s") and an entry of the returned report.
// Not kept: ZeRO's shards, local rounds' replicas (both need collectives to gather; refused at compile time), the
// gradient wire's state (PowerSGD's starts again) and the interrupted epoch's loss so far (its report then covers
// the steps from the resumption on).
#pragma once

#include <algorithm>
#include <any>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/comm/host_collectives.hpp"
#include "ddp/comm/peer_status.hpp"
#include "ddp/comm/threads/backend.hpp"
#include "ddp/comm/threads/membership.hpp"
#include "ddp/error.hpp"
#include "ddp/train/checkpoint.hpp"

namespace ddp {

struct ElasticOptions {
  // Below this many ranks the job ends with a CommError on every survivor, naming the ranks lost.
  int min_world_size = 1;
  // How long survivors wait for each other to regroup; a rank that has neither failed nor asked by then (stalled
  // outside ddp's collectives) is left out.
  std::chrono::milliseconds regroup_timeout{std::chrono::seconds(30)};
  ThreadsOptions threads{};
  // Each membership change, one line, on the new generation's rank 0 (default: printed to stdout).
  std::function<void(std::string const&)> log{};
};

// One membership change.
struct MembershipChange {
  std::uint64_t generation = 0;  // the new generation (1 for the first change)
  int from_world_size = 0, to_world_size = 0;
  std::vector<PeerStatus> lost{};  // the old generation's ranks (its numbering) that are not in the new one, and why
  std::int64_t step = -1;          // the global step the new generation resumed at (-1: it started over)
  double seconds = 0;              // from the first survivor's regroup to the state restored
  std::string line{};              // what was logged
};

struct ElasticReport {
  std::vector<MembershipChange> changes{};
  int final_world_size = 0;
};

namespace detail {
struct ElasticShared {
  ElasticShared(int world_size, ElasticOptions o)
      : opts(std::move(o)), membership(world_size, opts.threads, opts.min_world_size, opts.regroup_timeout) {}
  ElasticOptions opts;
  ThreadsMembership membership;
  std::mutex m;
  ElasticReport report;
};

// Whether `e`, thrown on `rank`, is a peer's failure seen here (a CommError, the group knowing of another rank lost)
// rather than this rank's own.
inline bool peer_failure(std::exception_ptr const& e, ThreadsGroup const& group, int rank) {
  try {
    std::rethrow_exception(e);
  } catch (CommError const&) {
    auto const known = group.peers().all();
    return std::any_of(known.begin(), known.end(), [&](PeerStatus const& s) { return s.rank != rank; });
  } catch (...) {}
  return false;
}
}  // namespace detail

// One rank's thread across generations: its kept states and where it stands.
class ElasticSession {
 public:
  std::uint64_t generation() const noexcept { return generation_; }
  int first_rank() const noexcept { return first_rank_; }  // its rank in generation 0

  // Keeps a copy of a training state at `global_step` (the last two are kept).
  template <class T>
  void keep(std::int64_t global_step, CheckpointData<T> state) {
    std::size_t const slot = steps_[0] == global_step || steps_[0] < steps_[1] ? 0 : 1;
    kept_[slot] = std::move(state);
    steps_[slot] = global_step;
  }
  std::int64_t latest() const noexcept { return std::max(steps_[0], steps_[1]); }
  template <class T>
  CheckpointData<T> const* kept(std::int64_t global_step) const {
    for (int s = 0; s < 2; ++s)
      if (steps_[s] == global_step && kept_[s].has_value()) return std::any_cast<CheckpointData<T>>(&kept_[s]);
    return nullptr;
  }

  // For resume_kept: this generation's change, recorded once by its rank 0.
  void note_resumed(int rank, std::int64_t step) {
    if (rank != 0 || generation_ == 0) return;
    auto const f = shared_->membership.formation(generation_ - 1);
    MembershipChange c{
        .generation = generation_,
        .from_world_size = static_cast<int>(f.new_rank.size()),
        .to_world_size = f.group ? f.group->world_size() : 0,
        .lost = f.lost,
        .step = step,
        .seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - f.first_ask).count()};
    std::string who;
    for (auto const& s : f.lost) who += detail::cat(who.empty() ? "" : ", ", "rank ", s.rank);
    std::string why;
    for (auto const& s : f.lost) why += detail::cat(why.empty() ? "" : "; ", describe_loss(s));
    c.line = step >= 0
                 ? detail::cat("ddp elastic: ", who, " lost at step ", step, " (", why, "); continuing at world size ",
                               c.to_world_size, " from step ", step, " after ", seconds_text(c.seconds))
                 : detail::cat("ddp elastic: ", who, " lost before any step (", why, "); starting over at world size ",
                               c.to_world_size, " after ", seconds_text(c.seconds));
    if (shared_->opts.log)
      shared_->opts.log(c.line);
    else {
      std::printf("%s\n", c.line.c_str());
      std::fflush(stdout);
    }
    std::lock_guard lock(shared_->m);
    shared_->report.changes.push_back(std::move(c));
  }

 private:
  template <class F>
  friend ElasticReport elastic_spawn(int, F&&, ElasticOptions const&);

  static std::string seconds_text(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f s", s);
    return buf;
  }
  static std::string describe_loss(PeerStatus const& s) {
    switch (s.state) {
      case PeerState::kFailed:
        return detail::cat("it failed: ", s.reason);
      case PeerState::kStalled:
        return detail::cat("it stalled: ", s.reason);
      case PeerState::kLeft:
        return detail::cat("it left: ", s.reason);
      case PeerState::kEnded:
        return detail::cat("it ended: ", s.reason);
    }
    return s.reason;
  }

  std::shared_ptr<detail::ElasticShared> shared_;
  std::uint64_t generation_ = 0;
  int first_rank_ = 0;
  std::array<std::any, 2> kept_{};
  std::array<std::int64_t, 2> steps_{-1, -1};
};

// What elastic training can keep without a collective: the optimizer's whole state on every rank.
template <class O>
concept KeepsLocalState = !requires(O & o) {
  o.consolidated_state();
}
&&!requires(O & o) { o.local_state(); };

// Keeps a copy of the model, the optimizer state and the position in the session (no collective).
template <nn::Model M, class O, class T = typename M::value_type>
requires CheckpointableOptimizer<O, T>
void keep_state(ElasticSession& session, M const& model, O const& opt, TrainPosition const& pos,
                std::optional<optim::GradScalerState> loss_scale = std::nullopt) {
  static_assert(KeepsLocalState<O>,
                "elastic training keeps each rank's whole optimizer state in memory: a sharded (ZeRO) optimizer or "
                "local rounds (LocalSgd, DiLoCo) would need a collective to gather theirs; use them with restarts "
                "(CheckpointSeries, --resume auto) instead");
  auto c = capture_checkpoint(model, opt, pos);
  c.loss_scale = loss_scale;
  session.keep(pos.global_step, std::move(c));
}

// Collective, in a generation after a change: restores the state kept at the earliest step every rank holds (rank
// 0's copy, sent to all) and returns its position. Nothing in generation 0, or when a rank kept nothing (the failure
// came before the first step: the body starts over). CommError on every rank when rank 0 no longer holds that step.
template <Communicator C, nn::Model M, class O, class T = typename M::value_type>
requires CheckpointableOptimizer<O, T> std::optional<TrainPosition> resume_kept(ElasticSession& session, C& comm,
                                                                                M& model, O& opt,
                                                                                RoundState<T>* round = nullptr) {
  if (session.generation() == 0) return std::nullopt;
  std::vector<std::int64_t> step{session.latest()};
  host_all_reduce(comm, std::span<std::int64_t>(step), ReduceOp::kMin, CollectiveTag{"elastic.step"});
  if (step[0] < 0) {
    session.note_resumed(comm.rank(), -1);
    return std::nullopt;
  }
  std::int64_t status = 0;
  std::string text;
  if (comm.rank() == 0) {
    if (auto const* c = session.kept<T>(step[0]))
      text = encode_checkpoint(*c);
    else
      status = static_cast<std::int64_t>(detail::Failure::kIo);
    if (status) text = detail::cat("ddp elastic: rank 0 no longer holds the state of step ", step[0]);
  }
  detail::broadcast_outcome(comm, 0, status, text);
  if (status) throw CommError(text, 0);
  TrainPosition const pos = detail::load_checkpoint_bytes(text, detail::cat("(the state kept at step ", step[0], ")"),
                                                          comm, model, opt, nullptr, round);
  session.note_resumed(comm.rank(), step[0]);
  return pos;
}

// Runs fn(ThreadsBackend&, ElasticSession&) as ranks 0..n-1, each on its own thread, as spawn does; when a rank
// fails, the survivors run fn again on a generation without it (see the top of this file). Returns the membership
// changes and the final world size. Throws when the job cannot go on (fewer survivors than min_world_size: the
// CommError naming what was lost), or a rank's own exception when every rank failed.
template <class F>
ElasticReport elastic_spawn(int world_size, F&& fn, ElasticOptions const& opts) {
  auto shared = std::make_shared<detail::ElasticShared>(world_size, opts);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world_size));
  std::vector<int> finished_in(static_cast<std::size_t>(world_size), -1);  // the world size it finished at
  auto body = [&](int first_rank) {
    ElasticSession session;
    session.shared_ = shared;
    session.first_rank_ = first_rank;
    int rank = first_rank;
    auto& error = errors[static_cast<std::size_t>(first_rank)];
    for (;;) {
      std::uint64_t const g = session.generation_;
      auto group = shared->membership.group(g);
      bool survivor = false;
      try {
        ThreadsBackend comm(group, rank);
        try {
          fn(comm, session);
          shared->membership.leave(g, rank);
          finished_in[static_cast<std::size_t>(first_rank)] = group->world_size();
          return;
        } catch (...) {  // before comm's destructor reports this rank as gone
          auto const e = std::current_exception();
          survivor = detail::peer_failure(e, *group, rank);
          if (!survivor) {
            error = e;
            group->abort(rank, detail::describe(e));
          }
        }
      } catch (...) {  // the backend could not be made
        error = std::current_exception();
        group->abort(rank, detail::describe(error));
      }
      if (!survivor) {
        shared->membership.leave(g, rank);
        return;
      }
      try {
        auto const f = shared->membership.regroup(g, rank);
        rank = f.new_rank[static_cast<std::size_t>(rank)];
        session.generation_ = g + 1;
      } catch (...) {
        error = std::current_exception();
        return;
      }
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size - 1));
  for (int r = 1; r < world_size; ++r) threads.emplace_back(body, r);
  body(0);
  for (auto& t : threads) t.join();
  int finished = 0, at = 0;
  for (int w : finished_in)
    if (w > 0) {
      ++finished;
      at = w;
    }
  if (finished == 0) {  // nobody finished: the job could not go on; the regroup's error first, else the first cause
    for (auto const& e : errors)
      if (e) try {
          std::rethrow_exception(e);
        } catch (CommError const& c) {
          if (std::string_view(c.what()).starts_with("ddp elastic:")) throw;
        } catch (...) {}
    for (auto const& e : errors)
      if (e) std::rethrow_exception(e);
  }
  std::lock_guard lock(shared->m);
  shared->report.final_world_size = at;
  return shared->report;
}
template <class F>
ElasticReport elastic_spawn(int world_size, F&& fn) {
  return elastic_spawn(world_size, std::forward<F>(fn), ElasticOptions{});
}

}  // namespace ddp
