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

// Calls of `c` at `bytes` with fixed rates (bytes per second) for each mode; how many streamed.
int run(StoreChooser& c, std::size_t bytes, int calls, double plain_rate, double streaming_rate) {
  int streamed = 0;
  for (int i = 0; i < calls; ++i) {
    bool const s = c.stream(bytes);
    streamed += s ? 1 : 0;
    c.record(s, bytes, static_cast<double>(bytes) / (s ? streaming_rate : plain_rate));
  }
  return streamed;
}

TEST_CASE("StoreChooser: kAdaptive measures both, takes the faster, explores, and follows a change") {
  StoreChooser c(WindowStores::kAdaptive, 100);
  CHECK_FALSE(c.stream(1000));    // plain first
  c.record(false, 1000, 1e-3);    // plain: 1 MB/s
  CHECK(c.stream(1000));          // then streaming
  c.record(true, 1000, 0.25e-3);  // streaming: 4 MB/s
  // Ratio 4: the slower mode is tried once in kExplore * 16 calls.
  int const interval = static_cast<int>(StoreChooser::kExplore) * 16;
  CHECK(run(c, 1000, interval - 1, 1e6, 4e6) == interval - 1);
  CHECK_FALSE(c.stream(1000));  // the exploring call
  c.record(false, 1000, 1e-3);
  CHECK(run(c, 1000, interval, 1e6, 4e6) == interval - 1);  // again after as many calls
  // The machine changes: streaming gets slow, plain fast. The first streamed call measures the new, slow
  // rate: the next one is plain.
  CHECK(c.stream(1000));
  c.record(true, 1000, 2e-3);  // 0.5 MB/s
  CHECK_FALSE(c.stream(1000));
  c.record(false, 1000, 0.1e-3);  // 10 MB/s
  CHECK(c.rate(false, 1000) == doctest::Approx(1e7));
  // Ratio 20: the backoff is capped at kMaxBackoff.
  int const capped = static_cast<int>(StoreChooser::kExplore * StoreChooser::kMaxBackoff);
  CHECK(run(c, 1000, capped, 1e7, 0.5e6) == 1);
  // Close rates: the slower one is tried every kExplore calls, to follow a change soon.
  StoreChooser close(WindowStores::kAdaptive, 100);
  CHECK(run(close, 1000, 2, 1e6, 1e6) == 1);                                             // plain, then streaming
  CHECK(run(close, 1000, 8 * static_cast<int>(StoreChooser::kExplore), 1e6, 1e6) == 8);  // equal: plain wins ties
  // A slow-down of the chosen mode shows at once (it is measured on every call); a speed-up of the other one
  // within the interval of the old ratio.
  StoreChooser follow(WindowStores::kAdaptive, 100);
  run(follow, 1000, 20, 1e6, 2e6);  // streaming chosen, ratio 2: explores every 4 kExplore calls
  int first_plain = -1;
  for (int i = 0; i < 8 * static_cast<int>(StoreChooser::kExplore) && first_plain < 0; ++i) {
    bool const s = follow.stream(1000);
    follow.record(s, 1000, s ? 1000 / 2e6 : 1000 / 8e6);  // plain now 8 MB/s
    if (!s) first_plain = i;
  }
  CHECK(first_plain >= 0);
  CHECK(first_plain < 4 * static_cast<int>(StoreChooser::kExplore));
  CHECK_FALSE(follow.stream(1000));  // once measured, plain is chosen
  // Another size class has its own rates: measured afresh, plain first.
  CHECK_FALSE(c.stream(1 << 20));
  CHECK(c.rate(false, 1 << 20) == 0);
  // Records below the size or without a duration are ignored.
  c.record(true, 10, 1e-9);
  c.record(true, 1000, 0);
  CHECK(c.rate(true, 1000) == doctest::Approx(0.5e6));
}
