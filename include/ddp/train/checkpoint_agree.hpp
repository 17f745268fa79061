// A checkpoint step's outcome, agreed by every rank: one rank reads or writes the file, or each checks its own
// part, and a failure anywhere is thrown on every rank (same error family, same message, naming the rank that
// reported it) instead of leaving the others waiting in the next collective. Bytes travel as int64 words, which
// every backend's collectives move.
#pragma once

#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"

namespace ddp::detail {

// Packs bytes into int64 words (zero-padded) for collectives, which move int64 but not bytes.
inline std::vector<std::int64_t> to_words(std::string_view s) {
  std::vector<std::int64_t> w(s.size() / 8 + (s.size() % 8 != 0), 0);  // no overflow near SIZE_MAX
  if (!s.empty()) std::memcpy(w.data(), s.data(), s.size());
  return w;
}
inline std::string from_words(std::vector<std::int64_t> const& w, std::size_t n) {
  std::string s(n, '\0');
  if (n) std::memcpy(s.data(), w.data(), n);
  return s;
}

// Rank `root` has `status` (0 = ok) and `text` (the bytes on success, the error message otherwise); after
// the call every rank has both. Two broadcasts: (status, size), then the text as int64 words.
template <Communicator C>
void broadcast_outcome(C& comm, int root, std::int64_t& status, std::string& text) {
  std::vector<std::int64_t> head{status, static_cast<std::int64_t>(text.size())};
  host_broadcast(comm, std::span<std::int64_t>(head), root, CollectiveTag{"checkpoint.status"});
  status = head[0];
  auto words =
      comm.rank() == root ? to_words(text) : std::vector<std::int64_t>((static_cast<std::size_t>(head[1]) + 7) / 8);
  if (!words.empty()) host_broadcast(comm, std::span<std::int64_t>(words), root, CollectiveTag{"checkpoint.bytes"});
  text = from_words(words, static_cast<std::size_t>(head[1]));
}

// Error families a rank's local checkpoint step can end with.
enum class Failure : std::int64_t { kNone = 0, kIo = 1, kArgument = 2 };

[[noreturn]] inline void throw_failure(Failure kind, std::string const& message) {
  if (kind == Failure::kArgument) throw ArgumentError(message);
  throw IoError(message);
}

// Every rank reports its local outcome; if any rank failed, every rank throws the lowest failing rank's
// error (same family, same message, plus which rank reported it). All-reduce + broadcast: never a hang.
template <Communicator C>
void agree_or_throw(C& comm, Failure kind, std::string message) {
  int const me = comm.rank(), n = comm.world_size();
  if (n == 1) {
    if (kind != Failure::kNone) throw_failure(kind, message);
    return;
  }
  std::vector<std::int64_t> first{kind == Failure::kNone ? std::int64_t{n} : std::int64_t{me}};
  host_all_reduce(comm, std::span<std::int64_t>(first), ReduceOp::kMin, CollectiveTag{"checkpoint.agree"});
  int const root = static_cast<int>(first[0]);
  if (root == n) return;
  auto status = static_cast<std::int64_t>(kind);
  broadcast_outcome(comm, root, status, message);
  throw_failure(
      static_cast<Failure>(status),
      root == me ? message : ddp::detail::cat(message, " (reported by rank ", root, "; this is rank ", me, ")"));
}

// Runs f() and classifies what it throws.
template <class F>
Failure run_classified(F&& f, std::string& message) {
  try {
    f();
  } catch (ArgumentError const& e) {
    message = e.what();
    return Failure::kArgument;
  } catch (std::exception const& e) {
    message = e.what();
    return Failure::kIo;
  }
  return Failure::kNone;
}

}  // namespace ddp::detail
