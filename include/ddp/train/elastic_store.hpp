// Elastic training for ranks that are processes (GlooBackend; any backend that observes its peers). run_elastic runs
// fn(Backend&, ElasticSession&) on this process's rank. When a peer is lost (killed: its connection closed; stalled
// past the deadline; failed on its own), this rank and the other survivors agree on the next generation through the
// job's store (StoreMembership), make a backend for it (keys under elastic/<g>/) and run fn again, which resumes from
// the state kept at the interrupted step's start (resume_kept, as on threads: train/elastic.hpp). A rank that fails on
// its own says so in the store, so the others need not wait for it, and its exception leaves run_elastic.
// With max_world_size above the world size, a process started with join_elastic (another process of the same program,
// pointed at the same store) is admitted at the next step boundary (admit_joiners, in the body's elastic_step): the
// ranks regroup with it, and resume_kept sends it the state. A joiner whose identity (the binary, plus what the job
// adds: its model, its flags) differs from the job's is refused before anything else, naming the difference.
//
//   auto rv = ddp::rendezvous();
//   auto make = [&](std::shared_ptr<ddp::Store> store, int rank, int n) {
//     return std::make_unique<ddp::GlooBackend>(store, rank, n, ddp::GlooOptions{}, host);
//   };
//   auto body = [&](ddp::GlooBackend& comm, ddp::ElasticSession& session) { ...as on threads... };
//   ddp::run_elastic(rv.store, rv.launch.rank, rv.launch.world_size, make, body,
//                    {.min_world_size = 2, .max_world_size = 4, .identity = {ddp::model_identity(model)}});
//   // elsewhere, later: a process that joins (no RANK; the store from join_rendezvous())
//   ddp::join_elastic(ddp::join_rendezvous().store, make, body, std::chrono::minutes(5),
//                     {.identity = {ddp::model_identity(model)}});
//
// A peer killed mid-collective leaves sockets whose next write raises SIGPIPE, which would end this process silently
// (Gloo's TCP transport writes without MSG_NOSIGNAL): run_elastic ignores SIGPIPE for the process, so the write fails
// with EPIPE and the loss is handled like any other.
// The store must outlive the ranks that can be lost: a file store (DDP_STORE_FILE), torchrun's agent, or rank 0's
// TCP store while rank 0 lives (losing rank 0 there loses the store: every survivor then fails, naming it).
#pragma once

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/peer_status.hpp"
#include "ddp/comm/rendezvous/store.hpp"
#include "ddp/comm/rendezvous/store_membership.hpp"
#include "ddp/error.hpp"
#include "ddp/train/elastic.hpp"
#include "ddp/train/elastic_identity.hpp"

namespace ddp {

struct ElasticStoreOptions {
  // Below this many ranks the survivors wait up to join_timeout for joiners (when max_world_size admits them); still
  // below it, the job ends on every survivor, naming the ranks lost.
  int min_world_size = 1;
  // Processes that join (join_elastic) are admitted at step boundaries up to this many ranks (0: none are; then the
  // step boundary costs nothing). The job's first world size or more.
  int max_world_size = 0;
  std::chrono::milliseconds join_timeout{0};
  // How long survivors wait for each other to regroup (a rank neither asking nor known lost by then is left out).
  std::chrono::milliseconds regroup_timeout{std::chrono::seconds(30)};
  // What a joiner must share with the job, besides the binary (binary_identity(), always compared): e.g.
  // model_identity(model) and the flags that shape the run. Given on the job's ranks and on the joiners alike.
  JobIdentity identity{};
  // Each membership change, one line, on the new generation's rank 0 (default: printed to stdout).
  std::function<void(std::string const&)> log{};
};

namespace detail {

// One process's rank across generations, from `generation` on (0: from the start; a joiner: the one it was admitted
// to). Returns the changes this process logged and the world size it finished at.
template <class Make, class Body>
ElasticReport run_generations(std::shared_ptr<Store> const& store, StoreMembership& membership,
                              ElasticStoreOptions const& opts, int first_rank, std::uint64_t generation, int rank,
                              int world_size, std::optional<ElasticSession::Change> joined, Make& make, Body& fn) {
  std::signal(SIGPIPE, SIG_IGN);
  ElasticReport report;
  int r = rank, n = world_size;
  ElasticSession session(first_rank,
                         {.joiners_waiting = [&] { return r == 0 ? membership.pending() : std::int64_t{0}; },
                          .max_world_size = opts.max_world_size,
                          .record =
                              [&](MembershipChange c) {
                                if (opts.log)
                                  opts.log(c.line);
                                else {
                                  std::printf("%s\n", c.line.c_str());
                                  std::fflush(stdout);
                                }
                                report.changes.push_back(std::move(c));
                              }});
  if (joined) session.begin_generation(generation, std::move(*joined));
  // Without the store the ranks cannot regroup: say so, naming it, rather than a collective's error.
  auto need_store = [&](std::exception_ptr const& e) {
    try {
      (void)store->check({"elastic/alive"});
    } catch (std::exception const& lost) {
      throw CommError(
          cat("ddp elastic: rank ", r, " of ", n, " lost the job's store (", store->describe(), ": ", lost.what(),
              "): its host ended (rank 0, when rank 0 serves it), and the ranks cannot regroup without "
              "it; to survive losing rank 0, keep the store elsewhere (DDP_STORE_FILE, torchrun's agent). "
              "The collective's error: ",
              describe(e)),
          r);
    }
  };
  for (std::uint64_t g = generation;; ++g) {
    std::vector<PeerStatus> known;
    std::exception_ptr not_made;  // the backend of generation g could not be made: a member never came (a joiner
                                  // that died before connecting), or this rank cannot connect at all
    {
      decltype(make(membership.prefix(g), r, n)) comm;
      try {
        comm = make(membership.prefix(g), r, n);
      } catch (CommError const&) {
        not_made = std::current_exception();
        need_store(not_made);
      }
      if (comm) try {
          fn(*comm, session);
          membership.post_ended();
          report.final_world_size = n;
          return report;
        } catch (...) {  // before the backend goes: a peer's failure, joiners to admit, or this rank's own failure
          auto const e = std::current_exception();
          known = comm->peer_failures();
          bool regroup = false;
          try {
            std::rethrow_exception(e);
          } catch (ElasticRegroup const&) {
            regroup = true;
          } catch (CommError const&) {
            regroup = std::any_of(known.begin(), known.end(), [&](PeerStatus const& s) { return s.rank != r; });
          } catch (...) {}
          if (!regroup) {
            need_store(e);  // no peer known lost: maybe the store is what went (rank 0 serving it ended)
            membership.post_failed(g, r, describe(e));
            throw;
          }
        }
    }
    auto const f = membership.regroup(g, r, n, known);
    // Every member asked again and none joined: the backend fails for a reason of its own, not a missing member.
    if (not_made && f.lost.empty() && f.joined.empty()) std::rethrow_exception(not_made);
    ElasticSession::Change change{
        .from_world_size = n, .to_world_size = f.world_size, .lost = f.lost, .joined = f.joined, .since = f.since};
    r = f.rank;
    n = f.world_size;
    session.begin_generation(g + 1, std::move(change));
  }
}

inline StoreMembershipOptions membership_options(ElasticStoreOptions const& o) {
  return {.min_world_size = o.min_world_size,
          .max_world_size = o.max_world_size,
          .regroup_timeout = o.regroup_timeout,
          .join_timeout = o.join_timeout};
}

inline JobIdentity with_binary(JobIdentity id) {
  id.insert(id.begin(), binary_identity());
  return id;
}

}  // namespace detail

// Runs this process's rank of an elastic job; returns the changes this process logged and the world size it finished
// at. Throws this rank's own failure (after posting it), a CommError when it was left out or the survivors are fewer
// than min_world_size, or the store's failure.
template <class Make, class Body>
ElasticReport run_elastic(std::shared_ptr<Store> store, int rank, int world_size, Make&& make, Body&& fn,
                          ElasticStoreOptions const& opts = {}) {
  if (opts.min_world_size < 1 || opts.min_world_size > world_size)
    throw ArgumentError(detail::cat("elastic: min_world_size must be in [1, ", world_size, "] (the world size), got ",
                                    opts.min_world_size));
  if (opts.max_world_size != 0 && opts.max_world_size < world_size)
    throw ArgumentError(detail::cat("elastic: max_world_size must be 0 (no joiners) or at least the world size ",
                                    world_size, ", got ", opts.max_world_size));
  if (opts.join_timeout.count() > 0 && opts.max_world_size == 0)
    throw ArgumentError(
        detail::cat("elastic: join_timeout (", opts.join_timeout.count(),
                    " ms) waits for joiners, which a job without max_world_size never admits; set max_world_size too"));
  detail::StoreMembership membership(store, detail::membership_options(opts));
  if (rank == 0) membership.publish(detail::with_binary(opts.identity), world_size);
  return detail::run_generations(store, membership, opts, rank, 0, rank, world_size, std::nullopt, make, fn);
}

// Joins a running elastic job through its store (join_rendezvous()): refused with an ArgumentError naming the first
// difference when this process's identity (its binary, and opts.identity) is not the job's, or when the job admits no
// joiners; a CommError when it is not admitted within `wait` or the job ends first. Once admitted at a step boundary it
// runs fn as the job's ranks do, from the state they send (resume_kept), and returns as run_elastic does.
template <class Make, class Body>
ElasticReport join_elastic(std::shared_ptr<Store> store, Make&& make, Body&& fn, std::chrono::milliseconds wait,
                           ElasticStoreOptions const& opts = {}) {
  detail::StoreMembership membership(store, detail::membership_options(opts));
  auto const a = membership.join(detail::with_binary(opts.identity), wait);
  ElasticStoreOptions job = opts;  // the job's bounds and deadlines, so that this rank decides as the others do
  job.min_world_size = membership.options().min_world_size;
  job.max_world_size = membership.options().max_world_size;
  job.join_timeout = membership.options().join_timeout;
  job.regroup_timeout = membership.options().regroup_timeout;
  ElasticSession::Change change{
      .from_world_size = static_cast<int>(a.formation.members.size()) + static_cast<int>(a.formation.lost.size()),
      .to_world_size = a.formation.world_size,
      .lost = a.formation.lost,
      .joined = a.formation.joined,
      .since = a.formation.since};
  return detail::run_generations(store, membership, job, a.id, a.generation, a.formation.rank, a.formation.world_size,
                                 std::optional(std::move(change)), make, fn);
}

}  // namespace ddp
