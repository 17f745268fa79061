// MpiSession: owns MPI initialisation (MPI_THREAD_MULTIPLE) for one program, knows the rank's place on its
// node, and turns a failing rank into a clear message plus MPI_Abort (ddp::mpi_main).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/comm/detail/describe.hpp"
#include "ddp/comm/env.hpp"
#include "ddp/comm/mpi/finalize_watchdog.hpp"
#include "ddp/comm/mpi/pmi1.hpp"
#include "ddp/error.hpp"

namespace ddp {

namespace detail {
inline std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return cat("MPI error code ", code);
  return std::string(buf, static_cast<std::size_t>(len));
}

// MPI_Abort tears the job down at once, and mpirun (Hydra) then drops output its proxies have not forwarded
// yet, sometimes the very message explaining the abort. A short pause before aborting lets it through.
inline void let_launcher_forward_output() noexcept { std::this_thread::sleep_for(std::chrono::milliseconds(250)); }

// A rank that calls std::exit() mid-run would leave its peers blocked in a collective (Hydra reports a
// plain exit without naming the rank, or not at all). MpiSession arms this std::atexit hook, which names
// the rank and calls MPI_Abort. It is a function-local static because atexit callbacks take no context;
// it holds three ints, written by the live MpiSession(s).
struct ExitGuard {
  std::atomic<int> live{0};  // MpiSessions alive (a second one may observe an already initialised MPI)
  std::atomic<int> rank{-1};
  std::atomic<int> world_size{0};
};
inline ExitGuard& exit_guard() noexcept {
  static ExitGuard guard;
  return guard;
}
inline void abort_if_exiting_mid_run() noexcept {
  ExitGuard& g = exit_guard();
  if (g.live.load() <= 0) return;
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  std::fprintf(stderr,
               "ddp: rank %d of %d exited (std::exit) before MPI_Finalize, leaving its peers in a collective; "
               "aborting the MPI job (MPI_Abort)\n",
               g.rank.load(), g.world_size.load());
  std::fflush(stderr);
  let_launcher_forward_output();
  MPI_Abort(MPI_COMM_WORLD, 1);
}

}  // namespace detail

// How MpiSession ends MPI in a job of more than one rank. MPICH's UCX transport closes every connection in
// MPI_Finalize and waits for each close to be flushed; over TCP a flush needs the peer's answer (UCX sends it
// an empty put and waits for the ack). A rank whose own closes are done goes on to the launcher's barrier and
// answers no more, so a peer still closing can wait forever (openucx/ucx#8738; bench/RESULTS.md has how
// often). On one node it happens too whenever UCX reaches a peer over TCP: MPICH opens UCX connections for
// ddp's shared windows, and UCX takes TCP for them when it cannot use cross-memory attach (a UCX without its
// CMA module, UCX_TLS=tcp,self, or a container that forbids process_vm_readv).
// Two measures, for every job of more than one rank:
//  - `finalize_quiet`: the destructor meets all ranks in a barrier on a communicator of its own, then every
//    rank stays out of MPI this long before MPI_Finalize, so no rank is still inside an MPI call, answering,
//    when a peer starts closing. This removed most hangs, not all under CPU contention.
//  - `finalize_timeout`: a rank whose MPI_Finalize has not returned by then, and is not simply waiting in
//    the launcher's barrier (a read on $PMI_FD), says so and ends as MPI_Finalize would have: under Hydra it
//    sends the launcher the barrier and finalize MPICH still owed (PMI-1 on $PMI_FD, mpi/pmi1.hpp), so
//    the barrier completes for the other ranks and the job ends cleanly; then it exits with the program's
//    status (every rank had passed the barrier before: the job's work is done). 0: wait without limit.
struct MpiSessionOptions {
  std::chrono::milliseconds finalize_quiet{200};
  std::chrono::milliseconds finalize_timeout{20'000};
};

// Initialises MPI with MPI_THREAD_MULTIPLE, unless the program already did (then the level is checked), and
// finalises it on destruction only if it initialised it. No global state: create exactly one, in main.
// Construction is collective over MPI_COMM_WORLD: each rank checks the thread level and its launcher's
// variables, then the ranks agree; if any rank's check failed, the constructor throws on every rank (the
// failing rank its own error, the others a CommError naming it), so no rank is left waiting in a collective.
//
// Why MULTIPLE and not SERIALIZED/FUNNELED: MpiBackend runs async collectives on a progress thread while
// the user's thread may make its own MPI calls (its own communicators, MPI_Abort on failure); SERIALIZED
// would make every such call a data race unless the user knew to stay off MPI during backward. ddp never
// runs two collectives on one communicator at once (blocking collectives wait for the queue to drain).
class MpiSession {
 public:
  MpiSession() : MpiSession(nullptr, nullptr, {}) {}
  MpiSession(int& argc, char**& argv, MpiSessionOptions options = {}) : MpiSession(&argc, &argv, options) {}
  explicit MpiSession(MpiSessionOptions options) : MpiSession(nullptr, nullptr, options) {}
  MpiSession(MpiSession const&) = delete;
  MpiSession& operator=(MpiSession const&) = delete;
  ~MpiSession() {
    if (hooked_) detail::exit_guard().live.fetch_sub(1);
    if (failed_.load()) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      // MPI_Finalize would wait for the peers a failed collective is still waiting for.
      if (!finalized) abort("a collective of this job failed or timed out (its error was raised above)");
    }
    if (local_comm_ != MPI_COMM_NULL) MPI_Comm_free(&local_comm_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_ && !finalized) finalize();
  }

  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return world_size_; }
  // From MPI itself (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)): the ranks sharing this node.
  int local_rank() const noexcept { return local_rank_; }
  int local_size() const noexcept { return local_size_; }

  // A backend's collective failed or timed out: the job is out of step, so the destructor aborts it
  // (MPI_Abort) instead of finalizing, which would wait for the absent peers. Thread-safe.
  void note_failure() const noexcept { failed_.store(true); }
  bool failed() const noexcept { return failed_.load(); }

  // The status this rank exits with if MPI_Finalize outlives MpiSessionOptions::finalize_timeout (default 0);
  // mpi_main sets it to the program's.
  void set_exit_status(int status) noexcept { exit_status_ = status; }

  // Prints "ddp: rank R of N failed: <why>; aborting the MPI job" and ends every rank of the job.
  [[noreturn]] void abort(std::string_view why, int code = 1) const noexcept {
    std::fprintf(stderr, "ddp: rank %d of %d failed: %.*s; aborting the MPI job (MPI_Abort)\n", rank_, world_size_,
                 static_cast<int>(why.size()), why.data());
    std::fflush(stderr);
    detail::let_launcher_forward_output();
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] honest if it ever did
  }

 private:
  MpiSession(int* argc, char*** argv, MpiSessionOptions options) : options_(options) {
    check_options(options);
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = 0;
    if (initialized) {
      MPI_Query_thread(&provided);
    } else {
      if (int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided); rc != MPI_SUCCESS) {
        throw CommError(detail::cat("ddp mpi: MPI_Init_thread failed: ", detail::mpi_error_string(rc)));
      }
      owns_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
    try {
      std::exception_ptr failure;  // this rank's setup problem, if any; every rank learns of it below
      try {
        check_thread_level(provided);
        check_launcher();
      } catch (...) {
        failure = std::current_exception();
      }
      agree_on_setup(failure);
    } catch (...) {
      if (owns_) MPI_Finalize();
      throw;
    }
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local_comm_);
    MPI_Comm_rank(local_comm_, &local_rank_);
    MPI_Comm_size(local_comm_, &local_size_);
    if (owns_ && world_size_ > 1) MPI_Comm_dup(MPI_COMM_WORLD, &finalize_comm_);
    static bool const hooked = std::atexit(detail::abort_if_exiting_mid_run) == 0;
    if (hooked) {
      detail::exit_guard().rank.store(rank_);
      detail::exit_guard().world_size.store(world_size_);
      detail::exit_guard().live.fetch_add(1);
      hooked_ = true;
    }
  }

  static void check_options(MpiSessionOptions const& o) {
    if (o.finalize_quiet.count() < 0) {
      throw ArgumentError(
          detail::cat("MpiSessionOptions::finalize_quiet must be >= 0 ms, got ", o.finalize_quiet.count(), " ms"));
    }
    if (o.finalize_timeout.count() < 0) {
      throw ArgumentError(detail::cat("MpiSessionOptions::finalize_timeout must be >= 0 ms (0: no limit), got ",
                                      o.finalize_timeout.count(), " ms"));
    }
  }

  // MpiSessionOptions says why: with more than one rank, all ranks meet, leave MPI for finalize_quiet, then
  // finalize under the watchdog.
  void finalize() {
    if (finalize_comm_ == MPI_COMM_NULL) {
      MPI_Finalize();
      return;
    }
    MPI_Barrier(finalize_comm_);
    MPI_Comm_free(&finalize_comm_);
    std::this_thread::sleep_for(options_.finalize_quiet);
    detail::FinalizeWatchdog watchdog(
        options_.finalize_timeout,
        [rank = rank_, size = world_size_, status = exit_status_, limit = options_.finalize_timeout,
         tid = detail::this_thread_id(), pmi = detail::pmi_fd()] {
          if (pmi && detail::thread_blocked_in_read(tid, *pmi)) return false;  // in the launcher's barrier
          std::fprintf(stderr,
                       "ddp: rank %d of %d: MPI_Finalize has not returned after %lld ms, although every rank had "
                       "finished its work (UCX over TCP waits for a peer that already left: openucx/ucx#8738); "
                       "ending it with the launcher and exiting with status %d (MpiSessionOptions::finalize_timeout)\n",
                       rank, size, static_cast<long long>(limit.count()), status);
          std::fflush(stderr);
          if (pmi) {
            try {
              detail::pmi1_barrier_and_finalize(*pmi, limit);
            } catch (std::exception const& e) {
              std::fprintf(stderr, "ddp: rank %d of %d: %s\n", rank, size, e.what());
              std::fflush(stderr);
            }
          }
          std::_Exit(status);
          return true;
        });
    MPI_Finalize();
  }

  static void check_thread_level(int provided) {
    if (provided < MPI_THREAD_MULTIPLE) {
      throw CommError(detail::cat("ddp mpi: MPI provides thread level ", provided,
                                  " but ddp's progress thread needs MPI_THREAD_MULTIPLE (", MPI_THREAD_MULTIPLE,
                                  "); use an MPI built with thread support, or let MpiSession initialise MPI"));
    }
  }

  // The setup checks above are local to each rank; this collective step (the first one, on every rank)
  // makes their outcome common. If any rank failed, every rank throws: the failing rank its own error, the
  // others a CommError naming the failed rank(s) and quoting the first one's message. So one rank's bad
  // environment ends the whole job with a clear error everywhere, instead of the healthy ranks going on
  // into the backend's first collective (MPI_Comm_dup) and waiting there forever.
  void agree_on_setup(std::exception_ptr const& failure) const {
    int const mine = failure ? 1 : 0;
    std::vector<int> failed(static_cast<std::size_t>(world_size_));
    MPI_Allgather(&mine, 1, MPI_INT, failed.data(), 1, MPI_INT, MPI_COMM_WORLD);
    auto const first = std::find(failed.begin(), failed.end(), 1);
    if (first == failed.end()) return;
    int const root = static_cast<int>(first - failed.begin());
    std::string why = root == rank_ ? detail::describe(failure) : std::string();
    int len = static_cast<int>(why.size());
    MPI_Bcast(&len, 1, MPI_INT, root, MPI_COMM_WORLD);
    why.resize(static_cast<std::size_t>(len));
    MPI_Bcast(why.data(), len, MPI_CHAR, root, MPI_COMM_WORLD);
    if (failure) std::rethrow_exception(failure);
    std::string ranks;
    for (int k = 0; k < world_size_; ++k) {
      if (failed[static_cast<std::size_t>(k)] != 0) ranks += detail::cat(ranks.empty() ? "" : ", ", k);
    }
    throw CommError(
        detail::cat("ddp mpi: launch setup failed on rank", ranks.find(',') == std::string::npos ? " " : "s ", ranks,
                    " of ", world_size_, " (rank ", root, ": ", why, "); rank ", rank_,
                    " stops too, so that no rank waits for it"),
        root);
  }

  // The launcher's variables must describe the same job MPI sees. The classic failure: every process is an
  // MPI singleton (started by torchrun, or by another MPI's mpirun) and believes it is rank 0 of 1.
  // Slurm's variables are not compared: under sbatch + mpirun they describe the job step.
  void check_launcher() const {
    LaunchEnv const env = launch_env();  // throws ArgumentError on partial or inconsistent variables
    if (env.source == "default" || env.source == "slurm") return;
    if (env.rank == rank_ && env.world_size == world_size_) return;
    throw CommError(detail::cat("ddp mpi: the launcher's ", env.source, " variables say rank ", env.rank, " of ",
                                env.world_size, " but MPI says rank ", rank_, " of ", world_size_,
                                world_size_ == 1 ? "; this process started as an MPI singleton: launch with this MPI's "
                                                   "mpirun/mpiexec or srun (torchrun cannot start MPI processes, and "
                                                   "another MPI's mpirun cannot start this program)"
                                                 : "; unset the stale variables"),
                    rank_);
  }

  MpiSessionOptions options_;
  bool owns_ = false;
  bool hooked_ = false;
  int exit_status_ = 0;
  mutable std::atomic<bool> failed_{false};
  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  MPI_Comm local_comm_ = MPI_COMM_NULL;
  MPI_Comm finalize_comm_ = MPI_COMM_NULL;  // more than one rank: the barrier before MPI_Finalize
};

// The recommended main for MPI programs: return ddp::mpi_main(argc, argv, [](ddp::MpiSession& s) { ... });
// Any exception escaping fn prints a message naming this rank and calls MPI_Abort, so mpirun/srun end the
// whole job within seconds instead of leaving the other ranks waiting in a collective forever.
template <class F>
requires std::invocable<F&, MpiSession&>
int mpi_main(int& argc, char**& argv, MpiSessionOptions options, F&& fn) {
  std::optional<MpiSession> started;
  try {
    started.emplace(argc, argv, options);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "ddp: MPI setup failed: %s\n", e.what());
    return 1;
  }
  MpiSession& session = *started;
  try {
    if constexpr (std::is_convertible_v<std::invoke_result_t<F&, MpiSession&>, int>) {
      int const status = static_cast<int>(fn(session));
      session.set_exit_status(status);
      return status;
    } else {
      fn(session);
      return 0;
    }
  } catch (std::exception const& e) {
    session.abort(e.what());
  } catch (...) {
    session.abort("unknown exception");
  }
}

template <class F>
requires std::invocable<F&, MpiSession&>
int mpi_main(int& argc, char**& argv, F&& fn) { return mpi_main(argc, argv, MpiSessionOptions{}, std::forward<F>(fn)); }

}  // namespace ddp
