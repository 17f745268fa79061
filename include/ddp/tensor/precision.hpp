// Mixed precision on device tensors: what the operands of a device GEMM or convolution are rounded to. Products
// of the rounded operands are exact in float and they accumulate in float, so a GEMM in bf16 here is what a
// tensor core computes from bf16 inputs with float accumulation. Master weights, activations, gradients and
// optimizer state stay float: only the multiplications' operands round.
//   kFp32  none (the default; cuBLAS in pedantic float)
//   kTf32  10 mantissa bits, as NVIDIA's tensor cores take float in TF32 mode
//   kBf16  bfloat16: 8 mantissa bits, float's range
//   kFp16  float16: 11 mantissa bits, overflow past 65504: train with optim::GradScaler (dynamic loss scaling)
// Chosen per host thread within a scope, as torch.autocast:
//   { ddp::autocast guard(ddp::Precision::kBf16); loss = cross_entropy(model(x), y); backward(loss); }
// On CUDA, GEMMs run on tensor cores (cublasGemmEx with 16-bit inputs, TF32 math mode); convolutions round their
// operands and run in float (numerically the same; not yet faster). On Thrust's CPU systems every one rounds its
// operands and runs the float kernel: CI checks the logic there. Host tensors compute in float only:
// basic_autocast<HostSpace> is a compile error that says so.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>

#include "ddp/config.hpp"
#include "ddp/error.hpp"
#include "ddp/tensor/half.hpp"
#include "ddp/tensor/memory_space.hpp"

namespace ddp {

enum class Precision : std::int32_t { kFp32, kTf32, kBf16, kFp16 };

inline std::string_view name(Precision p) noexcept {
  switch (p) {
    case Precision::kTf32:
      return "tf32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
    default:
      return "fp32";
  }
}

// "fp32", "tf32", "bf16" or "fp16"; anything else is an ArgumentError naming the value.
inline Precision parse_precision(std::string_view s) {
  for (Precision p : {Precision::kFp32, Precision::kTf32, Precision::kBf16, Precision::kFp16})
    if (s == name(p)) return p;
  throw ArgumentError(detail::cat("precision '", s, "' is not one of fp32, tf32, bf16, fp16"));
}

// x rounded to the nearest value of precision p (ties to even; NaN stays NaN; fp16 overflows to infinity).
DDP_HOST_DEVICE inline float round_to(Precision p, float x) noexcept {
  switch (p) {
    case Precision::kTf32: {
      std::uint32_t const u = detail::float_bits(x);
      if ((u & 0x7f800000u) == 0x7f800000u) return x;  // Inf and NaN as they are
      std::uint32_t const rounded = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
      return detail::bits_float(rounded);
    }
    case Precision::kBf16:
      return float(bfloat16(x));
    case Precision::kFp16:
      return float(float16(x));
    default:
      return x;
  }
}

namespace detail {
inline Precision& matmul_precision_here() noexcept {
  thread_local Precision p = Precision::kFp32;
  return p;
}
}  // namespace detail

// This thread's precision for device GEMMs and convolutions (kFp32 outside any autocast scope).
inline Precision matmul_precision() noexcept { return detail::matmul_precision_here(); }

// Sets this thread's precision for device GEMMs and convolutions until the end of the scope (then the previous
// one again). Scopes nest. Only device tensors have a choice.
template <MemorySpace S>
class basic_autocast {
  static_assert(!std::same_as<S, HostSpace>,
                "ddp::basic_autocast<HostSpace>: host tensors compute in float only (Eigen); mixed precision is for "
                "device tensors: use ddp::autocast (basic_autocast<DeviceSpace>) with Variable<float, DeviceSpace>");

 public:
  explicit basic_autocast(Precision p) noexcept : previous_(detail::matmul_precision_here()) {
    detail::matmul_precision_here() = p;
  }
  ~basic_autocast() { detail::matmul_precision_here() = previous_; }
  basic_autocast(basic_autocast const&) = delete;
  basic_autocast& operator=(basic_autocast const&) = delete;

 private:
  Precision previous_;
};

using autocast = basic_autocast<DeviceSpace>;

}  // namespace ddp
