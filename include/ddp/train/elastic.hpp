// Elastic training in place, on the threads backend: a rank that fails (throws, e.g. std::bad_alloc, or stalls past
// the deadline) is dropped and the others go on at N-1 without a restart, from the state at the start of the step it
// interrupted, kept in memory; a rank added with ElasticThreads::add_rank joins at the next step boundary.
//
//   ddp::ElasticThreads job(4, [&](ddp::ThreadsBackend& comm, ddp::ElasticSession& session) {
//     auto model = make_model();
//     ddp::basic_trainer<...> t(model, comm, ...);
//     ddp::TrainPosition pos;
//     if (auto p = t.resume_kept(session)) pos = *p;       // after a change: the interrupted step's start
//     ... t.fit_epoch(data, {...from pos...}, loss, {.before_step = [&](ddp::StepPosition const& p) {
//           t.elastic_step(session, p);                     // keep the state; admit joiners
//         }});
//   }, {.min_world_size = 2, .max_world_size = 4});
//   job.add_rank();
//   auto report = job.wait();
//
// The body runs once per generation on every rank's thread: it builds its model and trainer on the generation's
// ThreadsBackend and resumes from what was kept. keep_state copies the model, the optimizer state and the position
// (capture_checkpoint: no collective, so a failing peer cannot stall it) and keeps the last two; admit_joiners agrees
// at the step boundary on admitting ranks that asked (one all-reduce, only when the job may grow). resume_kept
// (collective, in the new generation) agrees on the earliest step every holder still has, has rank 0 send its copy,
// and loads it as load_checkpoint loads a file at another world size. In deterministic mode (ExactSum with
// MicroBatches) every later step's weights are bitwise those of the run that never changed; with another reduction,
// within float reordering. Each change is one line ("ddp elastic: rank 2 lost at step 5 (it failed: std::bad_alloc);
// continuing at world size 3 from step 5 after 0.02 s") and an entry of the report. Ranks that are processes use
// run_elastic (train/elastic_store.hpp) with the same ElasticSession.
// Not kept: local rounds' replicas (refused at compile time) and ZeRO stage 1/2 shards (refused when kept: gathering
// either needs a collective; the main job takes those from its newest checkpoint instead), the gradient wire's state
// (PowerSGD's starts again) and the interrupted epoch's loss so far (its report then covers the steps from the
// resumption on).
#pragma once

#include <algorithm>
#include <any>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
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
  // Below this many ranks the survivors wait up to join_timeout for ranks added with ElasticThreads::add_rank to make
  // up the difference; still below it, the job ends with a CommError on every survivor, naming the ranks lost.
  int min_world_size = 1;
  std::chrono::milliseconds join_timeout{0};
  // How long survivors wait for each other to regroup; a rank that has neither failed nor asked by then (stalled
  // outside ddp's collectives) is left out.
  std::chrono::milliseconds regroup_timeout{std::chrono::seconds(30)};
  // Ranks added with ElasticThreads::add_rank are admitted at the next step boundary up to this many (0: the starting
  // world size, no growth; then the step boundary costs nothing).
  int max_world_size = 0;
  ThreadsOptions threads{};
  // Each membership change, one line, on the new generation's rank 0 (default: printed to stdout).
  std::function<void(std::string const&)> log{};
};

// One membership change.
struct MembershipChange {
  std::uint64_t generation = 0;  // the new generation (1 for the first change)
  int from_world_size = 0, to_world_size = 0;
  std::vector<PeerStatus> lost{};  // the old generation's ranks (its numbering) that are not in the new one, and why
  std::vector<int> joined{};       // the new generation's ranks that joined it
  std::int64_t step = -1;          // the global step the new generation resumed at (-1: it started over)
  double seconds = 0;              // from the first survivor's regroup to the state restored
  std::string line{};              // what was logged
};

struct ElasticReport {
  std::vector<MembershipChange> changes{};
  std::vector<std::string> not_admitted{};  // ranks added that never joined (the job ended first), each with why
  int final_world_size = 0;
};

namespace detail {
struct ElasticShared {
  ElasticShared(int world_size, ElasticOptions o)
      : opts(std::move(o)),
        membership(world_size, opts.threads, opts.min_world_size,
                   opts.max_world_size > 0 ? opts.max_world_size : world_size, opts.regroup_timeout,
                   opts.join_timeout) {}
  int max_world_size() const noexcept { return opts.max_world_size; }
  void record(MembershipChange c) {  // logs the change's line and keeps it for the report
    if (opts.log)
      opts.log(c.line);
    else {
      std::printf("%s\n", c.line.c_str());
      std::fflush(stdout);
    }
    std::lock_guard lock(m);
    report.changes.push_back(std::move(c));
  }

  ElasticOptions opts;
  ThreadsMembership membership;
  std::mutex m;
  ElasticReport report;
};

// What the ranks throw, together, at a step boundary where they agreed to admit joiners: elastic_spawn's ranks then
// ask for the next generation as survivors do.
struct ElasticRegroup {};

// Whether `e`, thrown on `rank`, is a peer's failure seen here (a CommError, the group knowing of another rank lost)
// rather than this rank's own.
inline bool peer_failure(std::exception_ptr const& e, ThreadsGroup const& group, int rank) {
  try {
    std::rethrow_exception(e);
  } catch (ElasticRegroup const&) {
    return true;
  } catch (CommError const&) {
    auto const known = group.peers().all();
    return std::any_of(known.begin(), known.end(), [&](PeerStatus const& s) { return s.rank != rank; });
  } catch (...) {}
  return false;
}
}  // namespace detail

// One rank across generations: its kept states and where it stands. A runner of generations (ElasticThreads here;
// one over processes can do the same) makes one per rank and calls begin_generation when the rank enters a new one.
class ElasticSession {
 public:
  // What the runner provides: joiners waiting (none: no growth), the most ranks the job may have, and where each
  // membership change goes (logged as one line, recorded for the report).
  struct Runner {
    std::function<std::int64_t()> joiners_waiting{};
    int max_world_size = 0;
    std::function<void(MembershipChange)> record{};
  };
  // The change that made a generation, as the runner saw it form.
  struct Change {
    int from_world_size = 0, to_world_size = 0;
    std::vector<PeerStatus> lost{};                 // old numbering
    std::vector<int> joined{};                      // new numbering
    std::chrono::steady_clock::time_point since{};  // when the first rank asked for it
  };

  ElasticSession(int first_rank, Runner runner) : first_rank_(first_rank), runner_(std::move(runner)) {}
  void begin_generation(std::uint64_t generation, Change change) {
    generation_ = generation;
    change_ = std::move(change);
  }

  std::uint64_t generation() const noexcept { return generation_; }
  int first_rank() const noexcept { return first_rank_; }  // its rank in generation 0 (a joiner: its id)

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

  // For admit_joiners: whether the job may grow past `world_size`, and how many ranks wait to join.
  bool may_grow(int world_size) const noexcept { return runner_.max_world_size > world_size; }
  std::int64_t joiners_waiting() const { return runner_.joiners_waiting ? runner_.joiners_waiting() : 0; }

  // The change that made this generation while it has not resumed yet (note_resumed), else nothing.
  std::optional<Change> const& pending_change() const noexcept { return change_; }
  // The membership changes this rank went through (its own view: its seconds), oldest first.
  std::vector<MembershipChange> const& changes() const noexcept { return changes_; }

  // For resume_kept: this generation's change, kept by every rank (changes()) and recorded (logged) by its rank 0.
  void note_resumed(int rank, std::int64_t step) {
    if (!change_) return;
    auto const& f = *change_;
    MembershipChange c{.generation = generation_,
                       .from_world_size = f.from_world_size,
                       .to_world_size = f.to_world_size,
                       .lost = f.lost,
                       .joined = f.joined,
                       .step = step,
                       .seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - f.since).count()};
    std::string what;  // "rank 2 lost at step 5 (it failed: ...)", "rank 3 joined at step 8"
    std::string const at = step >= 0 ? detail::cat(" at step ", step) : std::string(" before any step");
    if (!f.lost.empty()) {
      std::string who, why;
      for (auto const& s : f.lost) who += detail::cat(who.empty() ? "" : ", ", "rank ", s.rank);
      for (auto const& s : f.lost) why += detail::cat(why.empty() ? "" : "; ", describe_loss(s));
      what = detail::cat(who, " lost", at, " (", why, ")");
    }
    if (!c.joined.empty()) {
      std::string who;
      for (int r : c.joined) who += detail::cat(who.empty() ? "" : ", ", "rank ", r);
      what += detail::cat(what.empty() ? "" : "; ", who, " joined", f.lost.empty() ? at : std::string());
    }
    if (what.empty()) what = "a joiner withdrew before it was admitted";  // (the ranks regrouped for it)
    c.line = detail::cat("ddp elastic: ", what, "; continuing at world size ", c.to_world_size,
                         step >= 0 ? detail::cat(" from step ", step) : std::string(" from the start"), " after ",
                         seconds_text(c.seconds));
    change_.reset();
    changes_.push_back(c);
    if (rank == 0 && runner_.record) runner_.record(std::move(c));
  }

 private:
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

  std::uint64_t generation_ = 0;
  int first_rank_ = 0;
  Runner runner_;
  std::optional<Change> change_;
  std::vector<MembershipChange> changes_;
  std::array<std::any, 2> kept_{};
  std::array<std::int64_t, 2> steps_{-1, -1};
};

// What elastic training can keep without a collective: every rank's whole optimizer state (not local rounds'
// replicas; a ZeroRedundancyOptimizer only at stage 0, checked when kept).
template <class O>
concept KeepsLocalState = !requires(O & o) {
  o.local_state();
};

// Keeps a copy of the model, the optimizer state and the position in the session (no collective). ArgumentError for a
// sharded optimizer (ZeRO stage 1 or 2: this rank holds only its shard).
template <nn::Model M, class O, class T = typename M::value_type>
requires CheckpointableOptimizer<O, T>
void keep_state(ElasticSession& session, M const& model, O const& opt, TrainPosition const& pos,
                std::optional<optim::GradScalerState> loss_scale = std::nullopt, std::string_view extra = {}) {
  static_assert(KeepsLocalState<O>,
                "elastic training keeps each rank's whole optimizer state in memory: local rounds (LocalSgd, DiLoCo) "
                "would need a collective to gather their replicas; use them with restarts (CheckpointSeries, "
                "--resume auto) instead");
  if constexpr (requires { opt.sharded(); })
    if (opt.sharded())
      throw ArgumentError(
          "elastic training keeps each rank's whole optimizer state in memory, and under ZeRO stage 1 or 2 a rank "
          "holds only its shard (a lost rank's shard would be lost with it); use stage 0, or restarts "
          "(CheckpointSeries, --resume auto)");
  auto c = capture_checkpoint(model, opt, pos, extra);
  c.loss_scale = loss_scale;
  session.keep(pos.global_step, std::move(c));
}

// Collective, in a generation after a change: restores the state kept at the earliest step every rank holds (rank
// 0's copy, sent to all) and returns its position. Nothing in generation 0, or when a rank kept nothing (the failure
// came before the first step: the body starts over). CommError on every rank when rank 0 no longer holds that step.
template <Communicator C, nn::Model M, class O, class T = typename M::value_type>
requires CheckpointableOptimizer<O, T> std::optional<TrainPosition> resume_kept(ElasticSession& session, C& comm,
                                                                                M& model, O& opt,
                                                                                RoundState<T>* round = nullptr,
                                                                                std::string* extra = nullptr) {
  if (session.generation() == 0) return std::nullopt;
  // The earliest step every rank that holds a state has (a joiner holds none; the survivors come first, so rank 0
  // holds one unless nobody does).
  constexpr auto kNone = std::numeric_limits<std::int64_t>::max();
  std::vector<std::int64_t> step{session.latest() >= 0 ? session.latest() : kNone};
  host_all_reduce(comm, std::span<std::int64_t>(step), ReduceOp::kMin, CollectiveTag{"elastic.step"});
  if (step[0] == kNone) step[0] = -1;
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
                                                          comm, model, opt, extra, round);
  session.note_resumed(comm.rank(), step[0]);
  return pos;
}

// Collective, at a step boundary (after keep_state): when ranks have asked to join (ElasticThreads::add_rank) and the
// job may grow, every rank agrees on it here and leaves this generation together, for the next one with the joiners.
// One all-reduce of a word when growth is possible (ElasticOptions::max_world_size above the world size), none
// otherwise.
template <Communicator C>
void admit_joiners(ElasticSession& session, C& comm) {
  if (!session.may_grow(comm.world_size())) return;
  std::vector<std::int64_t> asked{session.joiners_waiting()};
  host_all_reduce(comm, std::span<std::int64_t>(asked), ReduceOp::kMax, CollectiveTag{"elastic.join"});
  if (asked[0] > 0) throw detail::ElasticRegroup{};
}

// An elastic job of in-process ranks: fn(ThreadsBackend&, ElasticSession&) runs as ranks 0..n-1, each on its own
// thread, as spawn runs them; when a rank fails, the survivors run fn again on a generation without it, and add_rank
// starts a thread that joins at the next step boundary (see the top of this file). wait() returns the membership
// changes and the final world size.
class ElasticThreads {
 public:
  using Body = std::function<void(ThreadsBackend&, ElasticSession&)>;

  ElasticThreads(int world_size, Body fn, ElasticOptions const& opts = {})
      : shared_(std::make_shared<detail::ElasticShared>(world_size, opts)), fn_(std::move(fn)) {
    std::lock_guard lock(m_);
    for (int r = 0; r < world_size; ++r) start(r, [this, r] { run(r, 0, r); });
  }
  ElasticThreads(ElasticThreads const&) = delete;
  ElasticThreads& operator=(ElasticThreads const&) = delete;
  ~ElasticThreads() {
    try {
      join_all();
    } catch (...) {}
  }

  // Starts a new rank that asks to join; it is admitted at the next step boundary (admit_joiners) while the world
  // size is below ElasticOptions::max_world_size. Returns its id (its ElasticSession::first_rank()).
  int add_rank() {
    std::lock_guard lock(m_);
    int const id = static_cast<int>(threads_.size());
    start(id, [this, id] {
      try {
        auto const [f, generation] = shared_->membership.join(id);
        int rank = -1;
        for (auto const& [who, at] : f.joined)
          if (who == id) rank = at;
        run(id, generation, rank);
      } catch (std::exception const& e) {
        std::lock_guard report_lock(shared_->m);
        shared_->report.not_admitted.push_back(e.what());
      }
    });
    return id;
  }

  // Waits for every rank's thread. Throws when the job could not go on (fewer ranks than min_world_size: the
  // CommError naming what was lost), or a rank's own exception when no rank finished.
  ElasticReport wait() {
    join_all();
    std::lock_guard lock(m_);
    bool any_finished = false;
    int at = 0;
    for (int w : finished_in_)
      if (w > 0) {
        any_finished = true;
        at = w;
      }
    if (!any_finished) {
      for (auto const& e : errors_)  // the regroup's verdict first
        if (e) try {
            std::rethrow_exception(e);
          } catch (CommError const& c) {
            if (std::string_view(c.what()).starts_with("ddp elastic:")) throw;
          } catch (...) {}
      for (auto const& e : errors_)
        if (e) std::rethrow_exception(e);
    }
    std::lock_guard report_lock(shared_->m);
    shared_->report.final_world_size = at;
    return shared_->report;
  }

 private:
  template <class F>
  void start(int id, F&& f) {  // holding m_
    errors_.resize(static_cast<std::size_t>(id) + 1);
    finished_in_.resize(static_cast<std::size_t>(id) + 1, -1);
    threads_.emplace_back(std::forward<F>(f));
  }
  std::exception_ptr& error(int id) {
    std::lock_guard lock(m_);
    return errors_[static_cast<std::size_t>(id)];
  }
  void join_all() {
    for (std::size_t k = 0;; ++k) {  // add_rank may add threads meanwhile
      std::thread t;
      {
        std::lock_guard lock(m_);
        if (k >= threads_.size()) return;
        if (!threads_[k].joinable()) continue;
        t = std::move(threads_[k]);
      }
      t.join();
    }
  }

  // One rank's life from `generation` on, as `rank` of it.
  void run(int id, std::uint64_t generation, int rank) {
    ElasticSession session(id, {.joiners_waiting = [m = &shared_->membership] { return m->waiting(); },
                                .max_world_size = shared_->max_world_size(),
                                .record = [s = shared_](MembershipChange c) { s->record(std::move(c)); }});
    if (generation > 0) session.begin_generation(generation, change_of(shared_->membership.formation(generation - 1)));
    for (;;) {
      std::uint64_t const g = session.generation();
      auto group = shared_->membership.group(g);
      bool survivor = false;
      std::exception_ptr own;
      try {
        ThreadsBackend comm(group, rank);
        try {
          fn_(comm, session);
          shared_->membership.leave(g, rank);
          std::lock_guard lock(m_);
          finished_in_[static_cast<std::size_t>(id)] = group->world_size();
          return;
        } catch (...) {  // before comm's destructor reports this rank as gone
          auto const e = std::current_exception();
          survivor = detail::peer_failure(e, *group, rank);
          if (!survivor) {
            own = e;
            group->abort(rank, detail::describe(e));
          }
        }
      } catch (...) {  // the backend could not be made
        own = std::current_exception();
        group->abort(rank, detail::describe(own));
      }
      if (!survivor) {
        error(id) = own;
        shared_->membership.leave(g, rank);
        return;
      }
      try {
        auto const f = shared_->membership.regroup(g, rank);
        rank = f.new_rank[static_cast<std::size_t>(rank)];
        session.begin_generation(g + 1, change_of(f));
      } catch (...) {
        error(id) = std::current_exception();
        return;
      }
    }
  }

  static ElasticSession::Change change_of(detail::ThreadsMembership::Formation const& f) {
    ElasticSession::Change c{.from_world_size = static_cast<int>(f.new_rank.size()),
                             .to_world_size = f.group ? f.group->world_size() : 0,
                             .lost = f.lost,
                             .joined = {},
                             .since = f.first_ask};
    for (auto const& j : f.joined) c.joined.push_back(j.second);
    return c;
  }

  std::shared_ptr<detail::ElasticShared> shared_;
  Body fn_;
  std::mutex m_;
  // Per id (deques: add_rank grows them while threads hold references into them).
  std::deque<std::thread> threads_;
  std::deque<std::exception_ptr> errors_;
  std::deque<int> finished_in_;  // the world size it finished at (-1: it did not)
};

// ElasticThreads(world_size, fn, opts).wait(): an elastic job without joiners.
template <class F>
ElasticReport elastic_spawn(int world_size, F&& fn, ElasticOptions const& opts = {}) {
  ElasticThreads job(world_size, std::forward<F>(fn), opts);
  return job.wait();
}

}  // namespace ddp
