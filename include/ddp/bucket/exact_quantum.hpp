// The fixed-point arithmetic of deterministic mode's exact sums: a shared exponent e per tensor (the largest
// |value| over every term is below 2^e), each value rounded once to an int64 multiple of 2^(e - bits), and integer
// sums, which no order of addition, rank count or all-reduce algorithm changes. ExactReducer (the ExactSum policy's
// gradient sums) and the virtual replicas' averages (parallel/exact_average.hpp) both use it. Method and guarantee:
// docs/deterministic.md.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace ddp::detail {

// The exponent of the smallest quantum used for an all-zero tensor (keeps 2^shift finite in double).
inline constexpr std::int64_t kExactFloorExponent = -200;

// Bits below the shared exponent when `terms` values are summed: |q| <= 2^bits each, so terms * 2^bits <= 2^62.
inline int exact_bits(std::int64_t terms) noexcept {
  return 62 - static_cast<int>(std::bit_width(static_cast<std::uint64_t>(std::max<std::int64_t>(terms, 1) - 1)));
}

// The largest magnitude of x[0, n), as the exponent e with max |x| < 2^e (at least kExactFloorExponent), and whether
// every value is finite. Found on the bit patterns (IEEE magnitudes order like unsigned integers, and NaN and Inf
// sit above every finite value): one vectorised integer max.
struct ExactMagnitude {
  std::int64_t exponent = kExactFloorExponent;
  bool finite = true;
};
template <class T>
ExactMagnitude exact_magnitude(T const* x, std::int64_t n) noexcept {
  static_assert(std::is_floating_point_v<T> && (sizeof(T) == 4 || sizeof(T) == 8));
  using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  constexpr Bits kMagnitude = ~Bits(0) >> 1;
  constexpr Bits kInfinity = std::bit_cast<Bits>(std::numeric_limits<T>::infinity());
  Bits top = 0;
  for (std::int64_t i = 0; i < n; ++i) top = std::max(top, std::bit_cast<Bits>(x[i]) & kMagnitude);
  ExactMagnitude m{.finite = top < kInfinity};
  int exp = static_cast<int>(kExactFloorExponent);
  if (m.finite && top != 0) std::frexp(static_cast<double>(std::bit_cast<T>(top)), &exp);  // max < 2^exp
  m.exponent = std::max<std::int64_t>(exp, kExactFloorExponent);
  return m;
}

// Round to nearest (ties away from zero), branch-free so the loops vectorise. g * scale is exact (scale is a power
// of two, far from overflow); adding ±0.5 is exact below 2^52 for T's significand, and above it the value is
// already an integer that the addition leaves unchanged.
template <class T>
std::int64_t exact_quantize(T g, double scale) noexcept {
  double const x = static_cast<double>(g) * scale;
  return static_cast<std::int64_t>(x + std::copysign(0.5, x));
}

}  // namespace ddp::detail
