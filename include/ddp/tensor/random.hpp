// Generator: a seeded, portable random source (PCG32) so runs reproduce across compilers and platforms.
// std::mt19937 is portable but std::*_distribution are not; every distribution here is defined bit-exactly.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

#include "ddp/config.hpp"

namespace ddp {

namespace detail {
inline constexpr std::uint64_t kPcgMul = 6364136223846793005ULL;

// PCG-XSH-RR's output of state `old`.
DDP_HOST_DEVICE constexpr std::uint32_t pcg_output(std::uint64_t old) noexcept {
  auto xorshifted = static_cast<std::uint32_t>(((old >> 18u) ^ old) >> 27u);
  auto rot = static_cast<std::uint32_t>(old >> 59u);
  return (xorshifted >> rot) | (xorshifted << ((32u - rot) & 31u));
}

// k steps of s <- s * kPcgMul + inc composed into one affine map s <- mult * s + plus, in O(log k) (Brown,
// "Random number generation with arbitrary strides", 1994): what lets element i of a stream be drawn directly.
struct PcgJump {
  std::uint64_t mult = 1, plus = 0;
  DDP_HOST_DEVICE constexpr std::uint64_t operator()(std::uint64_t s) const noexcept { return mult * s + plus; }
};
DDP_HOST_DEVICE constexpr PcgJump pcg_jump(std::uint64_t inc, std::uint64_t k) noexcept {
  PcgJump acc;
  std::uint64_t cur_mult = kPcgMul, cur_plus = inc;
  for (; k > 0; k >>= 1) {
    if (k & 1u) {
      acc.mult *= cur_mult;
      acc.plus = acc.plus * cur_mult + cur_plus;
    }
    cur_plus = (cur_mult + 1) * cur_plus;
    cur_mult *= cur_mult;
  }
  return acc;
}

// splitmix64's finaliser: a bijection with full avalanche, the core of the counter-based draws.
DDP_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// 32 random bits for (seed, step, sample, element): a pure function, the same on every rank and platform.
DDP_HOST_DEVICE constexpr std::uint32_t counter_u32(std::uint64_t seed, std::uint64_t step, std::int64_t sample,
                                                    std::int64_t element) noexcept {
  std::uint64_t const row = mix64(mix64(seed ^ mix64(step)) ^ static_cast<std::uint64_t>(sample));
  return static_cast<std::uint32_t>(mix64(row + static_cast<std::uint64_t>(element)) >> 32);
}
}  // namespace detail

// A Generator's complete state (what PyTorch's get_state()/set_state() carry): restoring it continues the
// sequence bit for bit, normal()'s cached second value included.
struct GeneratorState {
  std::uint64_t state = 0;
  std::uint64_t inc = 1;  // the stream (odd)
  double spare = 0;       // normal()'s second value, valid when has_spare
  bool has_spare = false;
  friend bool operator==(GeneratorState const&, GeneratorState const&) = default;
};

// PCG-XSH-RR 32 (O'Neill 2014): 64-bit state, 32-bit output, independent streams. Not thread-safe: one
// generator per thread/rank. Same seed and stream -> same sequence everywhere.
class Generator {
 public:
  explicit constexpr Generator(std::uint64_t seed = 0x853c49e6748fea9bULL,
                               std::uint64_t stream = 0xda3e39cb94b95bdbULL) noexcept {
    this->seed(seed, stream);
  }
  constexpr void seed(std::uint64_t seed, std::uint64_t stream = 0xda3e39cb94b95bdbULL) noexcept {
    state_ = 0;
    inc_ = (stream << 1u) | 1u;
    next_u32();
    state_ += seed;
    next_u32();
  }
  constexpr GeneratorState state() const noexcept { return {state_, inc_, spare_, has_spare_}; }
  constexpr void set_state(GeneratorState const& s) noexcept {
    state_ = s.state;
    inc_ = s.inc | 1u;
    spare_ = s.spare;
    has_spare_ = s.has_spare;
  }
  // Skips n values: the state after n calls of next_u32(), in O(log n).
  constexpr void advance(std::uint64_t n) noexcept { state_ = detail::pcg_jump(inc_, n)(state_); }
  constexpr std::uint32_t next_u32() noexcept {
    std::uint64_t old = state_;
    state_ = old * kMul + inc_;
    return output(old);
  }
  // out[0, n) = the next n values of next_u32(), bit for bit, computed 8 at a time: lane j steps its own
  // copy of the state 8 positions ahead (s ← s·a⁸ + c₈), so the multiplies no longer wait on each other.
  constexpr void fill_u32(std::uint32_t* out, std::int64_t n) noexcept {
    constexpr int kLanes = 8;
    // Whole blocks of kLanes on the lanes, the rest one by one. `full` bounds both loops explicitly: with a
    // tail loop that starts where the block loop stopped, GCC 12 cannot bound the tail and warns
    // (-Waggressive-loop-optimizations) wherever a call with a constant n is inlined.
    std::int64_t const full = n >= 2 * kLanes ? n - n % kLanes : 0;
    if (full > 0) {
      std::uint64_t a8 = 1, c8 = 0;  // 8 steps of s ← s·a + inc, composed
      for (int k = 0; k < kLanes; ++k) c8 = c8 * kMul + inc_, a8 *= kMul;
      std::uint64_t s[kLanes];
      for (int j = 0; j < kLanes; ++j) s[j] = state_, state_ = state_ * kMul + inc_;
      for (std::int64_t i = 0; i < full; i += kLanes)
        for (int j = 0; j < kLanes; ++j) {
          out[i + j] = output(s[j]);
          s[j] = s[j] * a8 + c8;
        }
      state_ = s[0];  // the state after `full` values
    }
    for (std::int64_t i = full; i < n; ++i) out[i] = next_u32();
  }
  constexpr std::uint64_t next_u64() noexcept {
    std::uint64_t hi = next_u32();
    return (hi << 32) | next_u32();
  }
  // Uniform in [0, 1) with 24 random bits (exactly representable in float).
  constexpr float uniform_float() noexcept { return static_cast<float>(next_u32() >> 8) * 0x1.0p-24f; }
  // Uniform in [0, 1) with 53 random bits.
  constexpr double uniform_double() noexcept { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform in [lo, hi).
  template <class T>
  constexpr T uniform(T lo, T hi) noexcept {
    if constexpr (sizeof(T) <= 4)
      return lo + (hi - lo) * static_cast<T>(uniform_float());
    else
      return lo + (hi - lo) * static_cast<T>(uniform_double());
  }
  // Uniform integer in [0, bound), unbiased (Lemire's method with rejection).
  constexpr std::uint32_t below(std::uint32_t bound) noexcept {
    if (bound <= 1) return 0;
    std::uint64_t m = std::uint64_t(next_u32()) * bound;
    auto low = static_cast<std::uint32_t>(m);
    if (low < bound) {
      std::uint32_t threshold = (0u - bound) % bound;
      while (low < threshold) {
        m = std::uint64_t(next_u32()) * bound;
        low = static_cast<std::uint32_t>(m);
      }
    }
    return static_cast<std::uint32_t>(m >> 32);
  }
  // Standard normal (Box-Muller, both values from 53-bit uniforms; portable given IEEE log/cos/sqrt).
  double normal() noexcept {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = 1.0 - uniform_double();  // (0, 1]
    double u2 = uniform_double();
    double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * std::numbers::pi * u2);
    has_spare_ = true;
    return r * std::cos(2.0 * std::numbers::pi * u2);
  }

  // Fisher-Yates shuffle with this generator (portable, unlike std::shuffle).
  template <class RandomIt>
  constexpr void shuffle(RandomIt first, RandomIt last) noexcept {
    auto n = static_cast<std::uint32_t>(last - first);
    for (std::uint32_t i = n; i > 1; --i) {
      std::uint32_t j = below(i);
      auto tmp = first[i - 1];
      first[i - 1] = first[j];
      first[j] = tmp;
    }
  }

 private:
  static constexpr std::uint64_t kMul = detail::kPcgMul;
  static constexpr std::uint32_t output(std::uint64_t old) noexcept { return detail::pcg_output(old); }
  std::uint64_t state_ = 0;
  std::uint64_t inc_ = 1;
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace ddp
