// The Communicator conformance suite, written once: each backend's test instantiates these templates with
// Case<Harness, T>, where Harness::run(fn) calls fn(comm) on every rank of every world size it covers.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/error.hpp"

namespace ddp::test {

template <class H, class T>
struct Case {
  using Harness = H;
  using Elem = T;
};

// A buffer in a backend's memory space, filled from and read back to host vectors.
template <class Space, class T>
struct TestBuffer;

template <class T>
struct TestBuffer<HostSpace, T> {
  std::vector<T> data;
  explicit TestBuffer(std::vector<T> init) : data(std::move(init)) {}
  HostSpan<T> span() { return HostSpan<T>(data.data(), data.size()); }
  HostSpan<T> sub(std::size_t off, std::size_t n) { return span().subspan(off, n); }
  std::vector<T> host() const { return data; }
};

template <class Comm, class T>
TestBuffer<native_space_t<Comm>, T> make_buffer(std::vector<T> init) {
  return TestBuffer<native_space_t<Comm>, T>(std::move(init));
}

// Rank r's element i: small integers (exact in every type), sign alternating so max and min differ from
// "last rank" and "first rank".
template <class T>
T value(int r, std::size_t i) {
  T const v = static_cast<T>((r + 1) * static_cast<int>(i % 7 + 1));
  return (i % 2 == 1) ? static_cast<T>(-v) : v;
}

template <class T>
std::vector<T> filled(int r, std::size_t count, std::size_t offset = 0) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = value<T>(r, i + offset);
  return v;
}

// The serial oracle: fold ranks 0..n-1 in order.
template <class T>
std::vector<T> reduced(int n, std::size_t count, ReduceOp op, std::size_t offset = 0) {
  std::vector<T> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    T acc = value<T>(0, i + offset);
    for (int r = 1; r < n; ++r) {
      T const x = value<T>(r, i + offset);
      acc = op == ReduceOp::kMax ? std::max(acc, x) : op == ReduceOp::kMin ? std::min(acc, x) : static_cast<T>(acc + x);
    }
    if (op == ReduceOp::kAvg) acc = static_cast<T>(acc / static_cast<T>(n));
    out[i] = acc;
  }
  return out;
}

// One CHECK per buffer; floating types allow one rounding of the average's scale.
template <class T>
void expect_equal(std::vector<T> const& got, std::vector<T> const& want, std::string const& what) {
  std::string err;
  if (got.size() != want.size()) err = "size " + std::to_string(got.size()) + " != " + std::to_string(want.size());
  for (std::size_t i = 0; err.empty() && i < got.size(); ++i) {
    bool ok = got[i] == want[i];
    if constexpr (std::is_floating_point_v<T>) {
      ok = ok || std::abs(got[i] - want[i]) <= 4 * std::numeric_limits<T>::epsilon() * std::abs(want[i]);
    } else if constexpr (HalfFloat<T>) {  // the test's values are exact in 16 bits; allow one rounding anyway
      ok = ok || std::abs(float(got[i]) - float(want[i])) <= 0x1p-7f * std::abs(float(want[i]));
    }
    if (!ok)
      err = "index " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", want " + std::to_string(want[i]);
  }
  CHECK_MESSAGE(err.empty(), what, ": ", err);
}

inline std::vector<std::size_t> counts_for(int n) {
  // empty, one element, not divisible by n, around the threads backend's 32 KiB staging size, and large.
  return {0, 1, 2, 7, static_cast<std::size_t>(3 * n + 1), 1000, 8191, 8193, 40000};
}

inline constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

inline std::string where(int rank, int n, std::string const& what) {
  return what + " (rank " + std::to_string(rank) + " of " + std::to_string(n) + ")";
}

TEST_CASE_TEMPLATE_DEFINE("all_reduce equals the serial fold for every op and count", C, all_reduce_suite) {
  using T = typename C::Elem;
  C::Harness::run([](auto& comm) {
    using Comm = std::remove_reference_t<decltype(comm)>;
    int const n = comm.world_size();
    int const r = comm.rank();
    for (std::size_t count : counts_for(n)) {
      for (ReduceOp op : kOps) {
        auto buf = make_buffer<Comm, T>(filled<T>(r, count));
        comm.all_reduce(buf.span(), op, CollectiveTag{"count", static_cast<std::int64_t>(count)});
        expect_equal(buf.host(), reduced<T>(n, count, op),
                     where(r, n, "all_reduce " + std::string(name(op)) + " count " + std::to_string(count)));
      }
    }
  });
}

TEST_CASE_TEMPLATE_DEFINE("broadcast copies the root's buffer to every rank", C, broadcast_suite) {
  using T = typename C::Elem;
  C::Harness::run([](auto& comm) {
    using Comm = std::remove_reference_t<decltype(comm)>;
    int const n = comm.world_size();
    int const r = comm.rank();
    for (int root : {0, n - 1, n / 2}) {
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{20000}}) {
        auto buf = make_buffer<Comm, T>(filled<T>(r, count));
        comm.broadcast(buf.span(), root);
        expect_equal(buf.host(), filled<T>(root, count),
                     where(r, n, "broadcast root " + std::to_string(root) + " count " + std::to_string(count)));
      }
    }
  });
}

TEST_CASE_TEMPLATE_DEFINE("all_gather, gather and scatter place rank r's block at r * block", C, gather_suite) {
  using T = typename C::Elem;
  C::Harness::run([](auto& comm) {
    using Comm = std::remove_reference_t<decltype(comm)>;
    int const n = comm.world_size();
    int const r = comm.rank();
    for (std::size_t m : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{3001}}) {
      std::string const ctx = " block " + std::to_string(m);
      // Every rank's block i holds value(r, r * m + i); gathered, that is the oracle's rank-r stripes.
      std::vector<T> all(m * n);
      for (int k = 0; k < n; ++k) {
        auto const part = filled<T>(k, m, k * m);
        std::copy(part.begin(), part.end(), all.begin() + static_cast<std::ptrdiff_t>(k * m));
      }
      auto in = make_buffer<Comm, T>(filled<T>(r, m, r * m));
      auto out = make_buffer<Comm, T>(std::vector<T>(m * n, T(-99)));
      comm.all_gather(in.span(), out.span());
      expect_equal(out.host(), all, where(r, n, "all_gather" + ctx));

      // In place: rank r's input is already its block of the output.
      std::vector<T> mine(m * n, T(-99));
      std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(r * m), m,
                  mine.begin() + static_cast<std::ptrdiff_t>(r * m));
      auto inplace = make_buffer<Comm, T>(mine);
      comm.all_gather(inplace.sub(r * m, m), inplace.span());
      expect_equal(inplace.host(), all, where(r, n, "all_gather in place" + ctx));

      for (int root : {0, n - 1}) {
        auto gout = make_buffer<Comm, T>(std::vector<T>(r == root ? m * n : 0, T(-99)));
        comm.gather(in.span(), gout.span(), root);
        if (r == root) expect_equal(gout.host(), all, where(r, n, "gather root " + std::to_string(root) + ctx));

        auto sin = make_buffer<Comm, T>(r == root ? all : std::vector<T>{});
        auto sout = make_buffer<Comm, T>(std::vector<T>(m, T(-99)));
        comm.scatter(sin.span(), sout.span(), root);
        expect_equal(sout.host(), filled<T>(r, m, r * m), where(r, n, "scatter root " + std::to_string(root) + ctx));
      }
    }
  });
}

TEST_CASE_TEMPLATE_DEFINE("reduce_scatter gives rank r the reduced block r", C, reduce_scatter_suite) {
  using T = typename C::Elem;
  C::Harness::run([](auto& comm) {
    using Comm = std::remove_reference_t<decltype(comm)>;
    int const n = comm.world_size();
    int const r = comm.rank();
    for (std::size_t m : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{3001}}) {
      for (ReduceOp op : kOps) {
        auto in = make_buffer<Comm, T>(filled<T>(r, m * n));
        auto out = make_buffer<Comm, T>(std::vector<T>(m, T(-99)));
        comm.reduce_scatter(in.span(), out.span(), op);
        auto const want = reduced<T>(n, m, op, r * m);
        expect_equal(out.host(), want,
                     where(r, n, "reduce_scatter " + std::string(name(op)) + " block " + std::to_string(m)));
      }
    }
  });
}

TEST_CASE_TEMPLATE_DEFINE("async all-reduces over bucket slices of one arena complete in issue order", C, async_suite) {
  using T = typename C::Elem;
  C::Harness::run([](auto& comm) {
    using Comm = std::remove_reference_t<decltype(comm)>;
    int const n = comm.world_size();
    int const r = comm.rank();
    std::size_t const size = 20000 + static_cast<std::size_t>(n);
    std::vector<std::size_t> const edges = {0, 1, 101, 4101, 12000, size};
    auto arena = make_buffer<Comm, T>(filled<T>(r, size));
    using W = decltype(comm.all_reduce_async(arena.span(), ReduceOp::kSum));
    std::vector<W> works;
    works.reserve(edges.size());
    for (std::size_t b = 0; b + 1 < edges.size(); ++b) {
      ReduceOp const op = b % 2 == 0 ? ReduceOp::kSum : ReduceOp::kAvg;
      works.push_back(comm.all_reduce_async(arena.sub(edges[b], edges[b + 1] - edges[b]), op,
                                            CollectiveTag{"bucket", static_cast<std::int64_t>(b)}));
    }
    for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();  // any order
    for (auto const& w : works) CHECK(w.test());
    auto const got = arena.host();
    for (std::size_t b = 0; b + 1 < edges.size(); ++b) {
      ReduceOp const op = b % 2 == 0 ? ReduceOp::kSum : ReduceOp::kAvg;
      std::vector<T> const part(got.begin() + static_cast<std::ptrdiff_t>(edges[b]),
                                got.begin() + static_cast<std::ptrdiff_t>(edges[b + 1]));
      expect_equal(part, reduced<T>(n, edges[b + 1] - edges[b], op, edges[b]),
                   where(r, n, "async bucket " + std::to_string(b)));
    }
    // A blocking collective issued while async work is pending runs after it, on every rank.
    auto a = make_buffer<Comm, T>(filled<T>(r, 3000));
    auto b = make_buffer<Comm, T>(filled<T>(r, 7));
    auto w = comm.all_reduce_async(a.span(), ReduceOp::kMax);
    comm.broadcast(b.span(), n - 1);
    w.wait();
    expect_equal(a.host(), reduced<T>(n, 3000, ReduceOp::kMax), where(r, n, "async then blocking"));
    expect_equal(b.host(), filled<T>(n - 1, 7), where(r, n, "blocking after async"));
    comm.barrier();
  });
}

TEST_CASE_TEMPLATE_DEFINE("bad arguments throw ArgumentError naming the rank and the operation", C, errors_suite) {
  using T = typename C::Elem;
  C::Harness::run([](auto& comm) {
    using Comm = std::remove_reference_t<decltype(comm)>;
    int const n = comm.world_size();
    int const r = comm.rank();
    auto buf = make_buffer<Comm, T>(filled<T>(r, 4));
    std::string const rank_word = "rank " + std::to_string(r);
    try {
      comm.broadcast(buf.span(), n);
      CHECK_MESSAGE(false, "broadcast to root == world_size did not throw");
    } catch (ArgumentError const& e) {
      std::string const what = e.what();
      CHECK(what.find("broadcast") != std::string::npos);
      CHECK(what.find(rank_word) != std::string::npos);
    }
    auto small = make_buffer<Comm, T>(std::vector<T>(4 * static_cast<std::size_t>(n) + 1));
    CHECK_THROWS_AS(comm.all_gather(buf.span(), small.span()), ArgumentError);
    CHECK_THROWS_AS(comm.reduce_scatter(small.span(), buf.span(), ReduceOp::kSum), ArgumentError);
    // Still usable afterwards.
    comm.all_reduce(buf.span(), ReduceOp::kSum);
    expect_equal(buf.host(), reduced<T>(n, 4, ReduceOp::kSum), where(r, n, "all_reduce after errors"));
  });
}

}  // namespace ddp::test

// The whole suite over `Harness` (a type with `static void run(fn)` calling fn(comm) on every rank) for every
// element type a backend carries: float, double, int32, int64, bfloat16, float16. One line per backend program,
// at global scope: DDP_CONFORMANCE_SUITE(Mpi). The cases are named "<float>", "<bfloat16>", ...
#define DDP_CONFORMANCE_SUITE(Harness)                                                                                \
  namespace ddp::test::every_type {                                                                                   \
  using F32 = Case<Harness, float>;                                                                                   \
  using F64 = Case<Harness, double>;                                                                                  \
  using I32 = Case<Harness, std::int32_t>;                                                                            \
  using I64 = Case<Harness, std::int64_t>;                                                                            \
  using BF16 = Case<Harness, ::ddp::bfloat16>;                                                                        \
  using F16 = Case<Harness, ::ddp::float16>;                                                                          \
  }                                                                                                                   \
  TYPE_TO_STRING_AS("float", ddp::test::every_type::F32);                                                             \
  TYPE_TO_STRING_AS("double", ddp::test::every_type::F64);                                                            \
  TYPE_TO_STRING_AS("int32", ddp::test::every_type::I32);                                                             \
  TYPE_TO_STRING_AS("int64", ddp::test::every_type::I64);                                                             \
  TYPE_TO_STRING_AS("bfloat16", ddp::test::every_type::BF16);                                                         \
  TYPE_TO_STRING_AS("float16", ddp::test::every_type::F16);                                                           \
  namespace ddp::test {                                                                                               \
  TEST_CASE_TEMPLATE_INVOKE(all_reduce_suite, every_type::F32, every_type::F64, every_type::I32, every_type::I64,     \
                            every_type::BF16, every_type::F16);                                                       \
  TEST_CASE_TEMPLATE_INVOKE(broadcast_suite, every_type::F32, every_type::F64, every_type::I32, every_type::I64,      \
                            every_type::BF16, every_type::F16);                                                       \
  TEST_CASE_TEMPLATE_INVOKE(gather_suite, every_type::F32, every_type::F64, every_type::I32, every_type::I64,         \
                            every_type::BF16, every_type::F16);                                                       \
  TEST_CASE_TEMPLATE_INVOKE(reduce_scatter_suite, every_type::F32, every_type::F64, every_type::I32, every_type::I64, \
                            every_type::BF16, every_type::F16);                                                       \
  TEST_CASE_TEMPLATE_INVOKE(async_suite, every_type::F32, every_type::F64, every_type::I32, every_type::I64,          \
                            every_type::BF16, every_type::F16);                                                       \
  TEST_CASE_TEMPLATE_INVOKE(errors_suite, every_type::F32, every_type::F64, every_type::I32, every_type::I64,         \
                            every_type::BF16, every_type::F16);                                                       \
  }                                                                                                                   \
  static_assert(true, "")
