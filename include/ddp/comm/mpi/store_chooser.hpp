// Which stores NodeAllReduce writes its shared window (and, in place, the peers' buffers) with, per rank: plain
// or streaming (non-temporal). The faster one depends on where the ranks' cores are: sharing a cache, plain
// stores hand lines over through it; in other cache domains every plain store first fetches back the line a
// peer read (a VM's vCPUs can move between the two while a job runs, and the wrong choice is costly either way:
// bench/RESULTS.md). The choice changes only how bytes get into the window,
// never the bytes, so every rank may decide for itself: kAdaptive keeps each mode's rate per size class (a power
// of two: in-cache and out-of-cache sizes differ) and takes the faster. A mode's rate is the higher of its last
// two measurements: a call that a preemption or a late peer slowed down does not flip the choice (timing noise
// only ever slows a call), while a mode that got faster shows at its first measurement.
// - A rate counts only from a call that follows a call of the same mode and class: a call's speed depends on
//   where the previous one left the lines (after streaming stores they are in memory, after plain ones in the
//   peer's cache), and the first call at a size runs cold. So each mode is measured on its second call in a row.
// - To follow a change it tries the slower mode again (two calls: the first is not counted), at first after
//   kFirst calls of that class, then after twice as many each time the try confirms the choice, at most
//   kLongest; when the choice changes the interval starts again at kFirst. In a steady state the time lost to
//   tries is at most 2 (r - 1) / kLongest for a rate ratio r: 3% at r = 5, which is in place in the
//   shared-cache mode (streaming stores at a fifth of plain ones' rate), where a try every 8 calls cost 50%.
// - A change that slows the chosen mode shows within two calls (it is measured on every call); one that speeds
//   up the other mode shows at its next try, within kLongest calls.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace ddp {

enum class WindowStores { kAdaptive, kStreaming, kPlain };

namespace detail {

// The stores one all-reduce writes with (StoreChooser's choice for it).
enum class Stores { kPlain, kStreaming };

class StoreChooser {
 public:
  static constexpr std::uint64_t kFirst = 2;
  static constexpr std::uint64_t kLongest = 256;

  StoreChooser(WindowStores mode, std::size_t min_bytes) noexcept : mode_(mode), min_bytes_(min_bytes) {}

  // The stores an all-reduce of `bytes` writes with.
  Stores choose(std::size_t bytes) noexcept { return choose_streaming(bytes) ? Stores::kStreaming : Stores::kPlain; }
  // The rate (bytes per second) an all-reduce of `bytes` written with `stores` reached. Counted only if the
  // class's previous call took the same mode.
  void record(Stores stores, std::size_t bytes, double seconds) noexcept {
    if (mode_ != WindowStores::kAdaptive || bytes < min_bytes_ || seconds <= 0) return;
    Class& c = cls(bytes);
    int const mode = index(stores);
    if (c.last == mode) {
      auto& r = c.rates[mode];
      r[0] = r[1];
      r[1] = static_cast<double>(bytes) / seconds;
    }
    c.last = mode;
  }
  // The rate a mode is judged by: the higher of its last two measurements (0 before the first).
  double rate(Stores stores, std::size_t bytes) const noexcept {
    return classes_[static_cast<std::size_t>(std::bit_width(bytes))].rate(index(stores));
  }

 private:
  static int index(Stores s) noexcept { return s == Stores::kStreaming ? 1 : 0; }
  bool choose_streaming(std::size_t bytes) noexcept {
    if (bytes < min_bytes_ || mode_ == WindowStores::kPlain) return false;
    if (mode_ == WindowStores::kStreaming) return true;
    Class& c = cls(bytes);
    if (c.rate(0) == 0) return false;  // measure each mode first
    if (c.rate(1) == 0) return true;
    bool const best = c.rate(1) > c.rate(0);
    if (best != c.best) c.best = best, c.since = 0, c.interval = kFirst;
    if (++c.since <= c.interval) return best;
    if (c.since == c.interval + 1) return !best;  // a try: two calls of the slower mode, the second measured
    c.since = 0;
    c.interval = std::min(2 * c.interval, kLongest);  // reset above if the try changes the choice
    return !best;
  }
  struct Class {
    double rates[2][2] = {{0, 0}, {0, 0}};  // plain, streaming: the last two measured bytes per second
    double rate(int mode) const noexcept { return std::max(rates[mode][0], rates[mode][1]); }
    int last = -1;                    // the mode of the previous call: 0 plain, 1 streaming
    bool best = false;                // the faster at the last call: streaming?
    std::uint64_t since = 0;          // calls since the slower mode was last tried (a try's two included)
    std::uint64_t interval = kFirst;  // how many before the next try
  };
  Class& cls(std::size_t bytes) noexcept { return classes_[static_cast<std::size_t>(std::bit_width(bytes))]; }

  WindowStores mode_;
  std::size_t min_bytes_;
  Class classes_[65]{};  // by bit_width(bytes)
};

}  // namespace detail
}  // namespace ddp
