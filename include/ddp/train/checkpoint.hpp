// Checkpoints: rank 0 writes parameters, optimizer state and the training position atomically in a
// versioned, checksummed binary file; every rank loads and validates it, and a failure surfaces on all ranks.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/train/checkpoint_format.hpp"

namespace ddp {

namespace detail {

inline std::string errno_text(int e) { return std::string(std::strerror(e)); }

// Writes bytes to `path` so that a reader sees either the old file or the complete new one, also after a
// crash: a temporary file in the same directory, write, fsync, rename over `path`, fsync the directory.
inline void write_file_atomically(std::filesystem::path const& path, std::string_view bytes) {
  namespace fs = std::filesystem;
  fs::path const dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw IoError(ddp::detail::cat("cannot write checkpoint ", path.string(), ": directory ", dir.string(),
                                   " does not exist"));
  std::string tmpl = (dir / ("." + path.filename().string() + ".tmp.XXXXXX")).string();
  int fd = ::mkstemp(tmpl.data());
  if (fd < 0)
    throw IoError(ddp::detail::cat("cannot write checkpoint ", path.string(), ": creating a temporary file in ",
                                   dir.string(), " failed: ", errno_text(errno)));
  auto fail = [&](std::string_view what) {
    int const e = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(tmpl.c_str());
    throw IoError(ddp::detail::cat("cannot write checkpoint ", path.string(), ": ", what, " failed: ", errno_text(e)));
  };
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t const w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(ddp::detail::cat("writing ", bytes.size(), " bytes to ", tmpl));
    }
    done += static_cast<std::size_t>(w);
  }
  if (::fchmod(fd, 0644) != 0) fail("fchmod");
  if (::fsync(fd) != 0) fail(ddp::detail::cat("fsync of ", tmpl));
  if (::close(fd) != 0) {
    fd = -1;
    fail(ddp::detail::cat("close of ", tmpl));
  }
  fd = -1;
  if (::rename(tmpl.c_str(), path.c_str()) != 0) fail(ddp::detail::cat("rename ", tmpl, " -> ", path.string()));
  int const dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd < 0) fail(ddp::detail::cat("opening directory ", dir.string(), " to fsync it"));
  int const rc = ::fsync(dfd);
  int const e = errno;
  ::close(dfd);
  if (rc != 0) {
    throw IoError(ddp::detail::cat("checkpoint ", path.string(), " was renamed into place but fsync of directory ",
                                   dir.string(), " failed: ", errno_text(e)));
  }
}

inline std::string read_whole_file(std::filesystem::path const& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw IoError(ddp::detail::cat("checkpoint ", path.string(), " does not exist"));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw IoError(ddp::detail::cat("cannot open checkpoint ", path.string(), ": ", errno_text(errno)));
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw IoError(ddp::detail::cat("error reading checkpoint ", path.string()));
  return bytes;
}

// Packs bytes into int64 words (zero-padded) for collectives, which move int64 but not bytes.
inline std::vector<std::int64_t> to_words(std::string_view s) {
  std::vector<std::int64_t> w((s.size() + 7) / 8, 0);
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
  auto words = comm.rank() == root ? to_words(text)
                                   : std::vector<std::int64_t>((static_cast<std::size_t>(head[1]) + 7) / 8);
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
  throw_failure(static_cast<Failure>(status),
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

}  // namespace detail

// Writes bytes atomically (temp file, fsync, rename, fsync dir). Single process; see save_checkpoint for ranks.
template <class T>
void write_checkpoint_file(std::filesystem::path const& path, CheckpointData<T> const& c) {
  detail::write_file_atomically(path, encode_checkpoint(c));
}
// Reads and validates a checkpoint file (IoError naming the file on any problem). Single process.
template <class T>
CheckpointData<T> read_checkpoint_file(std::filesystem::path const& path) {
  return decode_checkpoint<T>(detail::read_whole_file(path), path.string());
}

// What an optimizer must offer to be checkpointed (every ddp::optim optimizer does).
template <class O, class T>
concept CheckpointableOptimizer = requires(O& o, O const& co, optim::OptimizerState<T> const& st) {
  { co.state() } -> std::same_as<optim::OptimizerState<T>>;
  o.load_state(st);
};

// The model, optimizer and position as a CheckpointData (host copies of the arena's values).
template <class T, MemorySpace S, class O>
  requires CheckpointableOptimizer<O, T>
CheckpointData<T> capture_checkpoint(nn::ParameterArena<T, S> const& arena, O const& opt, TrainPosition const& pos,
                                     std::string_view extra = {}) {
  CheckpointData<T> c{.position = pos, .parameters = {}, .optimizer = opt.state(), .extra = std::string(extra)};
  for (auto const& e : arena.entries()) {
    ParameterRecord<T> r{e.name, {}, std::vector<T>(static_cast<std::size_t>(e.numel))};
    for (int d = 0; d < e.shape.rank(); ++d) r.shape.push_back(e.shape[d]);
    Kernels<S>::to_host(e.numel, arena.values().data() + e.offset, r.values.data());
    c.parameters.push_back(std::move(r));
  }
  return c;
}

// Checks that `c` fits this model and optimizer: same parameters (names, shapes, in order), same optimizer
// kind, counter count and buffers (names, sizes). Throws ArgumentError naming the file and the difference.
template <class T, MemorySpace S, class O>
  requires CheckpointableOptimizer<O, T>
void check_checkpoint_fits(CheckpointData<T> const& c, nn::ParameterArena<T, S> const& arena, O const& opt,
                           std::string const& file) {
  auto err = [&](auto const&... what) {
    return ArgumentError(ddp::detail::cat("checkpoint ", file, " does not fit this model/optimizer: ", what...));
  };
  auto const& es = arena.entries();
  if (c.parameters.size() != es.size())
    throw err("it holds ", c.parameters.size(), " parameters, the model has ", es.size(),
              " (a different --model or architecture?)");
  for (std::size_t i = 0; i < es.size(); ++i) {
    std::vector<std::int64_t> dims;
    for (int d = 0; d < es[i].shape.rank(); ++d) dims.push_back(es[i].shape[d]);
    auto const& r = c.parameters[i];
    if (r.name != es[i].name || r.shape != dims)
      throw err("parameter ", i, " is '", r.name, "' ", detail::shape_string(r.shape), " in the file but '", es[i].name,
                "' ", detail::shape_string(dims), " in the model");
  }
  auto const mine = opt.state();
  auto const& st = c.optimizer;
  if (st.kind != mine.kind)
    throw err("its optimizer state is for '", st.kind, "' but the optimizer is '", mine.kind, "'");
  if (st.counters.size() != mine.counters.size())
    throw err("its ", st.kind, " state has ", st.counters.size(), " parameter counters, expected ",
              mine.counters.size());
  if (st.buffers.size() != mine.buffers.size())
    throw err("its ", st.kind, " state has ", st.buffers.size(), " buffers, expected ", mine.buffers.size());
  for (std::size_t b = 0; b < st.buffers.size(); ++b)
    if (st.buffers[b].name != mine.buffers[b].name || st.buffers[b].data.size() != mine.buffers[b].data.size())
      throw err(st.kind, " buffer ", b, " is '", st.buffers[b].name, "' with ", st.buffers[b].data.size(),
                " elements, expected '", mine.buffers[b].name, "' with ", mine.buffers[b].data.size());
}

// Copies a validated checkpoint into the arena's values and the optimizer.
template <class T, MemorySpace S, class O>
  requires CheckpointableOptimizer<O, T>
void restore_checkpoint(CheckpointData<T> const& c, nn::ParameterArena<T, S>& arena, O& opt) {
  auto const& es = arena.entries();
  for (std::size_t i = 0; i < es.size(); ++i)
    Kernels<S>::from_host(es[i].numel, c.parameters[i].values.data(), arena.values().data() + es[i].offset);
  opt.load_state(c.optimizer);
}

// Collective (every rank calls it): rank 0 captures the model and optimizer and writes `path` atomically;
// the outcome is agreed on, so a failed write throws the same IoError on every rank. `extra` (rank 0's) is
// stored as it is and handed back by load_checkpoint. Other ranks' state is
// not read: under DDP it equals rank 0's (bitwise, for the threads and MPI backends).
template <Communicator C, class T, MemorySpace S, class O>
  requires CheckpointableOptimizer<O, T>
void save_checkpoint(std::filesystem::path const& path, C& comm, nn::ParameterArena<T, S> const& arena, O const& opt,
                     TrainPosition const& pos, std::string_view extra = {}) {
  std::string message;
  auto const kind = comm.rank() != 0 ? detail::Failure::kNone : detail::run_classified([&] {
    write_checkpoint_file(path, capture_checkpoint(arena, opt, pos, extra));
  }, message);
  detail::agree_or_throw(comm, kind, message);
}

// Collective (every rank calls it): rank 0 reads `path` and checks its container (truncation, magic,
// version, checksums); the bytes or the error are broadcast; every rank then decodes them and checks that
// they fit its model and optimizer; only when all ranks agree are parameters and optimizer state restored.
// Any failure throws the same error on every rank (IoError for a bad file, ArgumentError for a model or
// optimizer mismatch), never a hang. Returns the training position stored in the file; `extra`, when given,
// receives the bytes save_checkpoint stored (empty if none).
template <Communicator C, class T, MemorySpace S, class O>
  requires CheckpointableOptimizer<O, T>
TrainPosition load_checkpoint(std::filesystem::path const& path, C& comm, nn::ParameterArena<T, S>& arena, O& opt,
                              std::string* extra = nullptr) {
  std::string const file = path.string();
  std::string text;
  auto kind = detail::Failure::kNone;
  if (comm.rank() == 0) {
    kind = detail::run_classified([&] {
      text = detail::read_whole_file(path);
      (void)decode_checkpoint<T>(text, file);  // container checks once, before shipping the bytes
    }, text);
  }
  if (comm.world_size() > 1) {
    auto status = static_cast<std::int64_t>(kind);
    detail::broadcast_outcome(comm, 0, status, text);
    kind = static_cast<detail::Failure>(status);
  }
  if (kind != detail::Failure::kNone)
    detail::throw_failure(kind, comm.rank() == 0 ? text : ddp::detail::cat(text, " (read by rank 0; this is rank ",
                                                                          comm.rank(), ")"));
  CheckpointData<T> c;
  std::string message;
  kind = detail::run_classified([&] {
    c = decode_checkpoint<T>(text, file);
    check_checkpoint_fits(c, arena, opt, file);
  }, message);
  detail::agree_or_throw(comm, kind, message);
  restore_checkpoint(c, arena, opt);
  if (extra) *extra = std::move(c.extra);
  return c.position;
}

}  // namespace ddp
