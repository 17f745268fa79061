// ddp/comm/mpi/pmi1.hpp: the end of MPI_Finalize's PMI-1 conversation, against a fake launcher on a
// socket pair.
#include "ddp/comm/mpi/pmi1.hpp"

#include <doctest/doctest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

using namespace std::chrono_literals;

namespace {
// Reads one line from fd (as Hydra's proxy does), or "" at end of stream.
std::string read_line(int fd) {
  std::string line;
  char c = 0;
  while (::read(fd, &c, 1) == 1) {
    line.push_back(c);
    if (c == '\n') break;
  }
  return line;
}

std::string run(std::string const& barrier_reply, std::string const& finalize_reply, std::string* heard) {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  std::thread launcher([&] {
    *heard += read_line(fds[1]);
    if (!barrier_reply.empty()) REQUIRE(::write(fds[1], barrier_reply.data(), barrier_reply.size()) > 0);
    *heard += read_line(fds[1]);
    if (!finalize_reply.empty()) REQUIRE(::write(fds[1], finalize_reply.data(), finalize_reply.size()) > 0);
  });
  std::string error;
  try {
    ddp::detail::pmi1_barrier_and_finalize(fds[0], 200ms);
  } catch (ddp::CommError const& e) {
    error = e.what();
  }
  ::shutdown(fds[0], SHUT_RDWR);
  launcher.join();
  ::close(fds[0]);
  ::close(fds[1]);
  return error;
}
}  // namespace

TEST_CASE("pmi1_barrier_and_finalize: barrier_in, barrier_out, finalize, finalize_ack") {
  std::string heard;
  CHECK(run("cmd=barrier_out\n", "cmd=finalize_ack\n", &heard) == "");
  CHECK(heard == "cmd=barrier_in\ncmd=finalize\n");
}

TEST_CASE("pmi1_barrier_and_finalize: a wrong answer, or none, is an error naming what was expected") {
  std::string heard;
  std::string const wrong = run("cmd=barrier_out\n", "cmd=abort\n", &heard);
  CHECK(wrong.find("answered \"cmd=abort\" instead of \"cmd=finalize_ack\"") != std::string::npos);
  CHECK(wrong.find("PMI_FD=") != std::string::npos);
  std::string const silent = run("", "", &heard);
  CHECK(silent.find("no \"cmd=barrier_out\" from the launcher") != std::string::npos);
  CHECK(silent.find("within 200 ms") != std::string::npos);
}

TEST_CASE("pmi_fd: the launcher's socket from $PMI_FD, nothing for a missing or malformed value") {
  ::setenv("PMI_FD", "6", 1);
  CHECK(ddp::detail::pmi_fd() == 6);
  ::setenv("PMI_FD", "6x", 1);
  CHECK_FALSE(ddp::detail::pmi_fd().has_value());
  ::setenv("PMI_FD", "-1", 1);
  CHECK_FALSE(ddp::detail::pmi_fd().has_value());
  ::unsetenv("PMI_FD");
  CHECK_FALSE(ddp::detail::pmi_fd().has_value());
}
