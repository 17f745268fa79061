// StoreWatch (include/ddp/comm/rendezvous/store_watch.hpp): the deadline of one host wait, and who is to blame,
// learned through the rendezvous store as NcclBackend does when launched without MPI. The collective itself is
// a flag here (done() returns it), so every case runs without a GPU: a wait that completes, a rank that never
// arrives, ranks in different collectives at one position, a peer that left (and one that left just after its
// part was done), a failure that reaches the other ranks, and a store that is gone. Ranks are threads sharing a
// LocalStore, and once a TcpStore, the store torchrun's agent serves.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/rendezvous/rendezvous.hpp"
#include "ddp/comm/rendezvous/store_watch.hpp"
#include "ddp/comm/rendezvous/tcp_store.hpp"
#include "ddp/comm/rendezvous/tcp_store_server.hpp"

namespace {

using namespace std::chrono_literals;
using ddp::detail::CallRecord;
using ddp::detail::StoreWatch;

ddp::detail::Deadlines deadlines(std::chrono::milliseconds timeout, std::vector<std::string>* warnings = nullptr,
                                 double warn_fraction = 0.5) {
  return ddp::detail::resolve(ddp::TimeoutOptions{.after = timeout,
                                                  .warn_fraction = warn_fraction,
                                                  .on_stall =
                                                      [warnings](std::string const& m) {
                                                        if (warnings) warnings->push_back(m);
                                                      }},
                              "nccl");
}

CallRecord call(std::uint64_t seq, ddp::CollectiveKind kind = ddp::CollectiveKind::kAllReduce,
                std::size_t count = 1024) {
  return CallRecord::make(seq, kind, count, ddp::Dtype::kFloat32, ddp::ReduceOp::kSum, -1,
                          ddp::CollectiveTag{"bucket", 3});
}

bool contains(std::string const& s, std::string const& part) { return s.find(part) != std::string::npos; }

// What one rank's wait ended in: "" when it completed, else the CommError's text; and how long it took.
struct Outcome {
  std::string error;
  int blamed = -2;
  std::chrono::milliseconds took{};
};

template <class Done>
Outcome wait(StoreWatch& w, CallRecord const& c, Done done) {
  Outcome o;
  auto const t0 = std::chrono::steady_clock::now();
  try {
    w.wait_until(done, c);
  } catch (ddp::CommError const& e) {
    o.error = e.what();
    o.blamed = e.rank();
  }
  o.took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  return o;
}

// A store whose every call fails, as one whose host has ended.
class GoneStore final : public ddp::Store {
 public:
  void set(std::string const&, std::vector<char> const&) override { fail(); }
  std::vector<char> get(std::string const&, std::chrono::milliseconds) override { fail(); }
  std::int64_t add(std::string const&, std::int64_t) override { fail(); }
  bool check(std::vector<std::string> const&) override { fail(); }
  std::string describe() const override { return "TCP store 10.0.0.1:29500"; }

 private:
  [[noreturn]] static void fail() { throw ddp::CommError("TCP store 10.0.0.1:29500: connection reset by peer"); }
};

}  // namespace

TEST_CASE("a wait that completes touches the store only once it outlasts a moment, and raises nothing") {
  auto store = std::make_shared<ddp::LocalStore>();
  std::vector<std::string> warnings;
  StoreWatch w0(store, 0, 2, deadlines(5s, &warnings), "nccl", "w/"), w1(store, 1, 2, deadlines(5s), "nccl", "w/");
  std::atomic<bool> landed{false};
  Outcome o0, o1;
  std::thread t0([&] { o0 = wait(w0, call(1), [&] { return landed.load(); }); });
  std::thread t1([&] { o1 = wait(w1, call(1), [&] { return landed.load(); }); });
  std::this_thread::sleep_for(300ms);
  landed = true;
  t0.join();
  t1.join();
  CHECK(o0.error.empty());
  CHECK(o1.error.empty());
  CHECK(warnings.empty());
  CHECK(store->check({"w/at/0", "w/at/1"}));  // both waited 300 ms: both posted where they were

  // A wait that completes at once posts nothing.
  auto quiet = std::make_shared<ddp::LocalStore>();
  StoreWatch q(quiet, 0, 2, deadlines(5s), "nccl", "w/");
  CHECK(wait(q, call(1), [] { return true; }).error.empty());
  CHECK_FALSE(quiet->check({"w/at/0"}));
}

TEST_CASE("a rank that never arrives: the others warn at the stall point and fail at the deadline, naming it") {
  auto store = std::make_shared<ddp::LocalStore>();
  int const n = 3;
  std::vector<std::vector<std::string>> warnings(n);
  std::vector<std::unique_ptr<StoreWatch>> w;
  for (int r = 0; r < n; ++r)
    w.push_back(std::make_unique<StoreWatch>(store, r, n, deadlines(800ms, &warnings[r]), "nccl", "w/"));
  std::vector<Outcome> out(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)  // rank 2 never issues the collective
    ranks.emplace_back([&, r] { out[r] = wait(*w[r], call(7), [] { return false; }); });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    CAPTURE(out[r].error);
    CHECK(contains(out[r].error, "all_reduce #7 (count=1024, float32, sum) [bucket:3] on rank " + std::to_string(r) +
                                     " of 3 timed out after 0.8 s: rank 2 did not arrive (it posted no wait"));
    CHECK(out[r].blamed == 2);
    CHECK(out[r].took < 800ms + 2s);
    REQUIRE(warnings[r].size() == 1);
    CHECK(contains(warnings[r][0], "ddp nccl: warning: all_reduce #7"));
    CHECK(contains(warnings[r][0], "rank 2 has not arrived"));
  }
}

TEST_CASE("ranks in different collectives at one position fail at the stall point, showing both sides") {
  auto store = std::make_shared<ddp::LocalStore>();
  StoreWatch w0(store, 0, 2, deadlines(1500ms), "nccl", "w/"), w1(store, 1, 2, deadlines(1500ms), "nccl", "w/");
  Outcome o0, o1;
  std::thread t0([&] { o0 = wait(w0, call(4), [] { return false; }); });
  std::thread t1([&] { o1 = wait(w1, call(4, ddp::CollectiveKind::kBroadcast, 1024), [] { return false; }); });
  t0.join();
  t1.join();
  for (auto const* o : {&o0, &o1}) {
    CAPTURE(o->error);
    CHECK(contains(o->error, "stalled: the ranks' collective sequences diverged"));
    CHECK(contains(o->error, "is in all_reduce #4"));
    CHECK(contains(o->error, "is in broadcast #4"));
    CHECK(o->took < 1500ms);  // at the warning, not the deadline
  }
  CHECK(o0.blamed == 1);
  CHECK(o1.blamed == 0);
}

TEST_CASE("a peer that left fails the wait at once, with the peer's reason; one that left after its part did not") {
  SUBCASE("left for good") {
    auto store = std::make_shared<ddp::LocalStore>();
    StoreWatch w0(store, 0, 2, deadlines(60s), "nccl", "w/"), w1(store, 1, 2, deadlines(60s), "nccl", "w/");
    Outcome o0;
    std::thread t0([&] { o0 = wait(w0, call(2), [] { return false; }); });
    std::this_thread::sleep_for(200ms);
    w1.leave("its backend was destroyed");
    t0.join();
    CAPTURE(o0.error);
    CHECK(contains(o0.error,
                   "ddp nccl: all_reduce #2 (count=1024, float32, sum) [bucket:3] on rank 0 of 2 failed: "
                   "rank 1 left (its backend was destroyed)"));
    CHECK(o0.blamed == 1);
    CHECK(o0.took < 5s);  // the poll and a grace of at most 1 s, not the 60 s deadline
  }
  SUBCASE("left as the collective completed") {
    auto store = std::make_shared<ddp::LocalStore>();
    StoreWatch w0(store, 0, 2, deadlines(60s), "nccl", "w/"), w1(store, 1, 2, deadlines(60s), "nccl", "w/");
    std::atomic<bool> landed{false};
    Outcome o0;
    std::thread t0([&] { o0 = wait(w0, call(2), [&] { return landed.load(); }); });
    std::this_thread::sleep_for(200ms);
    w1.leave("its backend was destroyed");
    std::this_thread::sleep_for(150ms);  // within the grace: the last chunk was still on its way
    landed = true;
    t0.join();
    CHECK(o0.error.empty());
  }
}

TEST_CASE("the first rank to fail tells the others why, so they fail naming it before their own deadline") {
  auto store = std::make_shared<ddp::LocalStore>();
  StoreWatch w0(store, 0, 3, deadlines(600ms), "nccl", "w/"), w1(store, 1, 3, deadlines(60s), "nccl", "w/");
  Outcome o0, o1;
  std::thread t0([&] { o0 = wait(w0, call(9), [] { return false; }); });
  std::thread t1([&] { o1 = wait(w1, call(9), [] { return false; }); });
  t0.join();
  t1.join();
  CAPTURE(o0.error);
  CAPTURE(o1.error);
  CHECK(contains(o0.error, "timed out after 0.6 s: rank 2 did not arrive"));
  CHECK(contains(o1.error, "on rank 1 of 3 failed: rank 0 left (it failed: ddp nccl: all_reduce #9"));
  CHECK(contains(o1.error, "rank 2 did not arrive"));  // the root cause, through rank 0's reason
  CHECK(o1.took < 10s);
}

TEST_CASE("a peer ahead of this collective has arrived; one last seen in an earlier one has not") {
  auto store = std::make_shared<ddp::LocalStore>();
  StoreWatch w0(store, 0, 3, deadlines(700ms), "nccl", "w/"), w1(store, 1, 3, deadlines(60s), "nccl", "w/"),
      w2(store, 2, 3, deadlines(60s), "nccl", "w/");
  // Rank 2 waited in collective #1 earlier (its post stays); rank 1 has queued #3 and waits in #5.
  auto const until = std::chrono::steady_clock::now() + 150ms;
  CHECK(wait(w2, call(1), [&] { return std::chrono::steady_clock::now() >= until; }).error.empty());
  std::atomic<bool> stop{false};
  std::thread t1([&] { wait(w1, call(5), [&] { return stop.load(); }); });
  std::this_thread::sleep_for(100ms);
  Outcome const o0 = wait(w0, call(3), [] { return false; });
  stop = true;
  t1.join();
  CAPTURE(o0.error);
  CHECK(contains(o0.error, "rank 2 did not arrive"));
  CHECK(contains(o0.error, "(elsewhere: rank 1 is in all_reduce #5"));
  CHECK(o0.blamed == 2);
}

TEST_CASE("a store that is gone leaves the deadline, and the message says the peers could not be asked") {
  std::vector<std::string> warnings;
  StoreWatch w(std::make_shared<GoneStore>(), 0, 2, deadlines(400ms, &warnings), "nccl", "w/");
  Outcome const o = wait(w, call(1), [] { return false; });
  CAPTURE(o.error);
  CHECK(contains(o.error,
                 "timed out after 0.4 s: rank 1 did not arrive (the peers could not be asked: the store "
                 "failed: TCP store 10.0.0.1:29500: connection reset by peer)"));
  CHECK(o.took < 3s);
  CHECK(warnings.size() == 1);
  w.leave("its backend was destroyed");  // never throws, even with the store gone
}

TEST_CASE("over PyTorch's TCP store: a peer's departure and a timeout, as under torchrun") {
  ddp::TcpStoreServer server({.host = "127.0.0.1"});
  auto client = [&] {
    return std::make_shared<ddp::TcpStore>(ddp::TcpStore::Options{.port = server.port(), .timeout = 10s});
  };
  StoreWatch w0(client(), 0, 2, deadlines(30s), "nccl", "nccl/0/watch/"),
      w1(client(), 1, 2, deadlines(30s), "nccl", "nccl/0/watch/");
  Outcome o0;
  std::thread t0([&] { o0 = wait(w0, call(11), [] { return false; }); });
  std::this_thread::sleep_for(300ms);
  w1.leave("its communicator was aborted after a failed collective");
  t0.join();
  CAPTURE(o0.error);
  CHECK(contains(o0.error, "rank 1 left (its communicator was aborted after a failed collective)"));
  CHECK(o0.took < 5s);
}

TEST_CASE("share_from_root: rank 0's bytes reach every rank; a root that never sets them is named") {
  auto store = std::make_shared<ddp::LocalStore>();
  std::vector<std::vector<char>> got(4);
  std::vector<std::thread> ranks;
  int made = 0;
  for (int r = 0; r < 4; ++r)
    ranks.emplace_back([&, r] {
      got[r] = ddp::share_from_root(*store, "nccl/0/unique_id", r, 0, 5s, [&] {
        ++made;
        return std::vector<char>{'i', 'd', '\0', '7'};
      });
    });
  for (auto& t : ranks) t.join();
  CHECK(made == 1);
  for (auto const& g : got) CHECK(g == std::vector<char>{'i', 'd', '\0', '7'});

  try {
    ddp::share_from_root(*store, "nccl/1/unique_id", 2, 0, 200ms, [] { return std::vector<char>{}; });
    FAIL("no error");
  } catch (ddp::CommError const& e) {
    std::string const what = e.what();
    CAPTURE(what);
    CHECK(contains(what, "rank 2 waited 0.2 s for 'nccl/1/unique_id' from rank 0 through in-process store"));
    CHECK(contains(what, "rank 0 failed before it set it"));
    CHECK(e.rank() == 0);
  }
}

TEST_CASE("share_from_root: a root that left is named at once, with its reason") {
  auto store = std::make_shared<ddp::LocalStore>();
  std::thread root([&] {
    std::this_thread::sleep_for(200ms);
    StoreWatch w(store, 0, 2, deadlines(60s), "nccl", "nccl/0/watch/");
    w.leave("its backend failed to start: ncclGetUniqueId failed");
  });
  auto const t0 = std::chrono::steady_clock::now();
  try {
    ddp::share_from_root(
        *store, "nccl/0/unique_id", 1, 0, 60s, [] { return std::vector<char>{}; }, "nccl/0/watch/left/0");
    FAIL("no error");
  } catch (ddp::CommError const& e) {
    std::string const what = e.what();
    CAPTURE(what);
    CHECK(contains(what,
                   "for 'nccl/0/unique_id' from rank 0 through in-process store: rank 0 is gone: it left: its "
                   "backend failed to start: ncclGetUniqueId failed"));
    CHECK(e.rank() == 0);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  root.join();
}

namespace {
// A store on which rank 0 posts why it left, then ends, between a waiter's look for the reason and its look at the
// process: the order a failing rank takes (StoreWatch::leave, then exit), at the worst moment for the waiter.
class LeavesThenEnds final : public ddp::Store {
 public:
  void set(std::string const& key, std::vector<char> const& value) override { base_.set(key, value); }
  std::vector<char> get(std::string const& key, std::chrono::milliseconds timeout) override {
    return base_.get(key, timeout);
  }
  std::int64_t add(std::string const& key, std::int64_t delta) override { return base_.add(key, delta); }
  bool check(std::vector<std::string> const& keys) override { return base_.check(keys); }
  std::string describe() const override { return base_.describe(); }
  bool rank_gone(int rank) override {
    if (rank != 0) return false;
    if (!ended_) {
      std::string const why = "its backend failed to start: cudaGetDeviceCount failed";
      base_.set("nccl/0/watch/left/0", std::vector<char>(why.begin(), why.end()));
      ended_ = true;
    }
    return true;
  }

 private:
  ddp::LocalStore base_;
  bool ended_ = false;
};
}  // namespace

TEST_CASE("share_from_root: a root that posts its reason and ends between the waiter's looks is quoted, not 'ended'") {
  LeavesThenEnds store;
  try {
    ddp::share_from_root(
        store, "nccl/0/unique_id", 1, 0, 60s, [] { return std::vector<char>{}; }, "nccl/0/watch/left/0");
    FAIL("no error");
  } catch (ddp::CommError const& e) {
    std::string const what = e.what();
    CAPTURE(what);
    CHECK(contains(what, "rank 0 is gone: it left: its backend failed to start: cudaGetDeviceCount failed"));
    CHECK_FALSE(contains(what, "its process ended"));
    CHECK(e.rank() == 0);
  }
}

namespace {
// Rank 0 as a child process that does `setup` (which returns a line for the parent: a port, "ready"), then sleeps
// until killed; the parent reads the line.
template <class Setup>
std::pair<pid_t, std::string> child_rank0(Setup&& setup) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  pid_t const pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    auto held = setup();  // kept until the process is killed
    std::string const line = held.second + "\n";
    [[maybe_unused]] auto k = ::write(fds[1], line.data(), line.size());
    for (;;) ::pause();
  }
  ::close(fds[1]);
  std::string line;
  char c;
  while (::read(fds[0], &c, 1) == 1 && c != '\n') line += c;
  ::close(fds[0]);
  return {pid, line};
}

// Rank 1 waits in share_from_root for a rank 0 that is killed 300 ms in; returns the error and how long it took.
std::pair<std::string, std::chrono::milliseconds> wait_for_killed_root(ddp::Store& store, pid_t root) {
  std::thread killer([root] {
    std::this_thread::sleep_for(300ms);
    ::kill(root, SIGKILL);
    ::waitpid(root, nullptr, 0);
  });
  auto const t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    ddp::share_from_root(
        store, "nccl/0/unique_id", 1, 0, 60s, [] { return std::vector<char>{}; }, "nccl/0/watch/left/0");
  } catch (ddp::CommError const& e) {
    error = e.what();
  }
  killer.join();
  return {error, std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)};
}
}  // namespace

TEST_CASE("share_from_root: a killed rank 0 is named by its peers within 5 s (file store; TCP store it served)") {
  SUBCASE("a file store sees its process end") {
    auto const dir = std::filesystem::temp_directory_path() / ("ddp_share_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    auto [pid, line] = child_rank0([&] {
      auto s = std::make_shared<ddp::FileStore>(dir.string());
      s->hold_rank(0);
      return std::pair{s, std::string("ready")};
    });
    REQUIRE(line == "ready");
    ddp::FileStore store(dir.string());
    store.hold_rank(1);
    auto const [error, took] = wait_for_killed_root(store, pid);
    CAPTURE(error);
    CHECK(contains(error, "rank 1 waited"));
    CHECK(contains(error, "rank 0 is gone: its process ended (killed, or crashed) before it set it"));
    CHECK(took < 5s);
    std::filesystem::remove_all(dir);
  }
  SUBCASE("the TCP store rank 0 served ends with it") {
    auto [pid, line] = child_rank0([] {
      auto server = std::make_shared<ddp::TcpStoreServer>(ddp::TcpStoreServer::Options{.host = "127.0.0.1"});
      return std::pair{server, std::to_string(server->port())};
    });
    ddp::TcpStore store({.port = std::stoi(line), .timeout = 60s});
    auto const [error, took] = wait_for_killed_root(store, pid);
    CAPTURE(error);
    CHECK(contains(error, "rank 1 lost TCP store 127.0.0.1:"));
    CHECK(contains(error, "waiting for 'nccl/0/unique_id' from rank 0"));
    CHECK(contains(error, "if rank 0 serves the store (MASTER_ADDR/MASTER_PORT without torchrun), it ended"));
    CHECK(took < 5s);
  }
}

TEST_CASE("StoreWatch: a long wait sleeps between polls: it does not spin a core") {
  auto store = std::make_shared<ddp::LocalStore>();
  StoreWatch w(store, 0, 2, deadlines(60s), "nccl", "nccl/0/watch/");
  std::atomic<bool> flag{false};
  std::thread peer([&] {
    std::this_thread::sleep_for(1s);
    flag = true;
  });
  timespec cpu0{}, cpu1{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);
  auto const o = wait(w, call(1), [&] { return flag.load(); });
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu1);
  peer.join();
  double const cpu = double(cpu1.tv_sec - cpu0.tv_sec) + 1e-9 * double(cpu1.tv_nsec - cpu0.tv_nsec);
  CAPTURE(cpu);
  CHECK(o.error == "");
  CHECK(o.took >= 1s);
  CHECK(o.took < 1500ms);  // the sleeps add at most a millisecond at the end
  CHECK(cpu < 0.25);       // a spinning wait would burn the whole second
}
