// ThreadsBackend: the conformance suite at world sizes 1-8 (both the staging and the sliced algorithm),
// plus failure propagation, timeouts, departures, tracing and the recording wrapper.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/recording.hpp"
#include "ddp/comm/threads.hpp"
#include "test/comm/conformance.hpp"

namespace {

using namespace std::chrono_literals;

// World sizes 1..8, each with the default 32 KiB staging threshold and with a tiny one, so both the
// single-barrier staging path and the sliced reduce-scatter/all-gather path see every count.
struct Threads {
  template <class F>
  static void run(F const& fn) {
    for (int n = 1; n <= 8; ++n) {
      for (std::size_t small : {std::size_t{32 * 1024}, std::size_t{64}}) {
        CAPTURE(n);
        CAPTURE(small);
        ddp::spawn(n, fn, ddp::ThreadsOptions{.timeout = {.after = 60s}, .small_bytes = small});
      }
    }
  }
};

using F32 = ddp::test::Case<Threads, float>;
using F64 = ddp::test::Case<Threads, double>;
using I32 = ddp::test::Case<Threads, std::int32_t>;
using I64 = ddp::test::Case<Threads, std::int64_t>;
using BF16 = ddp::test::Case<Threads, ddp::bfloat16>;
using F16 = ddp::test::Case<Threads, ddp::float16>;

}  // namespace

TYPE_TO_STRING(F32);
TYPE_TO_STRING(F64);
TYPE_TO_STRING(I32);
TYPE_TO_STRING(I64);
TYPE_TO_STRING(BF16);
TYPE_TO_STRING(F16);

namespace ddp::test {
TEST_CASE_TEMPLATE_INVOKE(all_reduce_suite, F32, F64, I32, I64, BF16, F16);
TEST_CASE_TEMPLATE_INVOKE(broadcast_suite, F32, F64, I32, I64, BF16, F16);
TEST_CASE_TEMPLATE_INVOKE(gather_suite, F32, F64, I32, I64, BF16, F16);
TEST_CASE_TEMPLATE_INVOKE(reduce_scatter_suite, F32, F64, I32, I64, BF16, F16);
TEST_CASE_TEMPLATE_INVOKE(async_suite, F32, F64, I32, I64, BF16, F16);
TEST_CASE_TEMPLATE_INVOKE(errors_suite, F32, F64, I32, I64, BF16, F16);
}  // namespace ddp::test

namespace {

bool contains(std::string const& s, std::string const& part) { return s.find(part) != std::string::npos; }

}  // namespace

static_assert(ddp::Communicator<ddp::ThreadsBackend>);
static_assert(ddp::AsyncCommunicator<ddp::ThreadsBackend>);
static_assert(ddp::HalfCommunicator<ddp::ThreadsBackend>);
static_assert(ddp::AsyncCommunicator<ddp::Recording<ddp::ThreadsBackend>>);
static_assert(!ddp::Communicator<int>);
static_assert(!ddp::detail::BufferLike<int>);
static_assert(ddp::detail::BufferLike<std::vector<float>&>);

TEST_CASE("barrier: no rank leaves before every rank arrived") {
  for (int n : {2, 3, 8}) {
    std::atomic<int> arrived{0};
    ddp::spawn(n, [&](ddp::ThreadsBackend& c) {
      for (int round = 1; round <= 20; ++round) {
        arrived.fetch_add(1);
        c.barrier();
        CHECK(arrived.load() >= round * n);
        c.barrier();
      }
    });
  }
}

TEST_CASE("a rank that throws mid-run fails every other rank's collectives, naming it, and spawn rethrows") {
  for (int n : {2, 4, 8}) {
    CAPTURE(n);
    std::vector<std::string> seen(static_cast<std::size_t>(n));
    auto const start = std::chrono::steady_clock::now();
    try {
      ddp::spawn(
          n,
          [&](ddp::ThreadsBackend& c) {
            std::vector<float> v(100000, 1.0f);
            try {
              for (int step = 0;; ++step) {
                if (c.rank() == 1 && step == 3) throw std::runtime_error("loss is NaN");
                auto w = c.all_reduce_async(v, ddp::ReduceOp::kAvg, {"bucket", step});
                c.all_reduce(std::span(v).first(10), ddp::ReduceOp::kSum);  // pending + future collectives
                w.wait();
              }
            } catch (ddp::CommError const& e) {
              seen[static_cast<std::size_t>(c.rank())] = e.what();
              CHECK(e.rank() == 1);
              auto const peers = c.peer_failures();  // the first cause first, as data
              REQUIRE(!peers.empty());
              CHECK(
                  peers[0] ==
                  ddp::PeerStatus{.rank = 1, .state = ddp::PeerState::kFailed, .seen_by = 1, .reason = "loss is NaN"});
              throw;
            }
          },
          ddp::ThreadsOptions{.timeout = {.after = 60s}});
      FAIL("spawn returned normally");
    } catch (std::runtime_error const& e) {
      CHECK(std::string(e.what()) == "loss is NaN");  // the root cause, not a follow-up CommError
    }
    CHECK(std::chrono::steady_clock::now() - start < 10s);  // failure, not the 60 s timeout, ended it
    for (int r = 0; r < n; ++r) {
      if (r == 1) continue;
      CAPTURE(seen[static_cast<std::size_t>(r)]);
      CHECK(contains(seen[static_cast<std::size_t>(r)], "rank 1 failed: loss is NaN"));
      CHECK(contains(seen[static_cast<std::size_t>(r)], "on rank " + std::to_string(r)));
    }
  }
}

TEST_CASE("a collective that waits past the timeout names the operation and the missing ranks") {
  std::atomic<bool> release{false};
  try {
    ddp::spawn(
        3,
        [&](ddp::ThreadsBackend& c) {
          std::vector<double> v(10, 1.0);
          if (c.rank() == 2) {  // late: arrives only after the others gave up
            while (!release.load()) std::this_thread::sleep_for(1ms);
          }
          try {
            c.all_reduce(v, ddp::ReduceOp::kSum, {"bucket", 7});
          } catch (ddp::CommError const&) {
            if (c.rank() != 2) {  // the rank that timed out noted the absent one as stalled
              auto const peers = c.peer_failures();
              REQUIRE(!peers.empty());
              CHECK(peers[0].rank == 2);
              CHECK(peers[0].state == ddp::PeerState::kStalled);
              CHECK(peers[0].seq == 1);
              CHECK(peers[0].reason == "did not arrive within 0.2 s");
            }
            release.store(true);
            throw;
          }
        },
        ddp::ThreadsOptions{.timeout = {.after = 200ms}});
    FAIL("spawn returned normally");
  } catch (ddp::CommError const& e) {
    std::string const what = e.what();
    CAPTURE(what);
    CHECK(contains(what, "all_reduce #1 [bucket:7]"));
    CHECK(contains(what, "timed out after 0.2 s: rank 2 did not arrive"));
  }
}

TEST_CASE("the stall inspector warns once, naming the missing rank, before the collective times out") {
  std::mutex m;
  std::vector<std::string> warnings;
  std::atomic<bool> release{false};
  auto const start = std::chrono::steady_clock::now();
  try {
    ddp::spawn(
        2,
        [&](ddp::ThreadsBackend& c) {
          std::vector<float> v(4, 1.0f);
          c.all_reduce(v, ddp::ReduceOp::kSum);
          if (c.rank() == 1) {
            while (!release.load()) std::this_thread::sleep_for(1ms);
            return;
          }
          try {
            c.all_reduce(v, ddp::ReduceOp::kSum, {"bucket", 2});
          } catch (ddp::CommError const&) {
            release.store(true);
            throw;
          }
        },
        ddp::ThreadsOptions{.timeout = {.after = 400ms, .warn_fraction = 0.25, .on_stall = [&](std::string const& w) {
                                          std::lock_guard lock(m);
                                          warnings.push_back(w);
                                        }}});
    FAIL("spawn returned normally");
  } catch (ddp::CommError const& e) {
    CHECK(contains(e.what(), "all_reduce #2 [bucket:2] on rank 0 of 2 timed out after 0.4 s: rank 1 did not arrive"));
  }
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  REQUIRE(warnings.size() == 1);
  CAPTURE(warnings[0]);
  CHECK(contains(warnings[0],
                 "ddp threads: warning: all_reduce #2 [bucket:2] on rank 0 of 2 has waited 0.1 s for "
                 "rank 1; it fails at 0.4 s"));
}

TEST_CASE("the collective timeout comes from $DDP_TIMEOUT when the program does not set it") {
  struct EnvGuard {
    ~EnvGuard() { ::unsetenv("DDP_TIMEOUT"); }
  } guard;
  ::setenv("DDP_TIMEOUT", "0.3", 1);
  try {
    ddp::spawn(2, [](ddp::ThreadsBackend& c) {
      if (c.rank() == 1) {
        std::this_thread::sleep_for(1s);  // arrives after rank 0 gave up
      }
      std::vector<float> v(4);
      c.all_reduce(v, ddp::ReduceOp::kSum);
    });
    FAIL("spawn returned normally");
  } catch (ddp::CommError const& e) {
    CHECK(contains(e.what(), "timed out after 0.3 s"));
  }
  ::setenv("DDP_TIMEOUT", "ten", 1);
  CHECK_THROWS_WITH_AS(ddp::make_threads_group(2), doctest::Contains("DDP_TIMEOUT='ten' is not a timeout"),
                       ddp::ArgumentError);
  ::setenv("DDP_TIMEOUT", "-5", 1);
  CHECK_THROWS_AS(ddp::make_threads_group(2), ddp::ArgumentError);
  // An explicit option wins over the environment.
  ddp::spawn(
      2,
      [](ddp::ThreadsBackend& c) {
        std::vector<float> v(4, 1.0f);
        c.all_reduce(v, ddp::ReduceOp::kSum);
        CHECK(v[0] == 2.0f);
      },
      ddp::ThreadsOptions{.timeout = {.after = 60s}});
}

TEST_CASE("a rank that returns early fails its peers at once instead of at the timeout") {
  auto const start = std::chrono::steady_clock::now();
  try {
    ddp::spawn(
        2,
        [](ddp::ThreadsBackend& c) {
          if (c.rank() == 1) return;
          std::vector<float> v(4);
          try {
            c.all_reduce(v, ddp::ReduceOp::kSum);
          } catch (ddp::CommError const&) {
            CHECK(
                c.peer_failures() ==
                std::vector<ddp::PeerStatus>{
                    {.rank = 1, .state = ddp::PeerState::kLeft, .seen_by = 1, .reason = "its backend was destroyed"}});
            throw;
          }
        },
        ddp::ThreadsOptions{.timeout = {.after = 60s}});
    FAIL("spawn returned normally");
  } catch (ddp::CommError const& e) {
    CHECK(contains(e.what(), "ranks that will never arrive: 1 (left"));
  }
  CHECK(std::chrono::steady_clock::now() - start < 10s);
}

TEST_CASE("mismatched collectives are reported on every rank") {
  try {
    ddp::spawn(2, [](ddp::ThreadsBackend& c) {
      std::vector<float> v(c.rank() == 0 ? 10 : 11);
      c.all_reduce(v, ddp::ReduceOp::kSum);
    });
    FAIL("spawn returned normally");
  } catch (ddp::CommError const& e) {
    CHECK(contains(e.what(), "collective mismatch at collective #1"));
    CHECK(contains(e.what(), "all_reduce(count=10"));
    CHECK(contains(e.what(), "all_reduce(count=11"));
  }
}

TEST_CASE("collectives that differ only in their tag are a mismatch, showing both tags") {
  try {
    ddp::spawn(2, [](ddp::ThreadsBackend& c) {
      std::vector<float> v(8, 1.0f);
      c.all_reduce(v, ddp::ReduceOp::kSum, {"bucket", 0});
      c.all_reduce(v, ddp::ReduceOp::kSum, {"bucket", c.rank() == 0 ? 1 : 2});
    });
    FAIL("spawn returned normally");
  } catch (ddp::CommError const& e) {
    CAPTURE(e.what());
    CHECK(contains(e.what(), "collective mismatch at collective #2"));
    CHECK(contains(e.what(), "[bucket:1]"));
    CHECK(contains(e.what(), "[bucket:2]"));
  }
}

TEST_CASE("Recording sees one all-reduce per bucket, in the same order on every rank") {
  int const n = 3;
  std::vector<std::vector<ddp::CollectiveRecord>> logs(n);
  ddp::spawn(n, [&](ddp::ThreadsBackend& c) {
    ddp::Recording<ddp::ThreadsBackend> rec(c);
    std::vector<float> arena(1000, 1.0f);
    std::vector<ddp::Work> works;
    for (int b = 0; b < 4; ++b) {
      works.push_back(rec.all_reduce_async(std::span(arena).subspan(250 * b, 250), ddp::ReduceOp::kAvg, {"bucket", b}));
    }
    for (auto& w : works) w.wait();
    rec.barrier();
    logs[static_cast<std::size_t>(c.rank())] = rec.records();
  });
  REQUIRE(logs[0].size() == 5);
  for (int b = 0; b < 4; ++b) {
    auto const& rec = logs[0][static_cast<std::size_t>(b)];
    CHECK(rec.op == ddp::CollectiveKind::kAllReduce);
    CHECK(rec.count == 250);
    CHECK(rec.tag.id == b);
    CHECK(rec.async);
  }
  for (int r = 1; r < n; ++r) {
    REQUIRE(logs[static_cast<std::size_t>(r)].size() == logs[0].size());
    for (std::size_t i = 0; i < logs[0].size(); ++i) {
      auto a = logs[0][i];
      auto b = logs[static_cast<std::size_t>(r)][i];
      CHECK(b.rank == r);
      b.rank = 0;
      CHECK(ddp::to_string(a) == ddp::to_string(b));
    }
  }
}

TEST_CASE("DDP_TRACE_COLLECTIVES=1 prints one line per collective per rank") {
  CHECK_FALSE(ddp::TraceOptions{}.enabled);  // the test environment does not set it
  setenv("DDP_TRACE_COLLECTIVES", "1", 1);
  std::FILE* sink = std::tmpfile();
  REQUIRE(sink != nullptr);
  ddp::ThreadsOptions opts{};
  opts.trace.sink = sink;
  unsetenv("DDP_TRACE_COLLECTIVES");
  CHECK(opts.trace.enabled);
  ddp::spawn(
      2,
      [](ddp::ThreadsBackend& c) {
        std::vector<float> g(300);
        c.all_reduce_async(g, ddp::ReduceOp::kAvg, {"bucket", 3}).wait();
        std::vector<std::int64_t> b(5);
        c.broadcast(b, 0);
      },
      opts);
  std::rewind(sink);
  std::vector<std::string> lines;
  char line[512];
  while (std::fgets(line, sizeof line, sink)) lines.emplace_back(line);
  std::fclose(sink);
  REQUIRE(lines.size() == 4);
  int bucket_lines = 0;
  for (auto const& l : lines) {
    if (contains(l, "op=all_reduce count=300 dtype=float32 reduce=avg tag=bucket:3 async=1 bytes=1200")) ++bucket_lines;
  }
  CHECK(bucket_lines == 2);
  CHECK(contains(lines[0] + lines[1] + lines[2] + lines[3], "op=broadcast count=5 dtype=int64 root=0 tag=-"));
  CHECK(contains(lines[0] + lines[1] + lines[2] + lines[3], "ddp-trace rank=1 "));
}

TEST_CASE("kAvg on the sliced path equals sum times 1/world, bitwise, on every rank") {
  std::size_t const count = 5000;
  std::vector<std::vector<float>> in(3), out(3);
  for (int r = 0; r < 3; ++r) {
    for (std::size_t i = 0; i < count; ++i) in[r].push_back(0.1f * static_cast<float>(i + r));
  }
  ddp::spawn(
      3,
      [&](ddp::ThreadsBackend& c) {
        std::vector<float> v = in[static_cast<std::size_t>(c.rank())];
        c.all_reduce(v, ddp::ReduceOp::kAvg);
        out[static_cast<std::size_t>(c.rank())] = v;
      },
      ddp::ThreadsOptions{.small_bytes = 64});
  CHECK(out[0] == out[1]);
  CHECK(out[0] == out[2]);
  float const inv = 1.0f / 3.0f;
  for (std::size_t i = 0; i < count; ++i) {
    float sum = in[0][i];
    sum += in[1][i];
    sum += in[2][i];
    float const want = sum * inv;
    if (out[0][i] != want) {
      FAIL_CHECK("index " << i << ": " << out[0][i] << " != " << want);
      break;
    }
  }
}
