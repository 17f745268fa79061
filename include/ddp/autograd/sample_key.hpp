// SampleKeyScope: counter-based randomness for deterministic training. While a scope is active on a thread,
// dropout (and any op that asks current_sample_key()) draws each element's randomness from (its own seed,
// the step, the global index of the sample, the element's index within the sample) instead of a generator's
// stream, so a sample's mask does not depend on which rank, micro-batch or position processes it.
#pragma once

#include <cstdint>
#include <optional>

#include "ddp/tensor/random.hpp"  // detail::counter_u32, mix64

namespace ddp {

// The global identity of the first row of the batch being computed: rows are samples first_sample,
// first_sample + 1, ... of step `step`.
struct SampleKey {
  std::uint64_t step = 0;
  std::int64_t first_sample = 0;
};

namespace detail {
inline std::optional<SampleKey>& sample_key_slot() noexcept {
  thread_local std::optional<SampleKey> key;
  return key;
}

}  // namespace detail

// The key in effect on this thread, if any.
inline std::optional<SampleKey> current_sample_key() noexcept { return detail::sample_key_slot(); }

// Sets the key for this thread until destroyed (scopes nest: the previous key comes back).
class SampleKeyScope {
 public:
  explicit SampleKeyScope(SampleKey key) noexcept : previous_(detail::sample_key_slot()) {
    detail::sample_key_slot() = key;
  }
  SampleKeyScope(SampleKeyScope const&) = delete;
  SampleKeyScope& operator=(SampleKeyScope const&) = delete;
  ~SampleKeyScope() { detail::sample_key_slot() = previous_; }

 private:
  std::optional<SampleKey> previous_;
};

}  // namespace ddp
