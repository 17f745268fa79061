// In-place shrink for ranks that are processes (GlooBackend; any backend that observes its peers): run_elastic runs
// fn(Backend&, ElasticSession&) on this process's rank; when a peer is lost (killed: its connection closed; stalled
// past the deadline; failed on its own), this rank and the other survivors agree on the next generation through the
// job's store (StoreMembership), make a backend for it (keys under elastic/<g>/) and run fn again, which resumes from
// the state kept at the interrupted step's start (resume_kept, as on threads: train/elastic.hpp). A rank that fails on
// its own says so in the store, so the others need not wait for it, and its exception leaves run_elastic.
//
//   auto rv = ddp::rendezvous();
//   ddp::run_elastic(rv.store, rv.launch.rank, rv.launch.world_size,
//                    [&](std::shared_ptr<ddp::Store> store, int rank, int n) {
//                      return std::make_unique<ddp::GlooBackend>(store, rank, n, ddp::GlooOptions{}, host);
//                    },
//                    [&](ddp::GlooBackend& comm, ddp::ElasticSession& session) { ...as on threads... },
//                    {.min_world_size = 2});
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

namespace ddp {

struct ElasticStoreOptions {
  int min_world_size = 1;  // below it the job ends on every survivor, naming the ranks lost
  // How long survivors wait for each other to regroup (a rank neither asking nor known lost by then is left out).
  std::chrono::milliseconds regroup_timeout{std::chrono::seconds(30)};
  // Each membership change, one line, on the new generation's rank 0 (default: printed to stdout).
  std::function<void(std::string const&)> log{};
};

// Runs this process's rank of an elastic job; returns the changes this process logged and the world size it finished
// at. Throws this rank's own failure (after posting it), a CommError when it was left out or the survivors are fewer
// than min_world_size, or the store's failure.
template <class Make, class Body>
ElasticReport run_elastic(std::shared_ptr<Store> store, int rank, int world_size, Make&& make, Body&& fn,
                          ElasticStoreOptions const& opts = {}) {
  if (opts.min_world_size < 1 || opts.min_world_size > world_size)
    throw ArgumentError(detail::cat("elastic: min_world_size must be in [1, ", world_size, "] (the world size), got ",
                                    opts.min_world_size));
  std::signal(SIGPIPE, SIG_IGN);
  detail::StoreMembership membership(store, opts.min_world_size, opts.regroup_timeout);
  ElasticReport report;
  ElasticSession session(rank, {.joiners_waiting = {}, .max_world_size = 0, .record = [&](MembershipChange c) {
                                  if (opts.log)
                                    opts.log(c.line);
                                  else {
                                    std::printf("%s\n", c.line.c_str());
                                    std::fflush(stdout);
                                  }
                                  report.changes.push_back(std::move(c));
                                }});
  int r = rank, n = world_size;
  for (std::uint64_t g = 0;; ++g) {
    std::vector<PeerStatus> known;
    {
      auto comm = make(membership.prefix(g), r, n);
      try {
        fn(*comm, session);
        report.final_world_size = n;
        return report;
      } catch (...) {  // before the backend goes: a peer's failure, or this rank's own
        auto const e = std::current_exception();
        known = comm->peer_failures();
        bool peer = false;
        try {
          std::rethrow_exception(e);
        } catch (CommError const&) {
          peer = std::any_of(known.begin(), known.end(), [&](PeerStatus const& s) { return s.rank != r; });
        } catch (...) {}
        if (!peer) {
          // No peer known lost: maybe the store is what went (rank 0 serving it ended). Without it the ranks cannot
          // regroup: say so, naming the store, rather than a collective's error.
          try {
            (void)store->check({"elastic/alive"});
          } catch (std::exception const& lost) {
            throw CommError(detail::cat("ddp elastic: rank ", r, " of ", n, " lost the job's store (",
                                        store->describe(), ": ", lost.what(),
                                        "): its host ended (rank 0, when rank 0 serves it), and the ranks cannot "
                                        "regroup without it; to survive losing rank 0, keep the store elsewhere "
                                        "(DDP_STORE_FILE, torchrun's agent). The collective's error: ",
                                        detail::describe(e)),
                            r);
          }
          membership.post_failed(g, r, detail::describe(e));
          throw;
        }
      }
    }
    auto const f = membership.regroup(g, r, n, known);
    ElasticSession::Change change{
        .from_world_size = n, .to_world_size = f.world_size, .lost = f.lost, .joined = {}, .since = f.since};
    r = f.rank;
    n = f.world_size;
    session.begin_generation(g + 1, std::move(change));
  }
}

}  // namespace ddp
