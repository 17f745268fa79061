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

TEST_CASE("pcg_jump and advance: value i of the stream drawn directly, and the state after n values") {
  ddp::Generator g(99, 5);
  (void)g.next_u32();
  ddp::GeneratorState const at = g.state();
  std::vector<std::uint32_t> seq(5000);
  for (auto& v : seq) v = g.next_u32();
  for (std::uint64_t i : {0ULL, 1ULL, 2ULL, 3ULL, 255ULL, 256ULL, 4095ULL, 4999ULL}) {
    INFO("i ", i);
    CHECK(ddp::detail::pcg_output(ddp::detail::pcg_jump(at.inc, i)(at.state)) == seq[i]);
  }
  ddp::Generator h;
  h.set_state(at);
  h.advance(5000);
  CHECK(h.state() == g.state());
  CHECK(h.next_u32() == g.next_u32());
  h.advance(0);
  CHECK(h.state() == g.state());
  // A jump of k then of m is a jump of k + m (the composition the device masks stride with).
  auto const two = ddp::detail::pcg_jump(at.inc, 300);
  CHECK(two(two(at.state)) == ddp::detail::pcg_jump(at.inc, 600)(at.state));
}
