// FileStore: a Store in a directory every rank sees (a shared filesystem under Slurm, /tmp on one host). One
// file per key, written to a temporary name and renamed into place, so a reader sees a whole value or none;
// counters (add) are read-modify-write under an flock of the directory's lock file. Waiting polls, backing off
// to 50 ms.
// Liveness through flock (released by the kernel however a process ends; NFS and Lustre carry flock as POSIX
// locks, released when the lock manager learns a node is gone): every FileStore holds a shared lock on the
// directory's ".live" file while it exists, and a rank marks itself with an exclusive lock on ".rank_<r>.live"
// (hold_rank), which its peers can test (rank_gone). With StaleKeys::kClear (ddp::rendezvous's choice), a store
// that finds nobody holding ".live" clears the keys a finished job left (a Slurm requeue keeps the job id and so
// the directory), while a directory a live job uses is left alone: its check-in then refuses the second job.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/rendezvous/store.hpp"
#include "ddp/error.hpp"

namespace ddp {

// What a FileStore does with keys it finds when no live process uses the directory.
enum class StaleKeys {
  kKeep,   // read them (a store reopened by the same program)
  kClear,  // delete them: they are a finished job's (ddp::rendezvous)
};
struct FileStoreOptions {
  StaleKeys stale = StaleKeys::kKeep;
};

class FileStore final : public Store {
 public:
  // Creates the directory (and its parents) if needed; ArgumentError naming it when that fails or when it cannot be
  // written. Then joins the directory's live users (see the top of this file).
  explicit FileStore(std::string dir, FileStoreOptions opts = {}) : dir_(std::move(dir)) {
    if (dir_.empty()) throw ArgumentError("FileStore: the directory is empty");
    for (std::size_t at = 1; at <= dir_.size(); ++at) {
      if (at != dir_.size() && dir_[at] != '/') continue;
      std::string const part = dir_.substr(0, at);
      if (::mkdir(part.c_str(), 0777) != 0 && errno != EEXIST)
        throw ArgumentError(detail::cat("FileStore: cannot create the directory '", part, "': ", std::strerror(errno)));
    }
    struct stat st {};
    if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      throw ArgumentError(detail::cat("FileStore: '", dir_, "' is not a directory"));
    live_ = open_lock(".live", O_CREAT);
    if (live_ < 0)
      throw ArgumentError(detail::cat("FileStore: cannot write in the directory '", dir_, "' (creating '", dir_,
                                      "/.live' failed: ", std::strerror(errno),
                                      "); the store's directory must be writable by every rank"));
    if (opts.stale == StaleKeys::kClear && ::flock(live_, LOCK_EX | LOCK_NB) == 0) clear_keys();
    while (::flock(live_, LOCK_SH) != 0 && errno == EINTR) {}  // waits for a store clearing the directory
  }
  FileStore(FileStore const&) = delete;
  FileStore& operator=(FileStore const&) = delete;
  ~FileStore() override {
    for (auto const& [rank, fd] : ranks_) ::close(fd);
    ::close(live_);  // releases the locks
  }

  void set(std::string const& key, std::vector<char> const& value) override {
    std::string const tmp = detail::cat(path(key), ".tmp.", ::getpid(), ".", counter_++);
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(value.data(), static_cast<std::streamsize>(value.size()));
      if (!out) throw CommError(detail::cat(describe(), ": cannot write '", tmp, "'"));
    }
    if (std::rename(tmp.c_str(), path(key).c_str()) != 0)
      throw CommError(detail::cat(describe(), ": cannot rename '", tmp, "': ", std::strerror(errno)));
  }
  std::vector<char> get(std::string const& key, std::chrono::milliseconds timeout) override {
    auto const deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      std::ifstream in(path(key), std::ios::binary);
      if (in) return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      if (std::chrono::steady_clock::now() >= deadline)
        throw CommError(detail::cat(describe(), ": key '", key, "' did not appear within ",
                                    std::chrono::duration<double>(timeout).count(), " s"));
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  }
  std::int64_t add(std::string const& key, std::int64_t delta) override {
    std::string const lock = dir_ + "/.lock";
    int const fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) throw CommError(detail::cat(describe(), ": cannot open '", lock, "': ", std::strerror(errno)));
    struct Unlock {
      int fd;
      ~Unlock() {
        ::flock(fd, LOCK_UN);
        ::close(fd);
      }
    } unlock{fd};
    if (::flock(fd, LOCK_EX) != 0) throw CommError(detail::cat(describe(), ": flock: ", std::strerror(errno)));
    std::int64_t v = 0;
    if (std::ifstream in(path(key)); in) in >> v;
    v += delta;
    std::string const text = std::to_string(v);
    set(key, std::vector<char>(text.begin(), text.end()));
    return v;
  }
  bool check(std::vector<std::string> const& keys) override {
    return std::all_of(keys.begin(), keys.end(),
                       [&](std::string const& k) { return ::access(path(k).c_str(), F_OK) == 0; });
  }
  std::string describe() const override { return detail::cat("file store ", dir_); }
  void hold_rank(int rank) override {
    if (ranks_.count(rank)) return;
    int const fd = open_lock(detail::cat(".rank_", rank, ".live"), O_CREAT);
    if (fd < 0) return;                         // nothing to show: this rank then never looks gone
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {  // held by a live process: two jobs share the directory (check-in
      ::close(fd);                              // refuses the second)
      return;
    }
    ranks_[rank] = fd;
  }
  bool rank_gone(int rank) override {
    if (ranks_.count(rank)) return false;
    int const fd = open_lock(detail::cat(".rank_", rank, ".live"), 0);
    if (fd < 0) return false;  // it never marked itself
    bool const gone = ::flock(fd, LOCK_SH | LOCK_NB) == 0;
    ::close(fd);
    return gone;
  }

 private:
  int open_lock(std::string const& name, int create) const {
    return ::open((dir_ + "/" + name).c_str(), O_RDWR | O_CLOEXEC | create, 0666);
  }
  // Removes every file but the lock files: called holding ".live" exclusively, so no live store uses the keys.
  void clear_keys() const {
    DIR* d = ::opendir(dir_.c_str());
    if (d == nullptr) return;
    while (dirent const* e = ::readdir(d)) {
      std::string const name = e->d_name;
      if (name == "." || name == ".." || name == ".live" || name == ".lock") continue;
      std::string const path = dir_ + "/" + name;
      struct stat st {};
      if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) ::unlink(path.c_str());
    }
    ::closedir(d);
  }

  // Keys may hold '/': the file name is the key with every byte outside [A-Za-z0-9._-] (and a leading '.')
  // escaped as %XX, so no key can name the lock file or a directory.
  std::string path(std::string const& key) const {
    static constexpr char kHex[] = "0123456789ABCDEF";
    std::string name;
    for (unsigned char ch : key) {
      if (std::isalnum(ch) || (ch == '.' && !name.empty()) || ch == '_' || ch == '-') {
        name += static_cast<char>(ch);
      } else {
        name += '%';
        name += kHex[ch >> 4];
        name += kHex[ch & 15];
      }
    }
    return dir_ + "/" + (name.empty() ? std::string("%") : name);
  }

  std::string dir_;
  std::uint64_t counter_ = 0;
  int live_ = -1;             // shared lock on ".live" while this store exists
  std::map<int, int> ranks_;  // the ranks this process holds: ".rank_<r>.live", locked exclusively
};

}  // namespace ddp
