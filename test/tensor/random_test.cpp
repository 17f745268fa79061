// Generator (random.hpp): the batched fill_u32 is the scalar sequence, bit for bit, and leaves the
// generator where n calls of next_u32 would.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "ddp/tensor/random.hpp"

TEST_CASE("fill_u32 gives exactly the values and final state of repeated next_u32") {
  for (std::int64_t n : {0, 1, 7, 15, 16, 17, 64, 1000, 4099}) {
    ddp::Generator a(1234, 77), b(1234, 77);
    (void)a.next_u32(), (void)b.next_u32();  // not at the start of the stream
    std::vector<std::uint32_t> got(static_cast<std::size_t>(n));
    a.fill_u32(got.data(), n);
    for (std::int64_t i = 0; i < n; ++i) {
      INFO("n ", n, " i ", i);
      REQUIRE(got[static_cast<std::size_t>(i)] == b.next_u32());
    }
    CHECK(a.next_u32() == b.next_u32());
  }
}
