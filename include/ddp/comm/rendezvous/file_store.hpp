// FileStore: a Store in a directory every rank sees (a shared filesystem under Slurm, /tmp on one host). One
// file per key, written to a temporary name and renamed into place, so a reader sees a whole value or none;
// counters (add) are read-modify-write under an flock of the directory's lock file. Waiting polls, backing off
// to 50 ms.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/rendezvous/store.hpp"
#include "ddp/error.hpp"

namespace ddp {

class FileStore final : public Store {
 public:
  // Creates the directory (and its parents) if needed; ArgumentError naming it when that fails.
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {
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

 private:
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
};

}  // namespace ddp
