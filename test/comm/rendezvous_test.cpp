// The rendezvous without mpirun (include/ddp/comm/rendezvous): the TCP store against its own server (PyTorch's
// TCPStore protocol), the file store, and every bad launch ending in bounded time with a message that names the
// cause on every rank: a partial environment, an unreachable store, a rank that never arrives, two jobs on one
// port, a WORLD_SIZE that does not match, garbage sent to the store's port. Ranks are threads with their own
// environments (RendezvousOptions::env).
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

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

// test/comm/torch2_store_server.py (PyTorch 2.x's TCPStore server, written from its sources) as a child process;
// killed when this goes out of scope.
struct Torch2Server {
  pid_t pid = -1;
  int port = 0;
  explicit Torch2Server(bool libuv) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::dup2(fds[1], 1);
      ::close(fds[0]);
      char const* script = "test/comm/torch2_store_server.py";
      if (libuv)
        ::execlp("python3", "python3", script, "--libuv", static_cast<char*>(nullptr));
      else
        ::execlp("python3", "python3", script, static_cast<char*>(nullptr));
      std::_Exit(127);
    }
    ::close(fds[1]);
    FILE* out = ::fdopen(fds[0], "r");
    REQUIRE(std::fscanf(out, "%d", &port) == 1);
    std::fclose(out);
  }
  ~Torch2Server() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

// A connection to 127.0.0.1:port for raw bytes.
int raw_connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  return fd;
}
std::string raw_exchange(int fd, std::string const& request, std::size_t reply_bytes) {
  REQUIRE(::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size()));
  std::string reply(reply_bytes, '\0');
  std::size_t got = 0;
  while (got < reply_bytes) {
    ssize_t const k = ::recv(fd, reply.data() + got, reply_bytes - got, 0);
    if (k <= 0) break;
    got += static_cast<std::size_t>(k);
  }
  reply.resize(got);
  return reply;
}
std::string u64_bytes(std::uint64_t v) { return std::string(reinterpret_cast<char const*>(&v), 8); }
std::string field(std::string const& s) { return u64_bytes(s.size()) + s; }

// What every store test does with a pair of clients of one store.
void exercise(ddp::TcpStore& a, ddp::TcpStore& b) {
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
}

}  // namespace

TEST_CASE("TcpStore speaks PyTorch 2.x's protocol: detected against a 2.x server written from its sources") {
  for (bool libuv : {false, true}) {  // the classic server closes a foreign first request; libuv ignores it
    CAPTURE(libuv);
    Torch2Server server(libuv);
    ddp::TcpStore a({.port = server.port, .timeout = 10s}), b({.port = server.port, .timeout = 10s});
    CHECK(a.protocol() == ddp::StoreProtocol::kTorch2);
    exercise(a, b);
    CHECK(b.add("n", 1) == 6);
    // 1.x's protocol forced on a 2.x server fails at the first request, naming the store.
    ddp::TcpStore old({.port = server.port, .timeout = 1s, .protocol = ddp::StoreProtocol::kTorch1});
    CHECK_THROWS_WITH_AS(old.add("n", 1), doctest::Contains("TCP store 127.0.0.1:"), ddp::CommError);
  }
}

TEST_CASE("TcpStoreServer answers PyTorch 1.x and 2.x clients alike, and 2.x's PING, APPEND and MULTI_GET") {
  ddp::TcpStoreServer server({.host = "127.0.0.1"});
  ddp::TcpStore one({.port = server.port(), .timeout = 10s, .protocol = ddp::StoreProtocol::kTorch1});
  ddp::TcpStore two({.port = server.port(), .timeout = 10s, .protocol = ddp::StoreProtocol::kTorch2});
  ddp::TcpStore found({.port = server.port(), .timeout = 10s});
  CHECK(found.protocol() != ddp::StoreProtocol::kDetect);  // both probes get an answer here: either one wins
  exercise(one, two);
  CHECK(found.add("n", 1) == 6);
  CHECK(text(two.get("k", 1s)) == "v1");
  // Raw 2.x bytes: VALIDATE, PING (echoed), APPEND (no reply), MULTI_GET (a value per key, empty when missing).
  int fd = raw_connect(server.port());
  std::string const validate("\x00\xCE\xF7\x85\x3C", 5);
  CHECK(raw_exchange(fd,
                     validate + std::string("\x0D"
                                            "abcd",
                                            5),
                     4) == "abcd");
  std::string const append = std::string(1, '\x09') + field("k") + field("+2");
  std::string const multi_get = std::string(1, '\x0A') + u64_bytes(2) + field("k") + field("none");
  CHECK(raw_exchange(fd, append + multi_get, 8 + 4 + 8) == field("v1+2") + u64_bytes(0));
  ::close(fd);
  CHECK(server.rejected() == 0);
}

TEST_CASE("a service on the store's port that is not a TCPStore is named as such, within the probe window") {
  // Accepts connections and never answers (a stuck service); and one that answers with an HTTP error.
  for (bool http : {false, true}) {
    CAPTURE(http);
    int const lfd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(lfd, 8) == 0);
    socklen_t len = sizeof a;
    ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
    int const port = ntohs(a.sin_port);
    std::vector<int> accepted;
    std::thread service([&] {
      for (int i = 0; i < 2; ++i) {
        int const c = ::accept(lfd, nullptr, nullptr);
        if (c < 0) return;
        accepted.push_back(c);
        if (http) {
          std::string const r = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
          ::send(c, r.data(), r.size(), MSG_NOSIGNAL);
        }
      }
    });
    auto const t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(ddp::TcpStore({.port = port, .timeout = 10s, .probe_window = 500ms}),
                         doctest::Contains("does not speak PyTorch's TCPStore protocol"), ddp::CommError);
    CHECK(std::chrono::steady_clock::now() - t0 < (http ? 1s : 5s));  // an answer that is no key count ends it
    service.join();
    for (int c : accepted) ::close(c);
    ::close(lfd);
  }
}

TEST_CASE("TcpStore against TcpStoreServer: set, get after a wait, add, check; garbage closes only its connection") {
  ddp::TcpStoreServer server({.host = "127.0.0.1"});
  REQUIRE(server.port() > 0);
  ddp::TcpStore a({.port = server.port(), .timeout = 10s}), b({.port = server.port(), .timeout = 10s});
  exercise(a, b);

  // Garbage: an HTTP request, and a length of 2^60.
  for (std::string junk :
       {std::string("GET / HTTP/1.1\r\n\r\n"), std::string("\x02\x00\x00\x00\x00\x00\x00\x10\x00", 9)}) {
    int const fd = raw_connect(server.port());
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

TEST_CASE("a store directory a finished job left is reused (a Slurm requeue); one a live job uses is refused") {
  auto const dir = std::filesystem::temp_directory_path() / ("ddp_requeue_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto file_env = [&](int r, int n) {
    return Env{{"RANK", std::to_string(r)},
               {"WORLD_SIZE", std::to_string(n)},
               {"LOCAL_RANK", std::to_string(r)},
               {"LOCAL_WORLD_SIZE", std::to_string(n)},
               {"DDP_STORE_FILE", dir.string()}};
  };
  for (auto const& m : meet({file_env(0, 2), file_env(1, 2)}, 10s)) CHECK(m == "");
  CHECK(std::filesystem::exists(dir / "ddp%2Frank_1%2Fclaims"));  // the finished job's keys are still there
  for (auto const& m : meet({file_env(0, 2), file_env(1, 2)}, 10s)) CHECK(m == "");  // and the job runs again

  // A live job holds the directory: a second job's ranks are refused, naming the cause.
  std::vector<ddp::Rendezvous> live(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] { live[r] = ddp::rendezvous({.timeout = 10s, .env = lookup(file_env(r, 2))}); });
  for (auto& t : ranks) t.join();
  auto const errs = meet({file_env(0, 2), file_env(1, 2)}, 2s);
  for (auto const& e : errs) {
    CAPTURE(e);
    CHECK(e.find("two jobs share this store") != std::string::npos);
  }
  live.clear();
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "a requeued job (SLURM_RESTART_COUNT) meets under its own attempt's keys, even while a process of the "
    "attempt before still holds the directory") {
  auto const dir = std::filesystem::temp_directory_path() / ("ddp_requeue2_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto slurm_env = [&](int r, std::string const& restarts) {
    Env e{{"SLURM_PROCID", std::to_string(r)}, {"SLURM_NTASKS", "2"},  {"SLURM_LOCALID", std::to_string(r)},
          {"SLURM_NTASKS_PER_NODE", "2"},      {"SLURM_JOB_ID", "77"}, {"DDP_STORE_FILE", dir.string()}};
    if (!restarts.empty()) e["SLURM_RESTART_COUNT"] = restarts;
    return e;
  };
  // The first attempt's ranks are still alive (they hold the directory and their claims).
  std::vector<ddp::Rendezvous> old(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] { old[r] = ddp::rendezvous({.timeout = 10s, .env = lookup(slurm_env(r, ""))}); });
  for (auto& t : ranks) t.join();
  // Without the requeue count, the new attempt cannot be told from a second job: refused.
  for (auto const& e : meet({slurm_env(0, ""), slurm_env(1, "")}, 2s))
    CHECK(e.find("two jobs share this store") != std::string::npos);
  // With it (Slurm sets it from the first requeue on), the attempt meets under keys of its own.
  for (auto const& m : meet({slurm_env(0, "1"), slurm_env(1, "1")}, 10s)) CHECK(m == "");
  CHECK(std::filesystem::exists(dir / "ddp%2Fattempt_1%2Frank_1%2Fclaims"));
  old.clear();
  for (auto const& m : meet({slurm_env(0, "2"), slurm_env(1, "2")}, 10s)) CHECK(m == "");
  CHECK_THROWS_WITH_AS(ddp::rendezvous({.timeout = 1s, .env = lookup(slurm_env(0, "x"))}),
                       doctest::Contains("SLURM_RESTART_COUNT=\"x\" is not a count of requeues"), ddp::ArgumentError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a store directory that cannot be written is named at once, not blamed on rank 0") {
  // /proc/1 is a directory no one can create files in, root included.
  CHECK_THROWS_WITH_AS(ddp::FileStore("/proc/1"), doctest::Contains("cannot write in the directory '/proc/1'"),
                       ddp::ArgumentError);
  Env e{{"RANK", "1"},
        {"WORLD_SIZE", "2"},
        {"LOCAL_RANK", "1"},
        {"LOCAL_WORLD_SIZE", "2"},
        {"DDP_STORE_FILE", "/proc/1"}};
  try {
    ddp::rendezvous({.timeout = 2s, .env = lookup(e)});
    FAIL("no error");
  } catch (ddp::Error const& err) {
    std::string const what = err.what();
    CAPTURE(what);
    CHECK(what.find("cannot write in the directory '/proc/1'") != std::string::npos);
    CHECK(what.find("rank 0") == std::string::npos);
  }
}
