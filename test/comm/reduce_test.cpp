// ddp/comm/detail/reduce.hpp: reduce_blocks_streaming (the in-place all-reduce's kernel with streaming stores
// into the peers' buffers) gives reduce_blocks' bits, in place, for every op, dtype, rank count, alignment and
// length around a cache line; it writes exactly the elements asked for.
#include "ddp/comm/detail/reduce.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using ddp::ReduceOp;

template <class T>
T value(int rank, std::size_t i) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(0.1) * static_cast<T>((i * 37 + 11 * static_cast<std::size_t>(rank)) % 101) -
           static_cast<T>(rank) / static_cast<T>(3);
  } else {
    return static_cast<T>((i * 37 + 11 * static_cast<std::size_t>(rank)) % 101) - static_cast<T>(50 * rank);
  }
}

// n ranks' buffers of `len` elements (plus guard room), each starting `shift` elements past a 64-byte line
// (every rank alike, as in a shared block) or, with `skew`, rank k at shift + k elements.
template <class T>
struct Buffers {
  std::vector<std::vector<T>> store;
  std::vector<T*> at;
  Buffers(int n, std::size_t len, std::size_t shift, bool skew) {
    for (int k = 0; k < n; ++k) {
      store.emplace_back(len + 4 * 64 / sizeof(T) + 8, T(-7));
      auto const base = reinterpret_cast<std::uintptr_t>(store.back().data());
      std::size_t const to_line = ((64 - base % 64) % 64) / sizeof(T);  // vectors of T are T-aligned
      T* p = store.back().data() + to_line + 64 / sizeof(T) + shift + (skew ? static_cast<std::size_t>(k) : 0);
      for (std::size_t i = 0; i < len; ++i) p[i] = value<T>(k, i);
      at.push_back(p);
    }
  }
};

template <class T>
void check_all() {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    for (int n : {1, 2, 3, 4}) {
      for (std::size_t shift : {std::size_t{0}, std::size_t{1}, 64 / sizeof(T) - 1}) {
        for (bool skew : {false, true}) {
          for (std::size_t len : {std::size_t{0}, std::size_t{1}, 64 / sizeof(T) - 1, 64 / sizeof(T),
                                  64 / sizeof(T) + 1, std::size_t{1000}, std::size_t{4099}}) {
            CAPTURE(static_cast<int>(op));
            CAPTURE(n);
            CAPTURE(shift);
            CAPTURE(skew);
            CAPTURE(len);
            Buffers<T> plain(n, len, shift, skew), streamed(n, len, shift, skew);
            std::vector<T const*> ps(plain.at.begin(), plain.at.end());
            std::vector<T const*> ss(streamed.at.begin(), streamed.at.end());
            ddp::detail::reduce_blocks<T>(ps.data(), n, plain.at.data(), n, len, op);
            ddp::detail::reduce_blocks_streaming<T>(ss.data(), n, streamed.at.data(), n, len, op);
            std::size_t const guard = 64 / sizeof(T);  // a line's worth on either side must stay untouched
            for (std::size_t k = 0; k < static_cast<std::size_t>(n); ++k) {
              CHECK(std::memcmp(plain.at[k] - guard, streamed.at[k] - guard, (len + 2 * guard) * sizeof(T)) == 0);
              CHECK(streamed.at[k][-1] == T(-7));
              CHECK(streamed.at[k][len] == T(-7));
            }
          }
        }
      }
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("reduce_blocks_streaming equals reduce_blocks bit for bit, in place, guards untouched", T, float,
                   double, std::int32_t, std::int64_t) {
  check_all<T>();
}

TEST_CASE("reduce_blocks_streaming: this rank's buffer first, in any rank order of the destinations") {
  // The kernel's first destination is the calling rank's buffer; the others may come in any order.
  Buffers<float> a(3, 300, 0, false), b(3, 300, 0, false);
  std::vector<float const*> sa(a.at.begin(), a.at.end()), sb(b.at.begin(), b.at.end());
  std::vector<float*> db = {b.at[2], b.at[0], b.at[1]};
  ddp::detail::reduce_blocks<float>(sa.data(), 3, a.at.data(), 3, 300, ReduceOp::kAvg);
  ddp::detail::reduce_blocks_streaming<float>(sb.data(), 3, db.data(), 3, 300, ReduceOp::kAvg);
  for (std::size_t k = 0; k < 3; ++k) CHECK(std::memcmp(a.at[k], b.at[k], 300 * sizeof(float)) == 0);
}
