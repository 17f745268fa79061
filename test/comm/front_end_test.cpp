// CollectiveFrontEnd (ddp/comm/detail/front_end.hpp) with the smallest backend a user can write: one rank,
// host memory, a transport and nothing else (no enter() hook, as NcclBackend). Every blocking collective must
// reach the transport exactly once; the conformance suite runs on it. Before the fix, the front end's own
// enter() satisfied its `requires { b.enter(...) }` probe in a backend without a hook and recursed forever:
// NcclBackend's blocking collectives spun at 100% CPU on the first GPU machine (2026-11-24), while no
// CPU test could see it, since ThreadsBackend and MpiBackend both have a hook.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

#include "ddp/comm/detail/front_end.hpp"
#include "test/comm/conformance.hpp"

namespace {

using ddp::CollectiveKind;
using ddp::CollectiveTag;
using ddp::HostSpace;
using ddp::ReduceOp;
using ddp::SpaceSpan;

// Finished at once: the loopback transport is synchronous.
struct DoneWork {
  void wait() const noexcept {}
  bool test() const noexcept { return true; }
};

// World size 1: every collective is a copy (or nothing). Counts the transports it ran.
class Loopback : public ddp::detail::CollectiveFrontEnd<Loopback> {
 public:
  using accepted_spaces = ddp::SpaceList<HostSpace>;
  static constexpr std::string_view backend_name = "loopback";

  Loopback() : CollectiveFrontEnd(ddp::TraceOptions{}) {}
  int rank() const { return 0; }
  int world_size() const { return 1; }
  int transports = 0;

 private:
  friend class ddp::detail::CollectiveFrontEnd<Loopback>;
  template <class S>
  static constexpr void check_space() {}

  template <class T>
  void run_all_reduce(SpaceSpan<T, HostSpace>, ReduceOp, CollectiveTag) {
    ++transports;
  }
  template <class T>
  DoneWork run_all_reduce_async(SpaceSpan<T, HostSpace> buf, ReduceOp op, CollectiveTag tag) {
    run_all_reduce(buf, op, tag);
    return {};
  }
  template <class T>
  void run_broadcast(SpaceSpan<T, HostSpace>, int, CollectiveTag) {
    ++transports;
  }
  template <class T>
  void copy(SpaceSpan<T const, HostSpace> in, SpaceSpan<T, HostSpace> out) {
    ++transports;
    if (in.data() != out.data()) std::copy(in.data(), in.data() + in.size(), out.data());
  }
  template <class T>
  void run_all_gather(SpaceSpan<T const, HostSpace> in, SpaceSpan<T, HostSpace> out, CollectiveTag) {
    copy(in, out);
  }
  template <class T>
  void run_reduce_scatter(SpaceSpan<T const, HostSpace> in, SpaceSpan<T, HostSpace> out, ReduceOp, CollectiveTag) {
    copy(in, out);
  }
  template <class T>
  void run_gather(SpaceSpan<T const, HostSpace> in, SpaceSpan<T, HostSpace> out, int, CollectiveTag) {
    copy(in, out);
  }
  template <class T>
  void run_scatter(SpaceSpan<T const, HostSpace> in, SpaceSpan<T, HostSpace> out, int, CollectiveTag) {
    copy(in, out);
  }
  void run_barrier(CollectiveTag) { ++transports; }
};
static_assert(ddp::Communicator<Loopback>);
static_assert(ddp::AsyncCommunicator<Loopback>);

// The same with an enter() hook: it runs once before each blocking transport, after the argument checks.
class Hooked : public ddp::detail::CollectiveFrontEnd<Hooked> {
 public:
  using accepted_spaces = ddp::SpaceList<HostSpace>;
  static constexpr std::string_view backend_name = "hooked";
  Hooked() : CollectiveFrontEnd(ddp::TraceOptions{}) {}
  int rank() const { return 0; }
  int world_size() const { return 1; }
  std::vector<CollectiveKind> entered;
  int transports = 0;

 private:
  friend class ddp::detail::CollectiveFrontEnd<Hooked>;
  template <class S>
  static constexpr void check_space() {}
  void enter(CollectiveKind kind, CollectiveTag) { entered.push_back(kind); }
  template <class T>
  void run_all_reduce(SpaceSpan<T, HostSpace>, ReduceOp, CollectiveTag) {
    CHECK(entered.size() == static_cast<std::size_t>(transports + 1));
    ++transports;
  }
  template <class T>
  void run_broadcast(SpaceSpan<T, HostSpace>, int, CollectiveTag) {
    ++transports;
  }
  template <class T>
  void run_all_gather(SpaceSpan<T const, HostSpace>, SpaceSpan<T, HostSpace>, CollectiveTag) {
    ++transports;
  }
  template <class T>
  void run_reduce_scatter(SpaceSpan<T const, HostSpace>, SpaceSpan<T, HostSpace>, ReduceOp, CollectiveTag) {
    ++transports;
  }
  template <class T>
  void run_gather(SpaceSpan<T const, HostSpace>, SpaceSpan<T, HostSpace>, int, CollectiveTag) {
    ++transports;
  }
  template <class T>
  void run_scatter(SpaceSpan<T const, HostSpace>, SpaceSpan<T, HostSpace>, int, CollectiveTag) {
    ++transports;
  }
  void run_barrier(CollectiveTag) { ++transports; }
};

struct OneRank {
  template <class F>
  static void run(F const& fn) {
    Loopback comm;
    fn(comm);
  }
};

using OneRankF32 = ddp::test::Case<OneRank, float>;
using OneRankF64 = ddp::test::Case<OneRank, double>;
using OneRankI32 = ddp::test::Case<OneRank, std::int32_t>;
using OneRankI64 = ddp::test::Case<OneRank, std::int64_t>;

}  // namespace

TYPE_TO_STRING(OneRankF32);
TYPE_TO_STRING(OneRankF64);
TYPE_TO_STRING(OneRankI32);
TYPE_TO_STRING(OneRankI64);

namespace ddp::test {
TEST_CASE_TEMPLATE_INVOKE(all_reduce_suite, OneRankF32, OneRankF64, OneRankI32, OneRankI64);
TEST_CASE_TEMPLATE_INVOKE(broadcast_suite, OneRankF32, OneRankF64, OneRankI32, OneRankI64);
TEST_CASE_TEMPLATE_INVOKE(gather_suite, OneRankF32, OneRankF64, OneRankI32, OneRankI64);
TEST_CASE_TEMPLATE_INVOKE(reduce_scatter_suite, OneRankF32, OneRankF64, OneRankI32, OneRankI64);
TEST_CASE_TEMPLATE_INVOKE(async_suite, OneRankF32, OneRankF64, OneRankI32, OneRankI64);
TEST_CASE_TEMPLATE_INVOKE(errors_suite, OneRankF32, OneRankF64, OneRankI32, OneRankI64);
}  // namespace ddp::test

TEST_CASE("a backend without an enter() hook: each blocking collective reaches its transport once") {
  Loopback comm;
  std::vector<float> a(6, 1.0f), b(6, 0.0f);
  ddp::HostSpan<float> sa(a.data(), a.size()), sb(b.data(), b.size());
  ddp::HostSpan<float const> ca(a.data(), a.size());
  comm.all_reduce(sa, ReduceOp::kSum);
  comm.broadcast(sa, 0);
  comm.all_gather(ca, sb);
  comm.reduce_scatter(ca, sb, ReduceOp::kSum);
  comm.gather(ca, sb, 0);
  comm.scatter(ca, sb, 0);
  comm.barrier();
  CHECK(comm.transports == 7);
  comm.all_reduce_async(sa, ReduceOp::kSum).wait();
  CHECK(comm.transports == 8);
}

TEST_CASE("a backend with an enter() hook: it runs once per blocking collective, before the transport") {
  Hooked comm;
  std::vector<double> a(4, 2.0), b(4, 0.0);
  ddp::HostSpan<double> sa(a.data(), a.size()), sb(b.data(), b.size());
  ddp::HostSpan<double const> ca(a.data(), a.size());
  comm.all_reduce(sa, ReduceOp::kSum);
  comm.broadcast(sa, 0);
  comm.all_gather(ca, sb);
  comm.reduce_scatter(ca, sb, ReduceOp::kMax);
  comm.gather(ca, sb, 0);
  comm.scatter(ca, sb, 0);
  comm.barrier();
  CHECK(comm.transports == 7);
  std::vector<CollectiveKind> const want{CollectiveKind::kAllReduce, CollectiveKind::kBroadcast,
                                         CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                                         CollectiveKind::kGather,    CollectiveKind::kScatter,
                                         CollectiveKind::kBarrier};
  CHECK(comm.entered == want);
  // A rejected call (root out of range) never reaches the hook.
  CHECK_THROWS_AS(comm.broadcast(sa, 1), ddp::ArgumentError);
  CHECK(comm.entered.size() == want.size());
}
