// GlooBackend in one process: ranks are threads sharing a LocalStore, each with its own Gloo context over
// loopback TCP. The conformance suite at world sizes 1, 2 and 4, then failures: a peer that leaves, a rank
// that stalls past the timeout, a peer that broke at another collective
// (not blamed). (Ranks as processes: gloo_conformance_main.cpp under ddprun and torchrun.)
#include <doctest/doctest.h>

#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/gloo.hpp"
#include "test/comm/conformance.hpp"

namespace {

using namespace std::chrono_literals;

// Runs fn(comm) on n threads, each rank with its own GlooBackend; rethrows the first rank's exception.
template <class F>
void gloo_spawn(int n, F const& fn, ddp::GlooOptions const& opts = {.timeout = {.after = 60s}}) {
  auto store = std::make_shared<ddp::LocalStore>();
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ddp::GlooBackend comm(store, r, n, opts);
        fn(comm);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

struct GlooThreads {
  template <class F>
  static void run(F const& fn) {
    for (int n : {1, 2, 4}) {
      CAPTURE(n);
      gloo_spawn(n, fn);  // the suite's CHECKs run on every rank's thread, as on ThreadsBackend
    }
  }
};

}  // namespace

DDP_CONFORMANCE_SUITE(GlooThreads);

static_assert(ddp::HalfCommunicator<ddp::GlooBackend>);

TEST_CASE("a peer that leaves fails the others' collective with a CommError naming it, at once") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    std::vector<std::string> messages(static_cast<std::size_t>(n));
    auto const start = std::chrono::steady_clock::now();
    gloo_spawn(n,
               [&](ddp::GlooBackend& comm) {
                 std::vector<float> v(1000, 1.0f);
                 comm.all_reduce(v, ddp::ReduceOp::kSum);
                 if (comm.rank() == n - 1) return;  // leaves: its backend closes every connection
                 try {
                   comm.all_reduce(v, ddp::ReduceOp::kSum, ddp::CollectiveTag{"bucket", 7});
                   messages[static_cast<std::size_t>(comm.rank())] = "no error";
                 } catch (ddp::CommError const& e) {
                   messages[static_cast<std::size_t>(comm.rank())] = e.what();
                   // The same cause as data, on every rank: the rank that left, in its own words.
                   CHECK(comm.peer_failures() == std::vector<ddp::PeerStatus>{{.rank = n - 1,
                                                                               .state = ddp::PeerState::kLeft,
                                                                               .seen_by = n - 1,
                                                                               .seq = 2,
                                                                               .reason = "its backend was destroyed"}});
                 }
                 // Broken from now on, with a message that says so.
                 CHECK_THROWS_WITH_AS(comm.barrier(), doctest::Contains("an earlier collective"), ddp::CommError);
               },
               {.timeout = {.after = 20s}});
    CHECK(std::chrono::steady_clock::now() - start < 15s);
    for (int r = 0; r + 1 < n; ++r) {
      auto const& m = messages[static_cast<std::size_t>(r)];
      CAPTURE(m);
      CHECK(m.find("all_reduce #2 [bucket:7] on rank " + std::to_string(r)) != std::string::npos);
      CHECK(m.find("rank " + std::to_string(n - 1) + " left (its backend was destroyed") != std::string::npos);
    }
    // One cause per collective: every rank reports the same one (the first rank to claim it, "seen by rank R").
    auto cause = [](std::string const& m) {
      return m.substr(m.find(" failed: "), m.find(" (Gloo: ") - m.find(" failed: "));
    };
    for (int r = 1; r + 1 < n; ++r) CHECK(cause(messages[static_cast<std::size_t>(r)]) == cause(messages[0]));
  }
}

TEST_CASE("a rank that stalls past the timeout is warned about at half of it, then fails its peers naming it") {
  std::vector<std::string> messages(2);
  std::mutex m;
  std::vector<std::string> warnings;
  auto const start = std::chrono::steady_clock::now();
  gloo_spawn(2,
             [&](ddp::GlooBackend& comm) {
               std::vector<double> v(10, 1.0);
               if (comm.rank() == 1) {
                 std::this_thread::sleep_for(3s);  // stalls, then leaves without joining
                 return;
               }
               try {
                 comm.all_reduce(v, ddp::ReduceOp::kSum);
               } catch (ddp::CommError const& e) {
                 messages[0] = e.what();
                 auto const peers = comm.peer_failures();
                 REQUIRE(peers.size() == 1);
                 CHECK(peers[0] == ddp::PeerStatus{.rank = 1,
                                                   .state = ddp::PeerState::kStalled,
                                                   .seen_by = 0,
                                                   .seq = 1,
                                                   .reason = "not in this collective within the timeout of 1 s"});
               }
             },
             {.timeout = {.after = 1s, .on_stall = [&](std::string const& w) {
                            std::lock_guard lock(m);
                            warnings.push_back(w);
                          }}});
  CAPTURE(messages[0]);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0] ==
        "ddp gloo: warning: all_reduce #1 (count=10, float64, sum) on rank 0 of 2 has waited 0.5 s for its peers; it "
        "fails at 1 s "
        "(the collective timeout)");
  CHECK(messages[0].find("all_reduce #1 on rank 0 of 2 failed") != std::string::npos);
  CHECK(messages[0].find("rank 1 was not in this collective within the timeout of 1 s") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
}

TEST_CASE("layout names the transport and the store") {
  gloo_spawn(2, [](ddp::GlooBackend& comm) {
    CHECK(comm.layout() == "Gloo TCP over 2 ranks from 127.0.0.1, rendezvous at in-process store");
  });
}

TEST_CASE("a peer that broke at another collective (broken_key) is not judged silent, nor counted lost") {
  // Rank 1 says it is handling a failure of its own (as it would after breaking a collective behind rank 0's) and
  // stays out of rank 0's collective: rank 0 times out, but does not call rank 1 stalled or ended (an elastic regroup
  // would then leave a live rank out): no peer is blamed, and its roll call does not wait out the grace.
  std::string message;
  std::vector<ddp::PeerStatus> peers{{.rank = -1}};
  gloo_spawn(2,
             [&](ddp::GlooBackend& comm) {
               std::vector<double> v(10, 1.0);
               if (comm.rank() == 1) {
                 comm.store().set(ddp::detail::broken_key(1), {'1'});
                 std::this_thread::sleep_for(3s);
                 return;
               }
               try {
                 comm.all_reduce(v, ddp::ReduceOp::kSum);
               } catch (ddp::CommError const& e) {
                 message = e.what();
                 peers = comm.peer_failures();
               }
             },
             {.timeout = {.after = 1s}});
  CAPTURE(message);
  CHECK(message.find("all_reduce #1 on rank 0 of 2 failed: a peer ended, stalled past the timeout") !=
        std::string::npos);
  CHECK(message.find("rank 1 was not in this collective") == std::string::npos);
  CHECK(peers.empty());
}
