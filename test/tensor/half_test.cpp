// bfloat16 / float16 conversions against an independent reference: for a float f, the nearest representable
// 16-bit value found by a search over the format's values in double (ties to the even bit pattern), with
// Inf past the largest finite value's half-ulp and NaN kept. Covers every 16-bit pattern (to float and back),
// every float whose low 13 bits are zero plus a stride over all 2^32 floats (rounding of normals, subnormals,
// overflow), and GCC's own _Float16 where the compiler has it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ios>
#include <limits>
#include <vector>

#include "ddp/tensor/half.hpp"

namespace {

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Every finite non-negative value of a 16-bit format, in bit order (= value order), as doubles.
template <class H>
std::vector<double> positive_values() {
  std::vector<double> v;
  for (std::uint32_t b = 0; b < 0x8000u; ++b) {
    float const f = float(H::from_bits(static_cast<std::uint16_t>(b)));
    if (!std::isfinite(f)) break;
    v.push_back(f);
  }
  return v;
}

// The reference rounding of f into H's bits.
template <class H>
std::uint16_t reference(float f, std::vector<double> const& pos) {
  std::uint16_t const sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return 0;  // checked separately
  double const a = std::fabs(double(f));
  double const top = pos.back(), below_top = pos[pos.size() - 2];
  double const overflow = top + (top - below_top) / 2;  // a tie at the top rounds to even: Inf (odd max)
  std::uint16_t const inf = static_cast<std::uint16_t>(pos.size());
  if (a >= overflow) return static_cast<std::uint16_t>(sign | inf);
  auto const it = std::lower_bound(pos.begin(), pos.end(), a);
  std::size_t const hi = static_cast<std::size_t>(it - pos.begin());
  if (hi == pos.size()) return static_cast<std::uint16_t>(sign | (hi - 1));  // above the top, below overflow
  if (hi < pos.size() && pos[hi] == a) return static_cast<std::uint16_t>(sign | hi);
  std::size_t const lo = hi - 1;
  double const dlo = a - pos[lo], dhi = pos[hi] - a;
  std::size_t const pick = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<std::uint16_t>(sign | pick);
}

template <class H>
void check_format() {
  auto const pos = positive_values<H>();
  // Every pattern converts to float and back unchanged (NaNs stay NaN).
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    H const h = H::from_bits(static_cast<std::uint16_t>(b));
    float const f = float(h);
    if (std::isnan(f)) {
      REQUIRE(std::isnan(float(H(f))));
      continue;
    }
    REQUIRE(H(f).bits == b);
  }
  std::size_t checked = 0;
  auto const check = [&](std::uint32_t u) {
    float const f = from_bits(u);
    if (std::isnan(f)) {
      CHECK(std::isnan(float(H(f))));
      return;
    }
    std::uint16_t const want = reference<H>(f, pos);
    if (H(f).bits != want) {
      INFO("float bits 0x" << std::hex << u << " (" << f << ")");
      REQUIRE(H(f).bits == want);
    }
    ++checked;
  };
  for (std::uint64_t u = 0; u < 0x100000000ull; u += 8191) check(static_cast<std::uint32_t>(u));
  // Halfway points and their neighbours around every value of the format (ties are where rounding bugs hide).
  for (std::size_t k = 0; k + 1 < pos.size(); k += 7) {
    float const mid = static_cast<float>((pos[k] + pos[k + 1]) / 2);
    std::uint32_t m;
    std::memcpy(&m, &mid, 4);
    for (std::uint32_t d : {m - 1, m, m + 1}) check(d), check(d | 0x80000000u);
  }
  CHECK(checked > 500000);
}

}  // namespace

TEST_CASE("bfloat16 rounds to nearest even, keeps NaN, overflows to Inf") {
  check_format<ddp::bfloat16>();
  CHECK(float(ddp::bfloat16(1.0f)) == 1.0f);
  CHECK(float(ddp::bfloat16(256.0f)) == 256.0f);
  CHECK(float(ddp::bfloat16(257.0f)) == 256.0f);  // a tie: to the even pattern
  CHECK(std::isinf(float(ddp::bfloat16(std::numeric_limits<float>::max()))));
}

TEST_CASE("float16 rounds to nearest even, subnormals included, overflows to Inf") {
  check_format<ddp::float16>();
  CHECK(float(ddp::float16(65504.0f)) == 65504.0f);
  CHECK(float(ddp::float16(65519.0f)) == 65504.0f);
  CHECK(std::isinf(float(ddp::float16(65520.0f))));
  CHECK(float(ddp::float16(5.9604645e-08f)) == 5.9604645e-08f);  // the smallest subnormal
  CHECK(float(ddp::float16(2.9802322e-08f)) == 0.0f);            // half of it: a tie, to even (zero)
  CHECK(std::signbit(float(ddp::float16(-0.0f))));
}

TEST_CASE("float16's portable bit operations equal the class's conversions (_Float16 where the compiler has it)") {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    float const want = float(ddp::float16::from_bits(static_cast<std::uint16_t>(b)));
    float const got = ddp::detail::float16_expand(static_cast<std::uint16_t>(b));
    if (std::isnan(want)) {
      REQUIRE(std::isnan(got));
      continue;
    }
    std::uint32_t gw, gg;
    std::memcpy(&gw, &want, 4);
    std::memcpy(&gg, &got, 4);
    REQUIRE(gw == gg);
  }
  for (std::uint64_t u = 0; u < 0x100000000ull; u += 1021) {
    float const f = from_bits(static_cast<std::uint32_t>(u));
    if (std::isnan(f)) continue;
    if (ddp::detail::float16_round(f) != ddp::float16(f).bits) {
      INFO("float bits 0x" << std::hex << u);
      REQUIRE(ddp::detail::float16_round(f) == ddp::float16(f).bits);
    }
  }
}

#if defined(__FLT16_MAX__) && !defined(__clang__)
TEST_CASE("float16 agrees with the compiler's _Float16") {
  for (std::uint64_t u = 0; u < 0x100000000ull; u += 4099) {
    float const f = from_bits(static_cast<std::uint32_t>(u));
    _Float16 const g = static_cast<_Float16>(f);
    std::uint16_t gb;
    std::memcpy(&gb, &g, 2);
    if (std::isnan(f)) continue;
    if (ddp::float16(f).bits != gb) {
      INFO("float bits 0x" << std::hex << u);
      REQUIRE(ddp::float16(f).bits == gb);
    }
  }
}
#endif
