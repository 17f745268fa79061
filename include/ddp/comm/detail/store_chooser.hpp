// Which stores NodeAllReduce writes its shared window with, per rank: plain or streaming (non-temporal). The
// faster one depends on where the ranks' cores are: sharing a cache, plain stores hand lines over through it;
// in other cache domains every plain store first fetches back the line a peer read (bench/RESULTS.md: on this
// project's VM the hypervisor moves between the two every few minutes, and the wrong choice costs 1.3x one way
// and 4x the other). The choice changes only how bytes get into the window, never the bytes, so every rank may
// decide for itself: kAdaptive keeps each mode's last measured rate per size class (a power of two: in-cache and
// out-of-cache sizes differ) and takes the faster. To follow a change it tries the slower one again after
// kExplore calls of that class when the two are close, and more rarely the further apart they are: after
// kExplore * ceil(r^2) calls for a rate ratio r (at most kExplore * kMaxBackoff). The time lost to exploring is
// then at most (r - 1) / (kExplore r^2) <= 1 / (4 kExplore) of the calls' time: 3%, where a fixed interval
// would lose (r - 1) / kExplore (50% for in-place all-reduces in the shared-cache mode, where streaming stores
// run at a fifth of plain ones). A change that slows the chosen mode shows at once, since its rate is measured
// on every call.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace ddp {

enum class WindowStores { kAdaptive, kStreaming, kPlain };

namespace detail {

class StoreChooser {
 public:
  static constexpr std::uint64_t kExplore = 8;
  static constexpr std::uint64_t kMaxBackoff = 64;

  StoreChooser(WindowStores mode, std::size_t min_bytes) noexcept : mode_(mode), min_bytes_(min_bytes) {}

  // Whether an all-reduce of `bytes` streams.
  bool stream(std::size_t bytes) noexcept {
    if (bytes < min_bytes_ || mode_ == WindowStores::kPlain) return false;
    if (mode_ == WindowStores::kStreaming) return true;
    Class& c = cls(bytes);
    if (c.rate[0] == 0) return false;  // measure each mode once first
    if (c.rate[1] == 0) return true;
    bool const best = c.rate[1] > c.rate[0];
    double const r = c.rate[best ? 1 : 0] / c.rate[best ? 0 : 1];
    double const backoff = std::min(static_cast<double>(kMaxBackoff), std::ceil(r * r));
    if (static_cast<double>(++c.since) < static_cast<double>(kExplore) * backoff) return best;
    c.since = 0;
    return !best;
  }
  // The rate (bytes per second) an all-reduce of `bytes` that streamed (or not) reached.
  void record(bool streamed, std::size_t bytes, double seconds) noexcept {
    if (mode_ != WindowStores::kAdaptive || bytes < min_bytes_ || seconds <= 0) return;
    cls(bytes).rate[streamed ? 1 : 0] = static_cast<double>(bytes) / seconds;
  }
  double rate(bool streamed, std::size_t bytes) const noexcept {
    return classes_[static_cast<std::size_t>(std::bit_width(bytes))].rate[streamed ? 1 : 0];
  }

 private:
  struct Class {
    std::uint64_t since = 0;  // calls since the slower mode was last tried
    double rate[2] = {0, 0};  // plain, streaming: the last measured bytes per second
  };
  Class& cls(std::size_t bytes) noexcept { return classes_[static_cast<std::size_t>(std::bit_width(bytes))]; }

  WindowStores mode_;
  std::size_t min_bytes_;
  Class classes_[65]{};  // by bit_width(bytes)
};

}  // namespace detail
}  // namespace ddp
