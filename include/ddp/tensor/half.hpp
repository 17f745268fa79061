// bfloat16 and float16: 16-bit floating-point storage types for the narrow paths (compressed gradient buckets,
// later mixed precision). Each holds its IEEE bits; converting from float rounds to nearest, ties to even, as
// PyTorch's and CUDA's conversions do (NaN stays NaN, float16 overflows to Inf); converting to float is exact.
// No arithmetic of their own: compute in float and round once, which is what every kernel here does. Host and
// device (the same bit operations; no <cuda_fp16.h> needed).
#pragma once

#include <concepts>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "ddp/config.hpp"

namespace ddp {
namespace detail {
// std::bit_cast is not callable from CUDA device code without --expt-relaxed-constexpr; memcpy is.
DDP_HOST_DEVICE inline std::uint32_t float_bits(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
DDP_HOST_DEVICE inline float bits_float(std::uint32_t u) noexcept {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace detail

struct bfloat16 {
  std::uint16_t bits = 0;

  bfloat16() = default;
  DDP_HOST_DEVICE explicit bfloat16(float f) noexcept : bits(round(f)) {}
  DDP_HOST_DEVICE operator float() const noexcept { return detail::bits_float(std::uint32_t(bits) << 16); }
  DDP_HOST_DEVICE static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h;
    h.bits = b;
    return h;
  }
  static constexpr std::string_view name = "bfloat16";
  // Integers up to this magnitude are exact.
  static constexpr int exact_integers = 256;

 private:
  DDP_HOST_DEVICE static std::uint16_t round(float f) noexcept {
    std::uint32_t const u = detail::float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
    return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // overflow rounds to Inf
  }
};

namespace detail {
// float16 conversions in portable bit operations (CUDA device code, compilers without _Float16).
DDP_HOST_DEVICE inline std::uint16_t float16_round(float f) noexcept {
  std::uint32_t const u = float_bits(f);
  std::uint32_t const sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to Inf
  if (a >= 0x38800000u)                                                     // normal: rebias 127 -> 15
    return static_cast<std::uint16_t>(sign | ((a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13));
  // Subnormal or zero: adding 0.5f aligns the result's last bit with float's, and the float add rounds to
  // nearest even.
  float const s = bits_float(a) + 0.5f;
  return static_cast<std::uint16_t>(sign | (float_bits(s) - 0x3f000000u));
}
DDP_HOST_DEVICE inline float float16_expand(std::uint16_t h) noexcept {
  std::uint32_t const sign = std::uint32_t(h & 0x8000u) << 16;
  std::uint32_t const exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));  // Inf, NaN
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  float const sub = static_cast<float>(mant) * 5.9604644775390625e-08f;  // mant * 2^-24, exact
  return bits_float(sign | float_bits(sub));
}
}  // namespace detail

// Where the compiler has _Float16 (DDP_HAS_FLOAT16_TYPE) the conversions use it: on x86-64 GCC converts with F16C
// instructions, vectorised in the cast loops, several times faster than the bit operations and the same bits
// (test/tensor/half_test.cpp checks both against a reference).
struct float16 {
  std::uint16_t bits = 0;

  float16() = default;
  DDP_HOST_DEVICE explicit float16(float f) noexcept {
#if DDP_HAS_FLOAT16_TYPE
    _Float16 const h = static_cast<_Float16>(f);
    std::memcpy(&bits, &h, sizeof bits);
#else
    bits = detail::float16_round(f);
#endif
  }
  DDP_HOST_DEVICE operator float() const noexcept {
#if DDP_HAS_FLOAT16_TYPE
    _Float16 h;
    std::memcpy(&h, &bits, sizeof h);
    return static_cast<float>(h);
#else
    return detail::float16_expand(bits);
#endif
  }
  DDP_HOST_DEVICE static constexpr float16 from_bits(std::uint16_t b) noexcept {
    float16 h;
    h.bits = b;
    return h;
  }
  static constexpr std::string_view name = "float16";
  static constexpr int exact_integers = 2048;
  static constexpr float max = 65504.0f;
};

template <class T>
concept HalfFloat = std::same_as<T, bfloat16> || std::same_as<T, float16>;

}  // namespace ddp
