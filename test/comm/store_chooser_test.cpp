// ddp/comm/detail/store_chooser.hpp: which stores NodeAllReduce writes its window with.
#include "ddp/comm/detail/store_chooser.hpp"

#include <doctest/doctest.h>

using ddp::WindowStores;
using ddp::detail::StoreChooser;

TEST_CASE("StoreChooser: fixed modes, and plain stores below the size") {
  StoreChooser plain(WindowStores::kPlain, 100), streaming(WindowStores::kStreaming, 100);
  CHECK_FALSE(plain.stream(1000));
  CHECK(streaming.stream(1000));
  CHECK_FALSE(streaming.stream(99));
  StoreChooser adaptive(WindowStores::kAdaptive, 100);
  for (int i = 0; i < 20; ++i) CHECK_FALSE(adaptive.stream(99));
}

TEST_CASE("StoreChooser: kAdaptive measures both, takes the faster, explores, and follows a change") {
  StoreChooser c(WindowStores::kAdaptive, 100);
  CHECK_FALSE(c.stream(1000));    // plain first
  c.record(false, 1000, 1e-3);    // plain: 1 MB/s
  CHECK(c.stream(1000));          // then streaming
  c.record(true, 1000, 0.25e-3);  // streaming: 4 MB/s
  int streamed = 0, plain = 0;
  for (int i = 0; i < 16; ++i) {
    bool const s = c.stream(1000);
    (s ? streamed : plain)++;
    c.record(s, 1000, s ? 0.25e-3 : 1e-3);
  }
  CHECK(streamed == 14);  // the faster one, but for one call in kExplore
  CHECK(plain == 2);
  // The machine changes: streaming gets slow, plain fast. The choice follows within kExplore calls.
  int calls_to_switch = 0;
  for (int i = 0; i < 2 * static_cast<int>(StoreChooser::kExplore); ++i) {
    bool const s = c.stream(1000);
    c.record(s, 1000, s ? 2e-3 : 0.1e-3);
    if (!s) {
      calls_to_switch = i + 1;
      break;
    }
  }
  CHECK(calls_to_switch == 2);  // the first streamed call measures the new, slow rate: the next one is plain
  CHECK(c.rate(false, 1000) == doctest::Approx(1000 / 0.1e-3));
  int again = 0;
  for (int i = 0; i < 16; ++i) again += c.stream(1000) ? 1 : 0;
  CHECK(again == 2);  // now plain, streaming only to explore
  // Another size class has its own rates: measured afresh, plain first.
  CHECK_FALSE(c.stream(1 << 20));
  CHECK(c.rate(false, 1 << 20) == 0);
  // Records below the size or without a duration are ignored.
  c.record(true, 10, 1e-9);
  c.record(true, 1000, 0);
  CHECK(c.rate(true, 1000) == doctest::Approx(1000 / 2e-3));
}
