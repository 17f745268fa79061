// ddp/comm/mpi/store_chooser.hpp: which stores NodeAllReduce writes its window with.
#include "ddp/comm/mpi/store_chooser.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>

using ddp::WindowStores;
using ddp::detail::StoreChooser;
using ddp::detail::Stores;

bool chooses_streaming(StoreChooser& c, std::size_t bytes) { return c.choose(bytes) == Stores::kStreaming; }
Stores stores_of(bool streamed) { return streamed ? Stores::kStreaming : Stores::kPlain; }

TEST_CASE("StoreChooser: fixed modes, and plain stores below the size") {
  StoreChooser plain(WindowStores::kPlain, 100), streaming(WindowStores::kStreaming, 100);
  CHECK_FALSE(chooses_streaming(plain, 1000));
  CHECK(chooses_streaming(streaming, 1000));
  CHECK_FALSE(chooses_streaming(streaming, 99));
  StoreChooser adaptive(WindowStores::kAdaptive, 100);
  for (int i = 0; i < 20; ++i) CHECK_FALSE(chooses_streaming(adaptive, 99));
}

// `calls` calls of `c` at `bytes` with fixed rates (bytes per second) for each mode: the modes taken, 'p'
// plain and 'S' streaming.
std::string run(StoreChooser& c, std::size_t bytes, int calls, double plain_rate, double streaming_rate) {
  std::string seen;
  for (int i = 0; i < calls; ++i) {
    bool const s = chooses_streaming(c, bytes);
    seen += s ? 'S' : 'p';
    c.record(stores_of(s), bytes, static_cast<double>(bytes) / (s ? streaming_rate : plain_rate));
  }
  return seen;
}

TEST_CASE("StoreChooser: kAdaptive measures both, takes the faster, explores, and follows a change") {
  StoreChooser c(WindowStores::kAdaptive, 100);
  // Each mode is measured on its second call in a row: the first follows the other mode (or runs cold).
  CHECK(run(c, 1000, 4, 1e6, 4e6) == "ppSS");
  CHECK(c.rate(Stores::kPlain, 1000) == doctest::Approx(1e6));
  CHECK(c.rate(Stores::kStreaming, 1000) == doctest::Approx(4e6));
  // The faster; a try of the slower (two calls) after kFirst calls, then after twice as many each time the try
  // confirms the choice.
  CHECK(run(c, 1000, 22, 1e6, 4e6) == "SSppSSSSppSSSSSSSSppSS");
  // In a steady state a try of two calls in every kLongest + 2.
  run(c, 1000, 400, 1e6, 4e6);  // the interval has reached kLongest
  int const cycle = static_cast<int>(StoreChooser::kLongest) + 2;
  std::string const steady = run(c, 1000, 4 * cycle, 1e6, 4e6);
  CHECK(std::count(steady.begin(), steady.end(), 'p') == 8);
  // The machine changes: streaming gets slow, plain fast. The streamed calls measure the new, slow rate: then
  // plain, and a try of streaming after kFirst calls (its two calls), then plain for twice as many.
  std::string const change = run(c, 1000, 10, 1e7, 0.5e6);
  REQUIRE(change.find('p') != std::string::npos);
  CHECK(change.substr(change.find('p'), 8) == "ppSSpppp");
  CHECK(c.rate(Stores::kPlain, 1000) == doctest::Approx(1e7));
  CHECK(c.rate(Stores::kStreaming, 1000) == doctest::Approx(0.5e6));
  // A rate that depends on the previous call's mode: plain right after streaming runs at 1 MB/s (the lines
  // are elsewhere), plain after plain at 8; streaming at 2 either way. Counting only second calls finds plain.
  StoreChooser state(WindowStores::kAdaptive, 100);
  std::string seen;
  bool previous_streamed = false;
  for (int i = 0; i < 40; ++i) {
    bool const s = chooses_streaming(state, 1000);
    seen += s ? 'S' : 'p';
    double const rate = s ? 2e6 : previous_streamed ? 1e6 : 8e6;
    state.record(stores_of(s), 1000, 1000 / rate);
    previous_streamed = s;
  }
  CHECK(seen.substr(0, 4) == "ppSS");
  CHECK(std::count(seen.begin() + 4, seen.end(), 'S') <= 8);  // tries only
  CHECK(state.rate(Stores::kPlain, 1000) == doctest::Approx(8e6));
  // One slow call (a preemption, a late peer) does not flip the choice: a mode is judged by the better of its
  // last two measurements. Two in a row do.
  StoreChooser noisy(WindowStores::kAdaptive, 100);
  CHECK(run(noisy, 1000, 4, 8e6, 2e6) == "ppSS");
  CHECK_FALSE(chooses_streaming(noisy, 1000));
  noisy.record(Stores::kPlain, 1000, 1e-3);  // 1 MB/s once
  CHECK(noisy.rate(Stores::kPlain, 1000) == doctest::Approx(8e6));
  CHECK_FALSE(chooses_streaming(noisy, 1000));
  noisy.record(Stores::kPlain, 1000, 1e-3);  // and again: plain is now slower than streaming
  CHECK(chooses_streaming(noisy, 1000));
  // Another size class has its own rates: measured afresh, plain first.
  CHECK_FALSE(chooses_streaming(c, 1 << 20));
  CHECK(c.rate(Stores::kPlain, 1 << 20) == 0);
  // Records below the size or without a duration are ignored.
  c.record(Stores::kStreaming, 10, 1e-9);
  c.record(Stores::kStreaming, 1000, 0);
  CHECK(c.rate(Stores::kStreaming, 1000) == doctest::Approx(0.5e6));
}
