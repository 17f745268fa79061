// The jobs' elastic training over Gloo, spelt once: the flags (--elastic, --min-world-size, --max-world-size,
// --wait-for-joiners, --join), their checks, and the launch: run_elastic on the launcher's rank, or join_elastic for
// a process started with --join. What a joiner must share with the job: the binary (always), the model
// (model_identity, given by the job) and every flag but those of one process alone.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ddp/comm/gloo.hpp>
#include <ddp/comm/rendezvous/rendezvous.hpp>
#include <ddp/train/elastic_identity.hpp>
#include <ddp/train/elastic_store.hpp>

#include "examples/common/flags.hpp"
#include "examples/common/launch.hpp"

namespace ddp::examples {

struct ElasticChoice {
  bool on = false;                             // --elastic
  int min_world_size = 1, max_world_size = 0;  // --min-world-size, --max-world-size (0: no joiners)
  std::chrono::milliseconds join_timeout{0};   // --wait-for-joiners
  bool join = false;                           // --join: a process joining a running job
  JobIdentity flags{};                         // what a joiner must share with the job: the flags
};

inline Flags& add_elastic_flags(Flags& f) {
  return f
      .add("elastic", "false",
           "with --backend gloo: a rank that is lost (killed, its connection closed, stalled past --timeout, failed) "
           "is dropped and the others go on without a restart, from the interrupted step's start kept in memory "
           "(bitwise with --deterministic)")
      .add("min-world-size", "1",
           "with --elastic: below this many ranks the job waits --wait-for-joiners seconds for processes started "
           "with --join, then ends, naming the ranks lost")
      .add("max-world-size", "0",
           "with --elastic: processes started with --join are admitted at step boundaries up to this many ranks "
           "(0: none are)")
      .add("wait-for-joiners", "0",
           "with --elastic and --max-world-size: below --min-world-size, how many seconds the survivors wait for "
           "joiners before the job ends")
      .add("join", "false",
           "join a running --elastic job (no RANK/WORLD_SIZE; its MASTER_ADDR/MASTER_PORT or DDP_STORE_FILE, and "
           "the same flags and binary as its ranks: a difference is refused, by name). Admitted at the next step "
           "boundary while the job has fewer than --max-world-size ranks; waits up to --timeout for it");
}

// Parses and checks the elastic flags; `local`: the --local-sgd/--diloco flag in use ("" if none); `zero`: --zero's
// stage; `checkpoints`: whether --checkpoint writes. ArgumentError naming the flag.
inline ElasticChoice elastic_choice(Flags const& f, Backend backend, std::string const& local, int zero,
                                    bool checkpoints) {
  std::string const p = f.program();
  ElasticChoice c;
  c.on = f.boolean("elastic");
  c.min_world_size = static_cast<int>(f.at_least("min-world-size", 1));
  c.max_world_size = static_cast<int>(f.at_least("max-world-size", 0));
  c.join = f.boolean("join");
  double const wait = f.real("wait-for-joiners");
  if (!(wait >= 0))
    throw ArgumentError(
        detail::cat(p, ": --wait-for-joiners must be 0 or more seconds, got ", f.str("wait-for-joiners")));
  c.join_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(wait * 1000));
  for (char const* name : {"min-world-size", "max-world-size", "wait-for-joiners", "join"})
    if (f.is_set(name) && !c.on) throw ArgumentError(detail::cat(p, ": --", name, " is for --elastic"));
  if (!c.on) return c;
  if (backend == Backend::kMpi)
    throw ArgumentError(detail::cat(p,
                                    ": --elastic with --backend mpi: MPICH cannot shrink a communicator; MPI jobs "
                                    "recover by restarting: --checkpoint FILE --resume auto, and mpirun again"));
  if (backend == Backend::kThreads)
    throw ArgumentError(detail::cat(p,
                                    ": --elastic is for --backend gloo (ranks that are processes, which can be lost); "
                                    "on threads see //examples:elastic (ElasticThreads)"));
  if (!local.empty())
    throw ArgumentError(detail::cat(p, ": --elastic with ", local,
                                    ": the replicas are not kept in memory; use --checkpoint with --resume auto"));
  if (zero > 0 && !checkpoints)
    throw ArgumentError(detail::cat(p, ": --elastic with --zero ", zero,
                                    " needs --checkpoint FILE (with --checkpoint-every K): a lost rank's optimizer "
                                    "shard comes back from the newest checkpoint"));
  if (c.join_timeout.count() > 0 && c.max_world_size == 0)
    throw ArgumentError(detail::cat(p,
                                    ": --wait-for-joiners waits for processes started with --join, which a job "
                                    "without --max-world-size never admits; set --max-world-size too"));
  if (c.join && f.is_set("world-size"))
    throw ArgumentError(
        detail::cat(p, ": --join takes its rank and the world size from the job it joins; drop --world-size"));
  // (every flag but those of this process alone: a joiner compares them with the job's)
  for (auto const& [name, value] :
       f.values({"join", "world-size", "timeout", "trace", "out", "data-dir", "data", "calibration-cache", "resume"}))
    c.flags.push_back({detail::cat("flag --", name), value.empty() ? "(its default)" : value});
  return c;
}

// Runs this process's part of an elastic job over Gloo: a rank of the launcher's (run_elastic), or, with --join, a
// process admitted into the running job (join_elastic). body(GlooBackend&, ElasticSession&) is the job's rank, run
// once per generation. `model`: the model's identity (model_identity). Returns the exit code (errors printed,
// naming the rank or the joiner).
template <class Body>
int run_elastic_job(ElasticChoice const& e, LaunchChoice const& launch, IdentityItem model, Body&& body) {
  int rank = -1;
  try {
    JobIdentity identity{std::move(model)};
    identity.insert(identity.end(), e.flags.begin(), e.flags.end());
    std::string host;
    auto make = [&](std::shared_ptr<Store> store, int r, int n) {
      return std::make_unique<GlooBackend>(std::move(store), r, n, GlooOptions{.timeout = launch.timeout}, host);
    };
    ElasticStoreOptions const opts{.min_world_size = e.min_world_size,
                                   .max_world_size = e.max_world_size,
                                   .join_timeout = e.join_timeout,
                                   .regroup_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
                                       detail::resolve(launch.timeout, GlooBackend::backend_name).timeout),
                                   .identity = identity,
                                   .log = {}};
    if (e.join) {
      Rendezvous rv = join_rendezvous({.timeout = launch.timeout.after});
      host = GlooBackend::default_host(rv.master_addr);
      (void)join_elastic(rv.store, make, body, rv.timeout, opts);
      return 0;
    }
    Rendezvous rv = rendezvous({.timeout = launch.timeout.after});
    rank = rv.launch.rank;
    if (launch.world_size != 0 && launch.world_size != rv.launch.world_size)
      throw ArgumentError(detail::cat("--world-size ", launch.world_size, " does not match the launcher's ",
                                      rv.launch.world_size, " ranks (WORLD_SIZE)"));
    host = GlooBackend::default_host(rv.master_addr);
    (void)run_elastic(rv.store, rv.launch.rank, rv.launch.world_size, make, body, opts);
  } catch (std::exception const& err) {
    std::fprintf(stderr, "error: %s%s\n",
                 e.join      ? "joiner: "
                 : rank >= 0 ? detail::cat("rank ", rank, ": ").c_str()
                             : "",
                 err.what());
    return 1;
  }
  return 0;
}

}  // namespace ddp::examples
