// Kernels<Space>: the math primitives the autograd, layers and optimizers call, one implementation per
// memory space. Ops are written once over Space; a new space plugs in by specialising Kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "ddp/config.hpp"
#include "ddp/tensor/memory_space.hpp"

namespace ddp {

// Primary template: a space without kernels is a compile error that says what to include.
template <MemorySpace S>
struct Kernels {
  static_assert(sizeof(S) == 0,
                "no kernels for this memory space: HostSpace kernels come with <ddp/ddp.hpp>; DeviceSpace kernels "
                "need <ddp/tensor/device.hpp> and the //:ddp_device_cpu target (g++, Thrust's CPU system) or nvcc "
                "(tools/cuda.bzl, Thrust's CUDA system)");
};

// Transpose flags for gemm, spelled out rather than bools.
enum class Trans { kNo, kYes };

// How a convolution is computed on the host. kAuto: Winograd F(4×4, 3×3) for 3×3 stride-1 layers with at
// least 8 input and 8 output channels (4× fewer multiply-adds), im2col + GEMM otherwise. kIm2col: always the
// plain product. kWinograd: Winograd; only 3×3 kernels with stride 1.
enum class ConvAlgorithm { kAuto, kIm2col, kWinograd };

// What a convolution applies to its output before writing it: the one spelling of a fused epilogue, for the op
// (Conv2dArgs::epilogue), the kernels (ConvGeometry::epilogue) and the layers' fusion rule
// (nn::detail::fusion_rule, shared by Sequential and AnySequential).
enum class Epilogue : std::uint8_t {
  kNone,          // y = conv(x) + b
  kRelu,          // y = max(0, conv(x) + b); the backward masks gy by y > 0
  kReluMaxPool2,  // y = the 2×2, stride-2 max-pool of max(0, conv(x) + b): (OH/2 × OW/2)
};

// Which GELU: the exact x·Φ(x) (erf), or the tanh approximation 0.5·x·(1 + tanh(√(2/π)(x + 0.044715·x³))).
enum class GeluApprox : std::uint8_t { kErf, kTanh };

// What a softmax over attention scores hides: nothing, or (kCausal) each query's later keys.
enum class SoftmaxMask : std::uint8_t { kNone, kCausal };

// A tensor seen as (pre, di, mid, dj, post), whose axes of sizes di and dj are to be swapped (Kernels::swap_axes).
struct AxisSwap {
  std::int64_t pre = 1, di = 1, mid = 1, dj = 1, post = 1;
};

// The constants GELU needs, in double (each kernel converts them to its element type).
inline constexpr double kInvSqrt2 = 0.70710678118654752440;     // 1/√2
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1/√(2π)
inline constexpr double kSqrt2OverPi = 0.79788456080286535588;  // √(2/π)

// Geometry of a square-kernel 2-D convolution or pooling window over NCHW input.
struct ConvGeometry {
  std::int64_t N = 0, C = 0, H = 0, W = 0;  // input
  std::int64_t O = 0;                       // output channels (conv) or C (pool)
  std::int64_t k = 1, stride = 1, pad = 0;
  ConvAlgorithm algorithm = ConvAlgorithm::kAuto;  // convolutions only
  Epilogue epilogue = Epilogue::kNone;             // convolutions only
  DDP_HOST_DEVICE constexpr bool relu() const noexcept { return epilogue != Epilogue::kNone; }
  DDP_HOST_DEVICE constexpr bool pool2() const noexcept { return epilogue == Epilogue::kReluMaxPool2; }
  DDP_HOST_DEVICE constexpr std::int64_t OH() const noexcept { return (H + 2 * pad - k) / stride + 1; }
  DDP_HOST_DEVICE constexpr std::int64_t OW() const noexcept { return (W + 2 * pad - k) / stride + 1; }
  DDP_HOST_DEVICE constexpr std::int64_t L() const noexcept { return OH() * OW(); }
  DDP_HOST_DEVICE constexpr std::int64_t patch() const noexcept { return C * k * k; }
};

}  // namespace ddp

#include "ddp/tensor/tensor.hpp"

namespace ddp {
// A copy of a tensor in space To: host to any space, any space to host (the same tensor when the spaces are
// equal). Synchronous.
template <MemorySpace To, class T, MemorySpace From>
Tensor<T, To> to_space(Tensor<T, From> const& t) {
  if constexpr (std::same_as<To, From>) {
    return t;
  } else {
    static_assert(std::same_as<From, HostSpace> || std::same_as<To, HostSpace>,
                  "to_space copies between host memory and another space");
    Tensor<T, To> d(t.shape());
    if constexpr (std::same_as<From, HostSpace>)
      Kernels<To>::from_host(t.numel(), t.data(), d.data());
    else
      Kernels<From>::to_host(t.numel(), t.data(), d.data());
    return d;
  }
}

// A copy of a host tensor in space To that the host does not wait for (Kernels<To>::from_host_async): work queued
// on the device afterwards sees it, and `t` may change at once. The same tensor when To is the host.
template <MemorySpace To, class T>
Tensor<T, To> to_space_async(Tensor<T, HostSpace> const& t) {
  if constexpr (std::same_as<To, HostSpace>) {
    return t;
  } else {
    Tensor<T, To> d(t.shape());
    Kernels<To>::from_host_async(t.numel(), t.data(), d.data());
    return d;
  }
}

namespace detail {
// Whether n elements hold no NaN or Inf. One vectorised sum first (finite exactly when every element is, bar
// an overflow of huge finite values); only a non-finite sum pays for the element-by-element look (on the host:
// a device slice is copied there). Exact either way.
template <class T, MemorySpace S>
bool all_finite(std::int64_t n, T const* x) {
  if (n == 0 || std::isfinite(double(Kernels<S>::sum(n, x)))) return true;
  std::vector<T> host(static_cast<std::size_t>(n));
  Kernels<S>::to_host(n, x, host.data());
  for (T v : host)
    if (!std::isfinite(v)) return false;
  return true;
}
}  // namespace detail

}  // namespace ddp
