// The end of MPI_Finalize's conversation with the launcher, in PMI-1's wire protocol on $PMI_FD (what MPICH's
// Hydra speaks): "cmd=barrier_in" / "cmd=barrier_out", then "cmd=finalize" / "cmd=finalize_ack". MpiSession's
// finalize watchdog says it for a rank whose MPI_Finalize is stuck in UCX after its work is done, so that
// the launcher's barrier completes for the other ranks and the launcher sees a clean exit, not a crash.
// pmi_fd(): that socket, from $PMI_FD, where this process has one.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/error.hpp"

namespace ddp::detail {

// The launcher's PMI socket ($PMI_FD, set by MPICH's Hydra and by Slurm's PMI), if this process has one.
inline std::optional<int> pmi_fd() {
  char const* text = std::getenv("PMI_FD");
  if (text == nullptr) return std::nullopt;
  char* end = nullptr;
  long const fd = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || fd < 0 || fd > (1 << 20)) return std::nullopt;
  return static_cast<int>(fd);
}

inline void pmi1_send(int fd, std::string_view line) {
  for (std::size_t sent = 0; sent < line.size();) {
    ssize_t const n = ::write(fd, line.data() + sent, line.size() - sent);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw CommError(cat("PMI: writing \"", line.substr(0, line.size() - 1), "\" to the launcher (PMI_FD=", fd,
                          ") failed: ", n < 0 ? std::strerror(errno) : "nothing written"));
    }
    sent += static_cast<std::size_t>(n);
  }
}

// Reads one line (byte by byte: nothing after it is taken) and checks that it is `expected`; each byte must
// come within `limit`.
inline void pmi1_expect(int fd, std::string_view expected, std::chrono::milliseconds limit) {
  std::string line;
  for (char c = 0; c != '\n';) {
    pollfd p{fd, POLLIN, 0};
    int const ready = ::poll(&p, 1, static_cast<int>(limit.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      throw CommError(cat("PMI: no \"", expected.substr(0, expected.size() - 1), "\" from the launcher (PMI_FD=", fd,
                          ") within ", limit.count(), " ms"));
    }
    ssize_t const n = ready < 0 ? -1 : ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw CommError(cat("PMI: the launcher's socket (PMI_FD=", fd, ") ", n < 0 ? std::strerror(errno) : "was closed",
                          " before \"", expected.substr(0, expected.size() - 1), "\""));
    }
    if (line.size() >= 1024) throw CommError(cat("PMI: a line longer than 1 KiB from the launcher (PMI_FD=", fd, ")"));
    line.push_back(c);
  }
  if (line != expected) {
    line.pop_back();
    throw CommError(cat("PMI: the launcher (PMI_FD=", fd, ") answered \"", line, "\" instead of \"",
                        expected.substr(0, expected.size() - 1), "\""));
  }
}

// Barrier, then finalize, as MPI_Finalize ends. Throws CommError naming the step that failed.
inline void pmi1_barrier_and_finalize(int fd, std::chrono::milliseconds limit) {
  pmi1_send(fd, "cmd=barrier_in\n");
  pmi1_expect(fd, "cmd=barrier_out\n", limit);
  pmi1_send(fd, "cmd=finalize\n");
  pmi1_expect(fd, "cmd=finalize_ack\n", limit);
}

}  // namespace ddp::detail
