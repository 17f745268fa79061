// The rendezvous without mpirun (include/ddp/comm/rendezvous): the TCP store against its own server (PyTorch's
// TCPStore protocol), the file store, and every bad launch ending in bounded time with a message that names the
// cause on every rank: a partial environment, an unreachable store, a rank that never arrives, two jobs on one
// port, a WORLD_SIZE that does not match, garbage sent to the store's port. Ranks are threads with their own
// environments (RendezvousOptions::env).
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/rendezvous/rendezvous.hpp"

namespace {

using namespace std::chrono_literals;
using Env = std::map<std::string, std::string>;

std::string text(std::vector<char> const& v) { return std::string(v.begin(), v.end()); }

ddp::EnvLookup lookup(Env env) {
  return [env = std::move(env)](std::string_view name) -> std::optional<std::string> {
    auto it = env.find(std::string(name));
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

Env torch_env(int rank, int world, int port, bool agent) {
  Env e{{"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(world)},
        {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(world)},
        {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", std::to_string(port)}};
  if (agent) e["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  return e;
}

// Runs rendezvous() for each env on its own thread; returns each rank's error message ("" if it succeeded).
std::vector<std::string> meet(std::vector<Env> const& envs, std::chrono::milliseconds timeout) {
  std::vector<std::string> out(envs.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < envs.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        auto rv = ddp::rendezvous({.timeout = timeout, .env = lookup(envs[i])});
        // Hold the store (rank 0 may serve it) until every other rank is done with it.
        auto const count = [&](char const* key) { return std::stoll(text(rv.store->get(key, timeout))); };
        rv.store->add("done", 1);
        while (count("done") < static_cast<long long>(envs.size())) std::this_thread::sleep_for(1ms);
        rv.store->add("left", 1);
        if (rv.launch.rank == 0)
          while (count("left") < static_cast<long long>(envs.size())) std::this_thread::sleep_for(1ms);
      } catch (std::exception const& e) {
        out[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// A port nothing listens on right now.
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace

TEST_CASE("TcpStore against TcpStoreServer: set, get after a wait, add, check; garbage closes only its connection") {
  ddp::TcpStoreServer server({.host = "127.0.0.1"});
  REQUIRE(server.port() > 0);
  ddp::TcpStore a({.port = server.port(), .timeout = 10s}), b({.port = server.port(), .timeout = 10s});
  std::thread later([&] {
    std::this_thread::sleep_for(50ms);
    b.set("k", {'v', '1'});
  });
  CHECK(text(a.get("k", 5s)) == "v1");  // waits for b
  later.join();
  CHECK(a.add("n", 2) == 2);
  CHECK(b.add("n", 3) == 5);
  CHECK(a.check({"k", "n"}));
  CHECK_FALSE(a.check({"k", "missing"}));
  CHECK_THROWS_WITH_AS(a.get("missing", 200ms), doctest::Contains("key 'missing' did not appear"), ddp::CommError);
  CHECK(text(a.get("k", 1s)) == "v1");  // the client reconnected after the timeout

  // Garbage: an HTTP request, and a length of 2^60.
  for (std::string junk :
       {std::string("GET / HTTP/1.1\r\n\r\n"), std::string("\x02\x00\x00\x00\x00\x00\x00\x10\x00", 9)}) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(server.port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    CHECK(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(junk.size()));
    char c;
    CHECK(::recv(fd, &c, 1, 0) == 0);  // the server closed it
    ::close(fd);
  }
  CHECK(server.rejected() == 2);
  CHECK(b.add("n", 1) == 6);  // the store still serves
}

TEST_CASE("FileStore: set, get, add, check, in a fresh directory") {
  auto const dir = std::filesystem::temp_directory_path() / ("ddp_file_store_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  {
    ddp::FileStore s(dir.string() + "/job");
    s.set("a/b", {'x'});
    CHECK(text(s.get("a/b", 1s)) == "x");
    CHECK(s.add(".lock", 4) == 4);  // a key may look like the lock file; it is escaped
    CHECK(s.add(".lock", -1) == 3);
    CHECK(s.check({"a/b", ".lock"}));
    CHECK_FALSE(s.check({"nope"}));
    CHECK_THROWS_WITH_AS(s.get("nope", 100ms), doctest::Contains("file store"), ddp::CommError);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("env, torchrun-style and file rendezvous meet at world sizes 1, 2 and 4") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    int const port = free_port();
    std::vector<Env> env;
    for (int r = 0; r < n; ++r) env.push_back(torch_env(r, n, port, false));
    for (auto const& m : meet(env, 20s)) CHECK(m == "");

    // torchrun: the agent serves; every rank is a client.
    ddp::TcpStoreServer agent({.host = "127.0.0.1"});
    env.clear();
    for (int r = 0; r < n; ++r) env.push_back(torch_env(r, n, agent.port(), true));
    for (auto const& m : meet(env, 20s)) CHECK(m == "");

    auto const dir =
        std::filesystem::temp_directory_path() / ("ddp_rv_" + std::to_string(::getpid()) + "_" + std::to_string(n));
    std::filesystem::remove_all(dir);
    env.clear();
    for (int r = 0; r < n; ++r)
      env.push_back({{"RANK", std::to_string(r)},
                     {"WORLD_SIZE", std::to_string(n)},
                     {"LOCAL_RANK", std::to_string(r)},
                     {"LOCAL_WORLD_SIZE", std::to_string(n)},
                     {"DDP_STORE_FILE", dir.string()}});
    for (auto const& m : meet(env, 20s)) CHECK(m == "");
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("a partial or contradictory environment is an ArgumentError naming the variables") {
  Env e = torch_env(0, 2, 29500, false);
  e.erase("MASTER_PORT");
  CHECK_THROWS_WITH_AS(ddp::rendezvous({.timeout = 1s, .env = lookup(e)}),
                       doctest::Contains("MASTER_PORT is not set but MASTER_ADDR=127.0.0.1 is"), ddp::ArgumentError);
  e = torch_env(0, 2, 70000, false);
  CHECK_THROWS_WITH_AS(ddp::rendezvous({.timeout = 1s, .env = lookup(e)}),
                       doctest::Contains("MASTER_PORT=\"70000\" is not a port"), ddp::ArgumentError);
  e = torch_env(1, 2, 29500, false);
  e.erase("MASTER_ADDR");
  e.erase("MASTER_PORT");
  CHECK_THROWS_WITH_AS(ddp::rendezvous({.timeout = 1s, .env = lookup(e)}),
                       doctest::Contains("no way to find the other ranks"), ddp::ArgumentError);
  e = torch_env(1, 2, 29500, false);
  e["DDP_STORE_FILE"] = "/tmp/x";
  CHECK_THROWS_WITH_AS(ddp::rendezvous({.timeout = 1s, .env = lookup(e)}), doctest::Contains("both DDP_STORE_FILE"),
                       ddp::ArgumentError);
}

TEST_CASE("an unreachable store ends within the timeout, naming the address") {
  auto const start = std::chrono::steady_clock::now();
  auto const errs = meet({torch_env(1, 2, free_port(), false)}, 1500ms);  // rank 0 (the server) never starts
  CHECK(errs[0].find("cannot connect to 127.0.0.1:") != std::string::npos);
  Env e = torch_env(1, 2, 29500, false);
  e["MASTER_ADDR"] = "no-such-host.invalid";
  auto const bad = meet({e}, 1s);
  CHECK(bad[0].find("cannot resolve the address 'no-such-host.invalid'") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
}

TEST_CASE("a rank that never arrives is named on every rank that did, within the timeout") {
  int const port = free_port();
  auto const start = std::chrono::steady_clock::now();
  auto const errs =
      meet({torch_env(0, 4, port, false), torch_env(1, 4, port, false), torch_env(3, 4, port, false)}, 1500ms);
  for (auto const& m : errs) {
    CAPTURE(m);
    CHECK(m.find("rank 2 of 4 did not arrive within 1.5 s") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - start < 10s);
}

TEST_CASE("a WORLD_SIZE that does not match is an error on every rank, naming both sizes") {
  int const port = free_port();
  auto const errs =
      meet({torch_env(0, 2, port, false), torch_env(1, 3, port, false), torch_env(2, 3, port, false)}, 3s);
  CAPTURE(errs[0]);
  CAPTURE(errs[1]);
  CAPTURE(errs[2]);
  CHECK(errs[0].find("rank 0 was launched with WORLD_SIZE 2 but rank 1 says 3") != std::string::npos);
  CHECK(errs[1].find("rank 1 was launched with WORLD_SIZE 3 but rank 0 says 2") != std::string::npos);
  CHECK(errs[2].find("rank 2 was launched with WORLD_SIZE 3 but rank 0 says 2") != std::string::npos);
}

TEST_CASE("two jobs on one port: the second cannot serve it, and its ranks that reach the first are refused") {
  int const port = free_port();
  ddp::TcpStoreServer first({.port = port});
  // The first job's rank 1 has claimed its rank.
  ddp::PrefixStore job1("ddp/", std::make_shared<ddp::TcpStore>(ddp::TcpStore::Options{.port = port}));
  job1.add("rank_1/claims", 1);
  auto const errs = meet({torch_env(0, 2, port, false), torch_env(1, 2, port, false)}, 2s);
  CAPTURE(errs[0]);
  CAPTURE(errs[1]);
  CHECK(errs[0].find("cannot listen on 0.0.0.0:" + std::to_string(port)) != std::string::npos);
  CHECK(errs[1].find("rank 1 has already joined") != std::string::npos);
  CHECK(errs[1].find("two jobs share this store") != std::string::npos);
}
