// ddp::rendezvous(): how ranks launched without MPI find each other, chosen from the environment.
//   torchrun        RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
//                   TORCHELASTIC_USE_AGENT_STORE=True: the agent serves a TCPStore on MASTER_PORT; every rank
//                   joins it as a client (keys under ddp/attempt_<TORCHELASTIC_RESTART_COUNT>/).
//   env             the same variables without the agent (a hand-written launcher, a container entry point):
//                   rank 0 serves the TCPStore on MASTER_PORT, as PyTorch's env:// init does.
//   file            DDP_STORE_FILE=<directory every rank sees> (Slurm's srun without MPI: ranks from SLURM_*):
//                   a FileStore there. Give each job its own directory (e.g. with $SLURM_JOB_ID in it); a
//                   directory a finished job left (a Slurm requeue) is cleared and reused, one a live job uses
//                   is refused (FileStore's liveness locks). A requeued job (SLURM_RESTART_COUNT=k, set by Slurm
//                   from the first requeue on) keeps its keys under ddp/attempt_<k>/, so that a process of the
//                   attempt before that has not yet ended (its node slow to tear down, a lock manager that has not
//                   yet learnt it is gone) cannot make the new attempt look like a second job.
// Then every rank checks in: it claims its rank (a second claim means two jobs share one store: an error), says
// its world size, and waits for every other rank. Each rank ends with the same verdict: all arrived with one
// world size, or an error naming the ranks missing or disagreeing, within the timeout.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/comm/env.hpp"
#include "ddp/comm/rendezvous/file_store.hpp"
#include "ddp/comm/rendezvous/store.hpp"
#include "ddp/comm/rendezvous/tcp_store.hpp"
#include "ddp/comm/rendezvous/tcp_store_server.hpp"
#include "ddp/comm/watch.hpp"
#include "ddp/error.hpp"

namespace ddp {

struct RendezvousOptions {
  // How long a rank waits for the store and for the other ranks. Unset: $DDP_TIMEOUT seconds, else 5 minutes.
  std::optional<std::chrono::milliseconds> timeout{};
  EnvLookup env = detail::getenv_lookup;
};

// A job's meeting point: the launcher's ranks, the store (this job's keys only), and, on the rank that serves
// it (env method, rank 0), the server.
struct Rendezvous {
  LaunchEnv launch;
  std::shared_ptr<Store> store;
  std::string method;  // "torchrun", "env", "file" or "local" (one rank, nothing set)
  std::chrono::milliseconds timeout{};
  std::string master_addr;                 // MASTER_ADDR (torchrun and env methods), else empty
  std::shared_ptr<TcpStoreServer> server;  // set on rank 0 of the env method
  // For logs: "torchrun's agent store (TCP store 127.0.0.1:29500)".
  std::string describe() const {
    if (method == "torchrun") return detail::cat("torchrun's agent store (", store->describe(), ")");
    if (method == "env") return detail::cat("rank 0's store (", store->describe(), ")");
    return store->describe();
  }
};

namespace detail {

inline std::vector<char> bytes_of(std::string const& s) { return std::vector<char>(s.begin(), s.end()); }
inline std::string text_of(std::vector<char> const& v) { return std::string(v.begin(), v.end()); }

// Claims the rank, publishes the world size, waits for everyone, and compares world sizes.
inline void check_in(Store& store, LaunchEnv const& env, std::chrono::milliseconds timeout, std::string const& where) {
  int const r = env.rank, n = env.world_size;
  store.hold_rank(r);  // where the store sees liveness, peers can now tell when this rank's process ends
  if (std::int64_t const claims = store.add(cat("rank_", r, "/claims"), 1); claims > 1)
    throw CommError(cat("rendezvous at ", where, ": rank ", r, " has already joined (", claims,
                        " claims): two jobs share this store; give each job its own MASTER_PORT (or DDP_STORE_FILE "
                        "directory), or start this one after the other ended"),
                    r);
  store.set(cat("rank_", r, "/world_size"), bytes_of(std::to_string(n)));
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> missing;
  for (int q = 0; q < n; ++q) missing.push_back(q);
  auto pause = std::chrono::milliseconds(1);
  while (!missing.empty()) {
    std::erase_if(missing, [&](int q) { return store.check({cat("rank_", q, "/world_size")}); });
    if (missing.empty()) break;
    if (std::chrono::steady_clock::now() >= deadline)
      throw CommError(cat("rendezvous at ", where, ": ", rank_list(missing), " of ", n, " did not arrive within ",
                          seconds_text(timeout), " (seen from rank ", r,
                          "); check that every rank was launched with the same WORLD_SIZE and store"),
                      missing.front());
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
  std::string disagree;
  for (int q = 0; q < n; ++q) {
    std::string const theirs = text_of(store.get(cat("rank_", q, "/world_size"), timeout));
    if (theirs != std::to_string(n)) disagree += cat(disagree.empty() ? "" : ", ", "rank ", q, " says ", theirs);
  }
  if (!disagree.empty())
    throw CommError(cat("rendezvous at ", where, ": rank ", r, " was launched with WORLD_SIZE ", n, " but ", disagree,
                        "; launch every rank with the same world size"),
                    r);
}

}  // namespace detail

// Collective over the job's ranks (each calls it once, at start). ArgumentError for a partial or inconsistent
// environment (naming the variables); CommError when the store cannot be reached or the ranks do not agree.
inline Rendezvous rendezvous(RendezvousOptions const& opt = {}) {
  using detail::cat;
  Rendezvous rv;
  rv.launch = launch_env(opt.env);
  rv.timeout = opt.timeout ? *opt.timeout
                           : std::chrono::duration_cast<std::chrono::milliseconds>(
                                 detail::timeout_from_env().value_or(std::chrono::minutes(5)));
  auto const addr = opt.env("MASTER_ADDR"), port = opt.env("MASTER_PORT"), dir = opt.env("DDP_STORE_FILE");
  std::string prefix = "ddp/";
  if (dir && (addr || port))
    throw ArgumentError(cat("rendezvous: both DDP_STORE_FILE=", *dir,
                            " and MASTER_ADDR/MASTER_PORT are set; unset "
                            "one (DDP_STORE_FILE: a shared directory; MASTER_ADDR/PORT: a TCP store)"));
  if (dir) {
    if (dir->empty()) throw ArgumentError("rendezvous: DDP_STORE_FILE is set but empty; give it a shared directory");
    rv.method = "file";
    rv.store = std::make_shared<FileStore>(*dir, FileStoreOptions{.stale = StaleKeys::kClear});
    if (auto const requeue = opt.env("SLURM_RESTART_COUNT"); requeue && !requeue->empty()) {
      auto const k = detail::try_parse_env_int(*requeue);
      if (!k || *k < 0)
        throw ArgumentError(cat("rendezvous: SLURM_RESTART_COUNT=\"", *requeue,
                                "\" is not a count of requeues (an integer, 0 or more)"));
      prefix += cat("attempt_", *k, "/");
    }
  } else if (addr || port) {
    if (!addr || addr->empty() || !port || port->empty())
      throw ArgumentError(cat("rendezvous: ", addr ? "MASTER_PORT" : "MASTER_ADDR", " is not set but ",
                              addr ? cat("MASTER_ADDR=", *addr) : cat("MASTER_PORT=", *port),
                              " is; set both (torchrun does)"));
    auto const p = detail::try_parse_env_int(*port);
    if (!p || *p < 1 || *p > 65535)
      throw ArgumentError(cat("rendezvous: MASTER_PORT=\"", *port, "\" is not a port (1 to 65535)"));
    rv.master_addr = *addr;
    auto const agent = opt.env("TORCHELASTIC_USE_AGENT_STORE");
    bool const use_agent = agent && (*agent == "True" || *agent == "true" || *agent == "1");
    if (use_agent) {
      rv.method = "torchrun";
      prefix += cat("attempt_", opt.env("TORCHELASTIC_RESTART_COUNT").value_or("0"), "/");
    } else {
      rv.method = "env";
      if (rv.launch.rank == 0) rv.server = std::make_shared<TcpStoreServer>(TcpStoreServer::Options{.port = *p});
    }
    rv.store = std::make_shared<TcpStore>(TcpStore::Options{.host = *addr, .port = *p, .timeout = rv.timeout});
  } else if (rv.launch.world_size == 1) {
    rv.method = "local";
    rv.store = std::make_shared<LocalStore>();
  } else {
    throw ArgumentError(cat("rendezvous: rank ", rv.launch.rank, " of ", rv.launch.world_size, " (", rv.launch.source,
                            ") has no way to find the other ranks: set MASTER_ADDR and MASTER_PORT (torchrun does), "
                            "or DDP_STORE_FILE=<a directory every rank sees>, or launch with mpirun and use the MPI "
                            "backend"));
  }
  rv.store = std::make_shared<PrefixStore>(prefix, rv.store);
  try {
    detail::check_in(*rv.store, rv.launch, rv.timeout, rv.describe());
  } catch (CommError const& e) {
    // The rank serving the store keeps it up a little longer, so the others read the same verdict rather than
    // a closed connection.
    if (rv.server)
      std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(rv.timeout, std::chrono::seconds(2)));
    if (std::string_view(e.what()).starts_with("rendezvous at ")) throw;
    if (rv.method == "file")
      throw CommError(cat("rendezvous at ", rv.describe(), ": rank ", rv.launch.rank,
                          " could not use the file store while the ranks checked in: ", e.what()),
                      rv.launch.rank);
    throw CommError(cat("rendezvous at ", rv.describe(), ": rank ", rv.launch.rank,
                        " lost the store while the ranks "
                        "checked in (",
                        e.what(), "); its host (", rv.method == "torchrun" ? "torchrun's agent" : "rank 0",
                        ") ended: see its error"),
                    rv.launch.rank);
  }
  return rv;
}

// A process that joins a running elastic job (join_elastic, train/elastic_store.hpp) meets it through the job's store,
// found as rendezvous() finds it (MASTER_ADDR/MASTER_PORT: the job's rank 0 serves it; DDP_STORE_FILE, with
// SLURM_RESTART_COUNT's attempt), but it does not check in (it has no rank yet) and never serves the store. Under
// torchrun a lost worker ends every worker and torchrun restarts them all: that is the restart path, not a join, so
// ArgumentError there, as for an environment with no store.
inline Rendezvous join_rendezvous(RendezvousOptions const& opt = {}) {
  using detail::cat;
  Rendezvous rv;
  rv.launch = LaunchEnv{.rank = -1, .world_size = 0, .local_rank = 0, .local_size = 1, .source = "joiner"};
  rv.timeout = opt.timeout ? *opt.timeout
                           : std::chrono::duration_cast<std::chrono::milliseconds>(
                                 detail::timeout_from_env().value_or(std::chrono::minutes(5)));
  auto const addr = opt.env("MASTER_ADDR"), port = opt.env("MASTER_PORT"), dir = opt.env("DDP_STORE_FILE");
  auto const agent = opt.env("TORCHELASTIC_USE_AGENT_STORE");
  if (agent && (*agent == "True" || *agent == "true" || *agent == "1"))
    throw ArgumentError(
        "join: under torchrun a lost worker ends every worker and torchrun restarts them (--max-restarts): resume "
        "with --resume auto instead of joining");
  if (dir && (addr || port))
    throw ArgumentError(cat("join: both DDP_STORE_FILE=", *dir, " and MASTER_ADDR/MASTER_PORT are set; unset one"));
  std::string prefix = "ddp/";
  if (dir && !dir->empty()) {
    rv.method = "file";
    rv.store = std::make_shared<FileStore>(*dir);  // (StaleKeys::kKeep: the job's keys are live)
    if (auto const requeue = opt.env("SLURM_RESTART_COUNT"); requeue && !requeue->empty()) {
      auto const k = detail::try_parse_env_int(*requeue);
      if (!k) throw ArgumentError(cat("join: SLURM_RESTART_COUNT=\"", *requeue, "\" is not a count of requeues"));
      prefix += cat("attempt_", *k, "/");
    }
  } else if (addr && !addr->empty() && port && !port->empty()) {
    auto const p = detail::try_parse_env_int(*port);
    if (!p || *p < 1 || *p > 65535)
      throw ArgumentError(cat("join: MASTER_PORT=\"", *port, "\" is not a port (1 to 65535)"));
    rv.method = "env";
    rv.master_addr = *addr;
    rv.store = std::make_shared<TcpStore>(TcpStore::Options{.host = *addr, .port = *p, .timeout = rv.timeout});
  } else {
    throw ArgumentError(
        "join: a process joining an elastic job finds it through the job's store: set MASTER_ADDR and MASTER_PORT "
        "(the job's rank 0 serves the store there) or DDP_STORE_FILE (the job's store directory), as the job's ranks "
        "have them");
  }
  rv.store = std::make_shared<PrefixStore>(prefix, rv.store);
  return rv;
}

// One rank's bytes to every rank, through the store: `root` sets `key` to make() (called on the root only), the
// others wait for it (at most `timeout`). For a value made once and needed everywhere, e.g. NCCL's unique id.
// A waiting rank does not sit out the timeout when the root is gone: it polls (backing off to 50 ms) and fails at
// once, naming the root, when the root posted at `root_left` that it gave up (StoreWatch::left_key: its reason is
// quoted), when the store sees the root's process ended (Store::rank_gone), or when the store itself fails (a store
// rank 0 served ends with it). Every CommError names the key, the root and the store, and blames the root.
template <class Make>
std::vector<char> share_from_root(Store& store, std::string const& key, int rank, int root,
                                  std::chrono::milliseconds timeout, Make&& make, std::string const& root_left = {}) {
  if (rank == root) {
    std::vector<char> bytes = make();
    store.set(key, bytes);
    return bytes;
  }
  using detail::cat;
  auto const start = std::chrono::steady_clock::now();
  auto pause = std::chrono::milliseconds(1);
  auto waited = [&] {
    return detail::seconds_text(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start));
  };
  std::string gone;
  auto left = [&] {  // the root's reason, if it posted one
    if (root_left.empty() || !store.check({root_left})) return false;
    auto const why = store.get(root_left, timeout);
    gone = cat("it left: ", std::string(why.begin(), why.end()));
    return true;
  };
  try {
    for (;;) {
      if (store.check({key})) return store.get(key, timeout);
      if (left()) break;
      if (store.rank_gone(root)) {
        // A root that gives up posts why, then ends: both may happen between the look above and this one, so look
        // for its bytes and its reason once more before saying only that it ended.
        if (store.check({key})) return store.get(key, timeout);
        if (!left()) gone = cat("its process ended (killed, or crashed) before it set it");
        break;
      }
      if (std::chrono::steady_clock::now() - start >= timeout) {
        throw CommError(cat("rank ", rank, " waited ", detail::seconds_text(timeout), " for '", key, "' from rank ",
                            root, " through ", store.describe(), ": it did not appear; rank ", root,
                            " failed before it set it (see its error) or never started"),
                        root);
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  } catch (CommError const& e) {
    if (e.rank() == root && std::string_view(e.what()).starts_with(cat("rank ", rank, " waited "))) throw;
    throw CommError(cat("rank ", rank, " lost ", store.describe(), " after ", waited(), " waiting for '", key,
                        "' from rank ", root, ": ", e.what(), "; if rank ", root,
                        " serves the store (MASTER_ADDR/MASTER_PORT without torchrun), it ended: see its error"),
                    root);
  }
  throw CommError(cat("rank ", rank, " waited ", waited(), " for '", key, "' from rank ", root, " through ",
                      store.describe(), ": rank ", root, " is gone: ", gone),
                  root);
}

}  // namespace ddp
