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
#include "ddp/comm/detail/wait.hpp"
#include "ddp/comm/mpi/session.hpp"
#include "ddp/comm/trace.hpp"
#include "ddp/comm/watch.hpp"
#include "ddp/error.hpp"

namespace ddp::detail {

// One collective as a rank issued it: what peers compare. Trivially copyable; sent as bytes.
struct CallRecord {
  std::uint64_t seq = 0;  // 1-based position in this backend's collective sequence
  std::uint64_t count = 0;
  std::int64_t tag_id = -1;
  std::int32_t kind = 0;
  std::int32_t dtype = 0;
  std::int32_t op = 0;
  std::int32_t root = -1;
  char label[32] = {};  // the tag's label, truncated

  static CallRecord make(std::uint64_t seq, CollectiveKind kind, std::size_t count, Dtype dtype, ReduceOp op, int root,
                         CollectiveTag tag) noexcept {
    CallRecord r;
    r.seq = seq;
    r.count = count;
    r.tag_id = tag.id;
    r.kind = static_cast<std::int32_t>(kind);
    r.dtype = static_cast<std::int32_t>(dtype);
    bool const reduces = kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter;
    r.op = reduces ? static_cast<std::int32_t>(op) : 0;
    r.root = root;
    if (!tag.label.empty()) std::memcpy(r.label, tag.label.data(), std::min(tag.label.size(), sizeof r.label - 1));
    return r;
  }
  CollectiveKind collective() const noexcept { return static_cast<CollectiveKind>(kind); }
  CollectiveTag tag() const noexcept { return CollectiveTag{std::string_view(label), tag_id}; }

  // The same call (everything but the sequence number), as every rank must issue at one position.
  bool same_call(CallRecord const& o) const noexcept {
    return kind == o.kind &&
           (collective() == CollectiveKind::kBarrier ||
            (dtype == o.dtype && count == o.count && op == o.op && root == o.root)) &&
           tag_id == o.tag_id && std::strncmp(label, o.label, sizeof label) == 0;
  }

  // A stable 62-bit digest of the call, for the per-collective check (equal calls, equal digests).
  std::int64_t digest() const noexcept {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&](std::uint64_t v) {
      for (int i = 0; i < 8; ++i) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= 1099511628211ull;
      }
    };
    mix(static_cast<std::uint64_t>(kind));
    if (collective() != CollectiveKind::kBarrier) {
      mix(static_cast<std::uint64_t>(dtype));
      mix(count);
      mix(static_cast<std::uint64_t>(op));
      mix(static_cast<std::uint64_t>(root));
    }
    mix(static_cast<std::uint64_t>(tag_id));
    for (char c : std::string_view(label)) mix(static_cast<unsigned char>(c));
    return static_cast<std::int64_t>(h >> 2);
  }
};

// "all_reduce #57 (count=65536, float32, avg) [bucket:3]"
inline std::string describe(CallRecord const& r) {
  CollectiveKind const k = r.collective();
  bool const reduces = k == CollectiveKind::kAllReduce || k == CollectiveKind::kReduceScatter;
  std::string s = cat(name(k), " #", r.seq);
  if (k != CollectiveKind::kBarrier) {
    s += cat(" (count=", r.count, ", ", name(static_cast<Dtype>(r.dtype)),
             reduces ? cat(", ", name(static_cast<ReduceOp>(r.op))) : std::string(),
             r.root >= 0 ? cat(", root=", r.root) : std::string(), ")");
  }
  return s + tag_suffix(r.tag());
}

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
        if (!peers) return;                                         // it completed while we asked
        if (diverged(*peers, call)) fail(*peers, call, "stalled");  // no wait can mend that
        deadlines_.warn_stall(cat("ddp ", backend_, ": warning: ", describe(call), " on rank ", rank_, " of ", n_,
                                  " has waited ", seconds_text(deadlines_.warn), ": ",
                                  absent_text(*peers, call, Stage::kWarning), "; it fails at ",
                                  seconds_text(deadlines_.timeout), " (the collective timeout)"));
      }
      if (now - start >= deadlines_.timeout) {
        auto const peers = inquire(done, call);
        if (!peers) return;
        fail(*peers, call, cat("timed out after ", seconds_text(deadlines_.timeout)));
      }
    }
  }

 private:
  static constexpr int kQueryTag = 1;
  static constexpr int kReplyTag = 2;

  enum class Stage { kWarning, kTimeout };

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
  std::optional<std::vector<std::optional<CallRecord>>> inquire(Done& done, CallRecord const& call) {
    drain_replies();
    std::uint64_t const round = ++round_;
    Query const q{round};
    for (int k = 0; k < n_; ++k) {
      if (k == rank_) continue;
      MPI_Request s = MPI_REQUEST_NULL;
      if (MPI_Isend(&q, sizeof q, MPI_BYTE, k, kQueryTag, ctl_, &s) == MPI_SUCCESS) sends_.push_back(s);
    }
    std::vector<std::optional<CallRecord>> peers(static_cast<std::size_t>(n_));
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
    return peers;
  }

  // "rank 1 did not arrive (no answer: stopped, or busy outside ddp's collectives)", or the divergence.
  std::string absent_text(std::vector<std::optional<CallRecord>> const& peers, CallRecord const& call,
                          Stage stage) const {
    std::vector<int> silent, waiting;
    std::string diverged, elsewhere;
    for (int k = 0; k < n_; ++k) {
      auto const& p = peers[static_cast<std::size_t>(k)];
      if (!p) {
        silent.push_back(k);
      } else if (p->seq == call.seq && !p->same_call(call)) {
        diverged += cat("; rank ", k, " is in ", describe(*p));
      } else if (p->seq != call.seq) {  // e.g. it finished this one: an absent rank sent it its part first
        elsewhere += cat(elsewhere.empty() ? "" : "; ", "rank ", k, " is in ", describe(*p));
      } else {
        waiting.push_back(k);
      }
    }
    std::string s;
    if (!silent.empty()) {
      s = cat(rank_list(silent),
              stage == Stage::kTimeout ? " did not arrive"
              : silent.size() == 1     ? " has not arrived"
                                       : " have not arrived",
              " (no answer: stopped, or busy outside ddp's collectives)");
    }
    if (!diverged.empty()) {
      s += cat(s.empty() ? "" : "; ", "the ranks' collective sequences diverged: rank ", rank_, " is in ",
               describe(call), diverged, "; every rank must issue the same collectives in the same order");
    }
    if (!elsewhere.empty()) s += cat(s.empty() ? "" : " ", "(elsewhere: ", elsewhere, ")");
    if (s.empty()) s = cat("every rank is in it (", rank_list(waiting), "), but it has not completed");
    return s;
  }

  // A peer at this very position in another collective: the ranks' sequences diverged.
  bool diverged(std::vector<std::optional<CallRecord>> const& peers, CallRecord const& call) const {
    for (auto const& p : peers) {
      if (p && p->seq == call.seq && !p->same_call(call)) return true;
    }
    return false;
  }

  [[noreturn]] void fail(std::vector<std::optional<CallRecord>> const& peers, CallRecord const& call,
                         std::string const& how) const {
    bool const silent = std::any_of(peers.begin(), peers.end(), [](auto const& p) { return !p.has_value(); });
    throw CommError(cat("ddp ", backend_, ": ", describe(call), " on rank ", rank_, " of ", n_, " ", how, ": ",
                        absent_text(peers, call, Stage::kTimeout),
                        silent ? cat("; raise the timeout (the backend's TimeoutOptions, $", kTimeoutEnvVar,
                                     ", or --timeout in the examples) if the ranks are just slow")
                               : std::string()),
                    first_absent(peers, call));
  }

  // The rank a CommError names: the first silent one, else the first in another call at this position.
  int first_absent(std::vector<std::optional<CallRecord>> const& peers, CallRecord const& call) const {
    for (int k = 0; k < n_; ++k) {
      if (!peers[static_cast<std::size_t>(k)]) return k;
    }
    for (int k = 0; k < n_; ++k) {
      auto const& p = peers[static_cast<std::size_t>(k)];
      if (p->seq == call.seq && !p->same_call(call)) return k;
    }
    return -1;
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
