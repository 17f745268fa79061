// ddp/tensor/stream_copy.hpp: streaming copies equal memcpy for every alignment of source and destination and
// every length around the 16-byte head and the 64-byte body.
#include "ddp/tensor/stream_copy.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

TEST_CASE("stream_copy copies exactly the bytes asked for, at any alignment and length") {
  std::vector<std::uint8_t> src(512), dst(512 + 64);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint8_t>(i * 7 + 3);
  for (std::size_t s_off : {0, 1, 7, 16, 33})
    for (std::size_t d_off : {0, 1, 8, 15, 16, 63})
      for (std::size_t n : {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 200, 400}) {
        CAPTURE(s_off);
        CAPTURE(d_off);
        CAPTURE(n);
        std::fill(dst.begin(), dst.end(), std::uint8_t{0xEE});
        ddp::detail::stream_copy(dst.data() + d_off, src.data() + s_off, n);
        ddp::detail::stream_fence();
        bool same = true, untouched = true;
        for (std::size_t i = 0; i < n; ++i) same = same && dst[d_off + i] == src[s_off + i];
        for (std::size_t i = 0; i < d_off; ++i) untouched = untouched && dst[i] == 0xEE;
        for (std::size_t i = d_off + n; i < dst.size(); ++i) untouched = untouched && dst[i] == 0xEE;
        CHECK(same);
        CHECK(untouched);
      }
}

TEST_CASE("stream_line copies one aligned cache line") {
  alignas(64) std::uint8_t src[64];
  alignas(64) std::uint8_t dst[192];
  for (std::size_t i = 0; i < 64; ++i) src[i] = static_cast<std::uint8_t>(i * 5 + 1);
  std::fill(std::begin(dst), std::end(dst), std::uint8_t{0xEE});
  ddp::detail::stream_line(dst + 64, src);
  ddp::detail::stream_fence();
  for (std::size_t i = 0; i < 192; ++i) {
    CAPTURE(i);
    CHECK(dst[i] == (i >= 64 && i < 128 ? src[i - 64] : 0xEE));
  }
}
