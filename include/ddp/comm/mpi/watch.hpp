// MpiWatch: waits for one nonblocking MPI collective under a deadline. While it waits it answers peers that
// ask what this rank is doing; past the warning point it asks them itself and warns once, naming the ranks
// that have not arrived; at the deadline it asks again and throws a CommError naming the operation, its
// sequence number, its tag and the missing ranks, or both sides of a divergence (desync) when a peer is in
// another collective at the same position. Questions and answers travel on a communicator of their own.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/detail/call_record.hpp"
#include "ddp/comm/detail/wait.hpp"
#include "ddp/comm/mpi/session.hpp"
#include "ddp/comm/trace.hpp"
#include "ddp/comm/watch.hpp"
#include "ddp/error.hpp"

namespace ddp::detail {

class MpiWatch {
 public:
  // `parent` is the backend's communicator (collective: every rank builds its watch at the same point).
  MpiWatch(MPI_Comm parent, Deadlines deadlines, std::string_view backend)
      : deadlines_(std::move(deadlines)), backend_(backend) {
    MPI_Comm_dup(parent, &ctl_);
    MPI_Comm_set_errhandler(ctl_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(ctl_, &rank_);
    MPI_Comm_size(ctl_, &n_);
  }
  MpiWatch(MpiWatch const&) = delete;
  MpiWatch& operator=(MpiWatch const&) = delete;
  ~MpiWatch() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || ctl_ == MPI_COMM_NULL) return;
    drain_messages();
    MPI_Comm_free(&ctl_);
  }

  Deadlines const& deadlines() const noexcept { return deadlines_; }
  // After a failed collective: leave the communicator alone (freeing it could wait for absent peers).
  void abandon() noexcept { ctl_ = MPI_COMM_NULL; }

  // Waits for `req`, the nonblocking collective described by `call`. Throws CommError at the deadline (the
  // request is then left pending: the backend is unusable and the job must end, as mpi_main makes it).
  void wait(MPI_Request& req, CallRecord const& call) {
    int flag = 0;
    if (MPI_Test(&req, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) return;
    wait_until(
        [&] {
          int done = 0;
          test(req, done);
          return done != 0;
        },
        call);
  }

  // The same for any completion test: done() returns true once the collective `call` finished (and may
  // throw its error), e.g. a CUDA event query for NCCL.
  template <class Done>
  void wait_until(Done&& done, CallRecord const& call) {
    auto const start = Clock::now();
    auto next_serve = start + std::chrono::milliseconds(1);
    bool warned = deadlines_.warn.count() == 0;
    for (std::uint32_t i = 1;; ++i) {
      if (done()) return;
      if ((i & 15u) != 0) continue;
      auto const now = Clock::now();
      // MPICH's blocking collectives spin too; past 100 us, let a rank sharing this core run.
      if (now - start > std::chrono::microseconds(100)) std::this_thread::yield();
      if (now < next_serve) continue;
      next_serve = now + std::chrono::milliseconds(1);
      serve(call);
      if (!warned && now - start >= deadlines_.warn) {
        warned = true;
        auto const peers = inquire(done, call);
        if (!peers) return;                                                          // it completed while we asked
        if (peers->diverged(call)) throw peers->failure(backend_, call, "stalled");  // no wait can mend that
        deadlines_.warn_stall(peers->warning(backend_, call, deadlines_));
      }
      if (now - start >= deadlines_.timeout) {
        auto const peers = inquire(done, call);
        if (!peers) return;
        throw peers->failure(backend_, call, cat("timed out after ", seconds_text(deadlines_.timeout)));
      }
    }
  }

 private:
  static constexpr int kQueryTag = 1;
  static constexpr int kReplyTag = 2;

  struct Query {
    std::uint64_t round;
  };
  struct Reply {
    std::uint64_t round;
    CallRecord call;
  };

  void test(MPI_Request& req, int& flag) {
    if (int rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE); rc != MPI_SUCCESS) {
      throw CommError(
          cat("ddp ", backend_, ": collective on rank ", rank_, " of ", n_, " failed: ", mpi_error_string(rc)), rank_);
    }
  }

  // Answers every pending question with the collective this rank waits in.
  void serve(CallRecord const& call) {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, ctl_, &flag, &st) != MPI_SUCCESS || !flag) return;
      Query q{};
      MPI_Recv(&q, sizeof q, MPI_BYTE, st.MPI_SOURCE, kQueryTag, ctl_, MPI_STATUS_IGNORE);
      Reply const r{q.round, call};
      // Small enough for MPI's eager protocol: completes at once even if the asker has stopped.
      MPI_Send(&r, sizeof r, MPI_BYTE, st.MPI_SOURCE, kReplyTag, ctl_);
    }
  }

  // Asks every peer what it is doing and collects the answers for a short grace period, still serving
  // questions and testing done(). nullopt if the collective completed meanwhile; else one entry per rank (this rank's
  // own is `call`), empty where no answer came.
  template <class Done>
  std::optional<PeerReport> inquire(Done& done, CallRecord const& call) {
    drain_replies();
    std::uint64_t const round = ++round_;
    Query const q{round};
    for (int k = 0; k < n_; ++k) {
      if (k == rank_) continue;
      MPI_Request s = MPI_REQUEST_NULL;
      if (MPI_Isend(&q, sizeof q, MPI_BYTE, k, kQueryTag, ctl_, &s) == MPI_SUCCESS) sends_.push_back(s);
    }
    PeerReport report{.peers = std::vector<std::optional<CallRecord>>(static_cast<std::size_t>(n_)), .rank = rank_};
    auto& peers = report.peers;
    peers[static_cast<std::size_t>(rank_)] = call;
    int answered = 1;
    auto const grace = std::min<std::chrono::nanoseconds>(std::chrono::seconds(1), deadlines_.timeout / 4);
    auto const until = Clock::now() + grace;
    while (answered < n_ && Clock::now() < until) {
      if (done()) return std::nullopt;
      serve(call);
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kReplyTag, ctl_, &flag, &st) == MPI_SUCCESS && flag) {
        Reply r{};
        MPI_Recv(&r, sizeof r, MPI_BYTE, st.MPI_SOURCE, kReplyTag, ctl_, MPI_STATUS_IGNORE);
        auto& slot = peers[static_cast<std::size_t>(st.MPI_SOURCE)];
        if (r.round == round && !slot) {
          slot = r.call;
          ++answered;
        }
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    complete_sends();
    return report;
  }

  void complete_sends() {
    for (auto& s : sends_) {
      int flag = 0;
      MPI_Test(&s, &flag, MPI_STATUS_IGNORE);
      if (!flag) MPI_Request_free(&s);  // eager: it completes; nothing refers to it afterwards
    }
    sends_.clear();
  }

  // Late answers to an earlier round.
  void drain_replies() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kReplyTag, ctl_, &flag, &st) != MPI_SUCCESS || !flag) return;
      Reply r{};
      MPI_Recv(&r, sizeof r, MPI_BYTE, st.MPI_SOURCE, kReplyTag, ctl_, MPI_STATUS_IGNORE);
    }
  }

  // Before freeing the communicator: receive what peers sent and nobody read.
  void drain_messages() {
    complete_sends();
    drain_replies();
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, ctl_, &flag, &st) != MPI_SUCCESS || !flag) return;
      Query q{};
      MPI_Recv(&q, sizeof q, MPI_BYTE, st.MPI_SOURCE, kQueryTag, ctl_, MPI_STATUS_IGNORE);
    }
  }

  Deadlines deadlines_;
  std::string_view backend_;
  MPI_Comm ctl_ = MPI_COMM_NULL;
  int rank_ = 0;
  int n_ = 1;
  std::uint64_t round_ = 0;
  std::vector<MPI_Request> sends_;
};

}  // namespace ddp::detail
