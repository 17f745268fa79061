// CallRecord: one collective as a rank issued it (operation, count, element type, reduction, root, tag and its
// position in the rank's sequence), and PeerReport: what every rank was in when one rank's collective stalled,
// turned into the warning and the CommError. Shared by the watches that learn it from their peers over MPI
// (mpi/watch.hpp) and through the rendezvous store (rendezvous/store_watch.hpp), so both say it alike.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/comm/communicator.hpp"
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

// One entry per rank, empty where the rank gave no sign of being in a collective (this rank's own entry is the
// call it waits in), and what such silence means for the watch that asked (`silence`, for the message).
struct PeerReport {
  enum class Stage { kWarning, kTimeout };

  std::vector<std::optional<CallRecord>> peers;
  int rank = 0;
  std::string silence = "no answer: stopped, or busy outside ddp's collectives";

  int world_size() const noexcept { return static_cast<int>(peers.size()); }
  bool any_silent() const noexcept {
    return std::any_of(peers.begin(), peers.end(), [](auto const& p) { return !p.has_value(); });
  }

  // "rank 1 did not arrive (no answer: ...)", or the divergence, or where the others are.
  std::string absent_text(CallRecord const& call, Stage stage) const {
    std::vector<int> silent, waiting;
    std::string diverged, elsewhere;
    for (int k = 0; k < world_size(); ++k) {
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
              " (", silence, ")");
    }
    if (!diverged.empty()) {
      s += cat(s.empty() ? "" : "; ", "the ranks' collective sequences diverged: rank ", rank, " is in ",
               describe(call), diverged, "; every rank must issue the same collectives in the same order");
    }
    if (!elsewhere.empty()) s += cat(s.empty() ? "" : " ", "(elsewhere: ", elsewhere, ")");
    if (s.empty()) s = cat("every rank is in it (", rank_list(waiting), "), but it has not completed");
    return s;
  }

  // A peer at this very position in another collective: the ranks' sequences diverged (no wait can mend that).
  bool diverged(CallRecord const& call) const {
    for (auto const& p : peers) {
      if (p && p->seq == call.seq && !p->same_call(call)) return true;
    }
    return false;
  }

  // The rank a CommError names: the first silent one, else the first in another call at this position.
  int first_absent(CallRecord const& call) const {
    for (int k = 0; k < world_size(); ++k) {
      if (!peers[static_cast<std::size_t>(k)]) return k;
    }
    for (int k = 0; k < world_size(); ++k) {
      auto const& p = peers[static_cast<std::size_t>(k)];
      if (p->seq == call.seq && !p->same_call(call)) return k;
    }
    return -1;
  }

  // "ddp nccl: warning: all_reduce #7 (...) on rank 0 of 2 has waited 5 s: rank 1 has not arrived (...); it fails
  // at 10 s (the collective timeout)"
  std::string warning(std::string_view backend, CallRecord const& call, Deadlines const& d) const {
    return stall_warning(backend, describe(call), rank, world_size(), d, cat(": ", absent_text(call, Stage::kWarning)));
  }

  // The error of a collective that ended `how` ("timed out after 10 s", "stalled").
  CommError failure(std::string_view backend, CallRecord const& call, std::string const& how) const {
    return CommError(cat("ddp ", backend, ": ", describe(call), " on rank ", rank, " of ", world_size(), " ", how, ": ",
                         absent_text(call, Stage::kTimeout),
                         any_silent() ? cat("; raise the timeout (the backend's TimeoutOptions, $", kTimeoutEnvVar,
                                            ", or --timeout in the examples) if the ranks are just slow")
                                      : std::string()),
                     first_absent(call));
  }
};

}  // namespace ddp::detail
