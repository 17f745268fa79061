// CheckpointSeries: the last few checkpoints of one run, so that a restarted job (torchrun --max_restarts, a Slurm
// requeue, an mpirun relaunch) resumes from the newest one it can read, at whatever world size it now has.
//   FILE      the newest (what --checkpoint FILE names: a reader of FILE alone sees the latest, as before)
//   FILE.1    the one before, ... FILE.<keep-1>
// Writing rotates first (FILE.<keep-2> -> FILE.<keep-1>, ... by rename, each atomic; FILE.1 becomes a hard link
// to FILE's file, put in place by rename), then replaces FILE atomically (write_file_atomically). So FILE itself is
// never absent, also while the new file is written and fsynced: a reader, a copy or a job resumed by name between
// two checkpoints finds the old one or the new one (on a file system without hard links FILE is moved to FILE.1,
// and is absent until the new one is in place). A process killed at any point leaves every name either absent or
// a whole checkpoint, so the names, read newest first, are the order in which the files were written (FILE.1 may
// briefly be the same file as FILE), and the first that reads back whole is the newest usable one. A file that
// does not (torn by a disk or a copy, a checksum that does not match) is skipped, and said so; a usable file that
// does not fit the model is an error, as for load_checkpoint: it is another run's, and starting over it would lose
// it.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/error.hpp"
#include "ddp/train/checkpoint.hpp"
#include "ddp/train/checkpoint_agree.hpp"
#include "ddp/train/checkpoint_file.hpp"

namespace ddp {

struct CheckpointSeriesOptions {
  int keep = 3;  // how many checkpoints stay: the newest and keep - 1 before it (1: the newest only)
};

class CheckpointSeries {
 public:
  // ArgumentError for an empty path, a path naming a directory, or keep < 1.
  explicit CheckpointSeries(std::filesystem::path newest, CheckpointSeriesOptions opts = {})
      : newest_(std::move(newest)), keep_(opts.keep) {
    if (newest_.empty()) throw ArgumentError("CheckpointSeries: the checkpoint path is empty");
    if (newest_.filename().empty())
      throw ArgumentError(detail::cat("CheckpointSeries: the checkpoint path ", newest_.string(),
                                      " names a directory; give a file name"));
    if (keep_ < 1)
      throw ArgumentError(detail::cat("CheckpointSeries: keep = ", keep_, " keeps no checkpoint; give 1 or more"));
  }

  std::filesystem::path const& newest() const noexcept { return newest_; }
  int keep() const noexcept { return keep_; }

  // The series' names, newest first: FILE, FILE.1, ..., FILE.<keep-1>.
  std::vector<std::filesystem::path> files() const {
    std::vector<std::filesystem::path> out{newest_};
    for (int k = 1; k < keep_; ++k) out.emplace_back(detail::cat(newest_.string(), ".", k));
    return out;
  }

  // Writes `bytes` as the newest checkpoint, the older ones moved down by one name (the oldest kept is replaced).
  // Single process (rank 0 in save_checkpoint). IoError naming the file that could not be moved or written.
  void write(std::string_view bytes) const {
    auto const names = files();
    for (std::size_t k = names.size() - 1; k >= 2; --k) move(names[k - 1], names[k]);
    std::error_code ec;
    if (names.size() >= 2 && std::filesystem::exists(names[0], ec)) keep_newest(names[0], names[1]);
    detail::write_file_atomically(newest_, bytes);
  }

 private:
  static void move(std::filesystem::path const& from, std::filesystem::path const& to) {
    std::error_code ec;
    if (!std::filesystem::exists(from, ec)) return;
    if (std::rename(from.c_str(), to.c_str()) != 0)
      throw IoError(detail::cat("checkpoint ", from.string(), " could not be moved to ", to.string(),
                                " to keep it: ", std::strerror(errno)));
  }

  // FILE.1 := FILE's file, FILE staying in place: a hard link under a temporary name (cleaned up as the writers'
  // temporaries are, should this process be killed in between), renamed over FILE.1. Where the file system has no
  // hard links, FILE is moved.
  static void keep_newest(std::filesystem::path const& newest, std::filesystem::path const& older) {
    auto const dir = older.has_parent_path() ? older.parent_path() : std::filesystem::path(".");
    auto const prefix = detail::temporary_prefix(older);
    detail::remove_stale_temporaries(dir, prefix);
    auto const link = (dir / detail::cat(prefix, ::getpid(), ".link")).string();
    ::unlink(link.c_str());
    if (::link(newest.c_str(), link.c_str()) != 0) {
      int const e = errno;
      if (e == EPERM || e == EOPNOTSUPP || e == EMLINK || e == EXDEV || e == ENOSYS) return move(newest, older);
      throw IoError(detail::cat("checkpoint ", newest.string(), " could not be kept as ", older.string(),
                                ": linking it as ", link, " failed: ", std::strerror(e)));
    }
    int const rc = std::rename(link.c_str(), older.c_str());
    int const e = errno;
    // Gone after a rename, except where `older` already was this very file (a writer killed after its rename and
    // before FILE's replacement): rename then does nothing, and the link is left to remove.
    ::unlink(link.c_str());
    if (rc != 0)
      throw IoError(detail::cat("checkpoint ", newest.string(), " could not be kept as ", older.string(), ": ",
                                std::strerror(e)));
  }

  std::filesystem::path newest_;
  int keep_ = 3;
};

// What load_newest_checkpoint resumed from.
struct ResumedCheckpoint {
  std::filesystem::path file;        // the series' file it loaded
  TrainPosition position;            // the position stored in it
  std::vector<std::string> skipped;  // newer files of the series that could not be read back, each with its reason
};

namespace detail {

// Rank 0's choice: the first file of the series (newest first) that reads back whole. `index` is its place in
// files(), -1 when no file exists; `text` its bytes; `skipped` the reasons for the newer ones. IoError naming every
// file when files exist and none is usable.
template <class T>
void choose_newest(CheckpointSeries const& series, int& index, std::string& text, std::vector<std::string>& skipped) {
  auto const names = series.files();
  index = -1;
  for (std::size_t k = 0; k < names.size(); ++k) {
    std::error_code ec;
    if (!std::filesystem::exists(names[k], ec)) continue;
    try {
      text = read_checkpoint_bytes(names[k]);
      (void)decode_checkpoint<T>(text, names[k].string());  // container checks: truncation, magic, checksums
      index = static_cast<int>(k);
      return;
    } catch (std::exception const& e) {
      skipped.emplace_back(e.what());
    }
  }
  if (skipped.empty()) return;  // nothing written yet: a fresh start
  std::string all;
  for (auto const& s : skipped) all += cat(all.empty() ? "" : "; ", s);
  throw IoError(cat("no usable checkpoint in the series ", series.newest().string(), " (", names.size(),
                    " names kept): ", all,
                    ". Remove these files to start over, or resume from one by name if it can be repaired"));
}

inline std::string join_lines(std::vector<std::string> const& v) {
  std::string out;
  for (auto const& s : v) out += cat(out.empty() ? "" : "\n", s);
  return out;
}
inline std::vector<std::string> split_lines(std::string const& s) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < s.size()) {
    auto const end = s.find('\n', at);
    out.push_back(s.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return out;
}

}  // namespace detail

// Collective: save_checkpoint into the series (rank 0 rotates and writes; the outcome is agreed on every rank).
template <Communicator C, nn::Model M, class O, class T = typename M::value_type>
requires CheckpointableOptimizer<O, T>
void save_checkpoint(CheckpointSeries const& series, C& comm, M const& model, O const& opt, TrainPosition const& pos,
                     std::string_view extra = {}, RoundState<T> const& round = {}) {
  detail::save_checkpoint_with([&](CheckpointData<T> const& c) { series.write(encode_checkpoint(c)); }, comm, model,
                               opt, pos, extra, round);
}

// Collective: resumes from the newest usable checkpoint of the series, at any world size (as load_checkpoint, which
// it is once rank 0 has chosen the file). Returns nothing, on every rank, when the series has no file yet (a fresh
// start). Rank 0 chooses and every rank gets its choice, so ranks that see different files cannot diverge. Errors on
// every rank: IoError when files exist but none reads back (each named with its reason); ArgumentError when the
// newest usable one does not fit the model or optimizer (another run's checkpoint).
template <Communicator C, nn::Model M, class O, class T = typename M::value_type>
requires CheckpointableOptimizer<O, T> std::optional<ResumedCheckpoint> load_newest_checkpoint(
    CheckpointSeries const& series, C& comm, M& model, O& opt, std::string* extra = nullptr,
    RoundState<T>* round = nullptr) {
  int index = -1;
  std::string text;
  std::vector<std::string> skipped;
  auto kind = detail::Failure::kNone;
  if (comm.rank() == 0)
    kind = detail::run_classified([&] { detail::choose_newest<T>(series, index, text, skipped); }, text);
  std::string notes = detail::join_lines(skipped);
  if (comm.world_size() > 1) {
    auto status = static_cast<std::int64_t>(kind);
    detail::broadcast_outcome(comm, 0, status, text);
    kind = static_cast<detail::Failure>(status);
    auto chosen = static_cast<std::int64_t>(index);
    detail::broadcast_outcome(comm, 0, chosen, notes);
    index = static_cast<int>(chosen);
  }
  if (kind != detail::Failure::kNone)
    detail::throw_failure(
        kind, comm.rank() == 0 ? text : detail::cat(text, " (read by rank 0; this is rank ", comm.rank(), ")"));
  if (index < 0) return std::nullopt;
  auto const file = series.files()[static_cast<std::size_t>(index)];
  ResumedCheckpoint r{.file = file, .position = {}, .skipped = detail::split_lines(notes)};
  r.position = detail::load_checkpoint_bytes(text, file.string(), comm, model, opt, extra, round);
  return r;
}

}  // namespace ddp
