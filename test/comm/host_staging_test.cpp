// HostStaging<C, Space>: buffers of a space the host cannot touch are copied to host memory, reduced by the
// inner backend, and copied back (once each way per collective; async results on wait()); host buffers and
// host-accessible spaces pass through untouched. "FarSpace" stands in for CUDA memory on this GPU-less machine.
#include <doctest/doctest.h>

#include <cstring>
#include <string_view>
#include <vector>

#include "ddp/ddp.hpp"

namespace {
struct FarSpace {
  static constexpr std::string_view name = "far";
};
}  // namespace

namespace ddp {
// Copies that count themselves (thread-local: each rank is a thread).
template <>
struct Kernels<FarSpace> {
  static int& copies() {
    thread_local int n = 0;
    return n;
  }
  template <class T>
  static void from_host(std::int64_t n, T const* src, T* dst) {
    std::memcpy(dst, src, sizeof(T) * static_cast<std::size_t>(n));
    ++copies();
  }
  template <class T>
  static void to_host(std::int64_t n, T const* src, T* dst) {
    std::memcpy(dst, src, sizeof(T) * static_cast<std::size_t>(n));
    ++copies();
  }
};
}  // namespace ddp

using namespace ddp;
using Far = Kernels<FarSpace>;

static_assert(!host_accessible_v<FarSpace>);
static_assert(AsyncCommunicator<HostStaging<ThreadsBackend, FarSpace>>);

TEST_CASE(
    "HostStaging: all_reduce, async all_reduce, broadcast, all_gather of staged buffers; host buffers pass through") {
  spawn(3, [](ThreadsBackend& comm) {
    HostStaging<ThreadsBackend, FarSpace> st(comm);
    int const r = comm.rank(), n = comm.world_size();
    std::vector<float> far(5, float(r + 1));
    Far::copies() = 0;
    st.all_reduce(SpaceSpan<float, FarSpace>(far.data(), far.size()), ReduceOp::kSum);
    for (float v : far) CHECK(v == 6.0f);
    CHECK(Far::copies() == 2);  // one copy out, one back

    std::vector<double> async(7, double(r));
    auto w = st.all_reduce_async(SpaceSpan<double, FarSpace>(async.data(), async.size()), ReduceOp::kAvg);
    CHECK(Far::copies() == 3);  // staged out at issue; the result comes back on wait()
    w.wait();
    CHECK(Far::copies() == 4);
    for (double v : async) CHECK(v == doctest::Approx(1.0));

    std::vector<std::int64_t> b(4, r == 1 ? 42 : -1);
    st.broadcast(SpaceSpan<std::int64_t, FarSpace>(b.data(), b.size()), 1);
    for (auto v : b) CHECK(v == 42);

    std::vector<std::int32_t> in{r, 10 * r}, out(2 * static_cast<std::size_t>(n), -1);
    st.all_gather(SpaceSpan<std::int32_t const, FarSpace>(in.data(), in.size()),
                  SpaceSpan<std::int32_t, FarSpace>(out.data(), out.size()));
    for (int k = 0; k < n; ++k) CHECK((out[2 * k] == k && out[2 * k + 1] == 10 * k));

    int const before = Far::copies();
    std::vector<float> host(3, 1.0f);
    st.all_reduce(host, ReduceOp::kSum);  // host memory: forwarded, no copies
    CHECK(Far::copies() == before);
    CHECK(host[0] == 3.0f);
  });
}
