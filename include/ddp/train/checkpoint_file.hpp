// Checkpoint files on disk: written atomically (a temporary file in the same directory, fsync, rename, fsync of the
// directory), so a reader or a crash sees the old file or the whole new one, never a part; read back bounded by the
// file's size, only from a regular file, the header checked before the payload is read. Temporaries that writers
// killed mid-write left behind are removed by the next writer on the same host. Single process: rank 0's part of
// save_checkpoint / load_checkpoint (train/checkpoint.hpp), and write_checkpoint_file / read_checkpoint_file.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <string>
#include <string_view>

#include "ddp/error.hpp"
#include "ddp/train/checkpoint_format.hpp"

namespace ddp {

namespace detail {

inline std::string errno_text(int e) { return std::string(std::strerror(e)); }

// The temporary files of `path`'s writers are named ".<name>.tmp.<host>.<pid>.XXXXXX"; this is the part up to
// the pid.
inline std::string temporary_prefix(std::filesystem::path const& path) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  for (char* c = host; *c != '\0'; ++c) {
    if (*c == '.' || *c == '/') *c = '_';
  }
  return ddp::detail::cat(".", path.filename().string(), ".tmp.", host, ".");
}

// Removes the temporary files that writers of `path` on this host left when they were killed mid-write (their
// process no longer exists). Files of live writers, and of writers on other hosts sharing the directory, stay.
inline void remove_stale_temporaries(std::filesystem::path const& dir, std::string const& prefix) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string const name = it->path().filename().string();
    if (!name.starts_with(prefix)) continue;
    char* after = nullptr;
    long const pid = std::strtol(name.c_str() + prefix.size(), &after, 10);
    if (pid <= 0 || after == nullptr || *after != '.') continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove(it->path(), ec);
  }
}

// Writes bytes to `path` so that a reader sees either the old file or the complete new one, also after a
// crash: a temporary file in the same directory, write, fsync, rename over `path`, fsync the directory. The
// temporary files of earlier writers of `path` on this host that were killed are removed first.
inline void write_file_atomically(std::filesystem::path const& path, std::string_view bytes) {
  namespace fs = std::filesystem;
  fs::path const dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw IoError(
        ddp::detail::cat("cannot write checkpoint ", path.string(), ": directory ", dir.string(), " does not exist"));
  std::string const prefix = temporary_prefix(path);
  remove_stale_temporaries(dir, prefix);
  std::string tmpl = (dir / ddp::detail::cat(prefix, ::getpid(), ".XXXXXX")).string();
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

// What a path that is not a regular file is, for errors.
inline char const* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// Reads a checkpoint file's bytes, bounded by its size: only regular files (a device such as /dev/zero, a FIFO
// or a directory is refused at once, without reading), and the 32-byte header is validated
// (check_checkpoint_header) before the rest is read, so a file that is not a checkpoint costs 32 bytes of reading
// and no allocation beyond them. IoError naming the file.
inline std::string read_checkpoint_bytes(std::filesystem::path const& path) {
  std::string const file = path.string();
  auto err = [&](auto const&... what) { return IoError(ddp::detail::cat("checkpoint ", file, what...)); };
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below anyway.
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int const e = errno;
    if (e == ENOENT) throw err(" does not exist");
    throw IoError(ddp::detail::cat("cannot open checkpoint ", file, ": ", errno_text(e)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw err(": fstat failed: ", errno_text(errno));
  if (!S_ISREG(st.st_mode))
    throw err(" is ", file_kind(st.st_mode),
              ", not a regular file: a checkpoint is a file written by save_checkpoint / write_checkpoint_file");
  auto const size = static_cast<std::uint64_t>(st.st_size);
  auto read_into = [&](char* dst, std::size_t n) {
    std::size_t done = 0;
    while (done < n) {
      ssize_t const got = ::read(fd, dst + done, n - done);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw err(": read error after ", done, " bytes: ", errno_text(errno));
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    return done;
  };
  std::string bytes(static_cast<std::size_t>(std::min<std::uint64_t>(size, kCheckpointHeaderBytes)), '\0');
  bytes.resize(read_into(bytes.data(), bytes.size()));
  check_checkpoint_header(bytes, size, file);  // magic, checksum, version, length: before reading the payload
  try {
    bytes.resize(static_cast<std::size_t>(size));
  } catch (std::bad_alloc const&) {
    throw err(": ", size, " bytes (the file's size, which its header confirms) cannot be allocated in memory");
  }
  std::size_t const got = read_into(bytes.data() + kCheckpointHeaderBytes, bytes.size() - kCheckpointHeaderBytes);
  if (got != bytes.size() - kCheckpointHeaderBytes)
    throw err(": the file shrank while being read (", kCheckpointHeaderBytes + got, " of ", size,
              " bytes); is another process writing it in place?");
  return bytes;
}

}  // namespace detail

// Writes bytes atomically (temp file, fsync, rename, fsync dir). Single process; see save_checkpoint for ranks.
template <class T>
void write_checkpoint_file(std::filesystem::path const& path, CheckpointData<T> const& c) {
  detail::write_file_atomically(path, encode_checkpoint(c));
}
// Reads and validates a checkpoint file (IoError naming the file on any problem): a regular file only, its
// header checked before the payload is read (read_checkpoint_bytes), then decode_checkpoint. Single process.
template <class T>
CheckpointData<T> read_checkpoint_file(std::filesystem::path const& path) {
  return decode_checkpoint<T>(detail::read_checkpoint_bytes(path), path.string());
}

}  // namespace ddp
