// Device convolution: cuDNN on Thrust's CUDA system (deterministic algorithms chosen per geometry by cuDNN's
// heuristics, no TF32); on the CPU device systems the host convolution itself (Winograd F(4×4, 3×3) or im2col +
// Eigen, fused pooling included).
#pragma once

#include <concepts>
#include <cstdint>

#include "ddp/config.hpp"
#include "ddp/tensor/device_blas.hpp"  // rounded_copy
#include "ddp/tensor/device_system.hpp"
#include "ddp/tensor/host_conv_kernels.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/tensor/precision.hpp"

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#include <cudnn.h>

#include <array>
#include <map>
#include <memory>

#include "ddp/tensor/device_allocator.hpp"
#include "ddp/tensor/device_buffer.hpp"  // CudaError
#include "ddp/tensor/device_elementwise.hpp"
#endif

namespace ddp {

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
namespace detail {
inline void cudnn_check(cudnnStatus_t rc, char const* call) {
  if (rc != CUDNN_STATUS_SUCCESS) throw CudaError(cat("cuDNN: ", call, " failed: ", cudnnGetErrorString(rc)));
}
// One cuDNN handle per host thread, on the legacy default stream like every other device kernel.
inline cudnnHandle_t cudnn_handle() {
  struct Handle {
    cudnnHandle_t h = nullptr;
    Handle() {
      cudnn_check(cudnnCreate(&h), "cudnnCreate");
      cudnn_check(cudnnSetStream(h, cudaStream_t{}), "cudnnSetStream");
    }
    ~Handle() {
      if (h) cudnnDestroy(h);
    }
  };
  thread_local Handle handle;
  return handle.h;
}

// The descriptors of one convolution geometry (NCHW input, OCkk filter, cross-correlation) and the algorithms
// chosen for it, RAII. Algorithms: with ConvAlgorithm::kIm2col the fixed GEMM-based ones (IMPLICIT_GEMM forward,
// ALGO_1 backward); otherwise the first that cuDNN's heuristics rank for this geometry among the deterministic,
// non-tensor-op (no TF32) ones whose workspace fits kMaxWorkspace. The heuristics time nothing, so the choice
// depends only on the GPU, the cuDNN version and the geometry: a run reproduces bitwise on the same GPU and
// sizes, as with fixed algorithms (ALGO_1 for the filter gradient took half the GPU time of the main job's CNN
// at batch 256 on an H100; bench/RESULTS.md).
template <class T>
class CudnnConv {
 public:
  static constexpr cudnnDataType_t kType = sizeof(T) == 4 ? CUDNN_DATA_FLOAT : CUDNN_DATA_DOUBLE;
  static constexpr std::size_t kMaxWorkspace = std::size_t{256} << 20;

  explicit CudnnConv(ConvGeometry const& g) {
    auto i = [](std::int64_t v) { return static_cast<int>(v); };
    cudnn_check(cudnnCreateTensorDescriptor(&x), "cudnnCreateTensorDescriptor");
    cudnn_check(cudnnCreateTensorDescriptor(&y), "cudnnCreateTensorDescriptor");
    cudnn_check(cudnnCreateFilterDescriptor(&w), "cudnnCreateFilterDescriptor");
    cudnn_check(cudnnCreateConvolutionDescriptor(&conv), "cudnnCreateConvolutionDescriptor");
    cudnn_check(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, kType, i(g.N), i(g.C), i(g.H), i(g.W)),
                "cudnnSetTensor4dDescriptor (x)");
    cudnn_check(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, kType, i(g.N), i(g.O), i(g.OH()), i(g.OW())),
                "cudnnSetTensor4dDescriptor (y)");
    cudnn_check(cudnnSetFilter4dDescriptor(w, kType, CUDNN_TENSOR_NCHW, i(g.O), i(g.C), i(g.k), i(g.k)),
                "cudnnSetFilter4dDescriptor");
    cudnn_check(cudnnSetConvolution2dDescriptor(conv, i(g.pad), i(g.pad), i(g.stride), i(g.stride), 1, 1,
                                                CUDNN_CROSS_CORRELATION, kType),
                "cudnnSetConvolution2dDescriptor");
    cudnn_check(cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH), "cudnnSetConvolutionMathType");
    if (g.algorithm != ConvAlgorithm::kIm2col) choose(cudnn_handle());
  }
  ~CudnnConv() {
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
  CudnnConv(CudnnConv const&) = delete;
  CudnnConv& operator=(CudnnConv const&) = delete;

  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  cudnnConvolutionBwdDataAlgo_t bwd_data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;

 private:
  template <class Perf>
  static bool usable(Perf const& p) noexcept {
    return p.status == CUDNN_STATUS_SUCCESS && p.determinism == CUDNN_DETERMINISTIC && p.memory <= kMaxWorkspace &&
           p.mathType != CUDNN_TENSOR_OP_MATH && p.mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
  }
  // The heuristics' first usable entry replaces the fixed default (kept when none is usable).
  template <class Perf, class Algo>
  static void first_usable(Perf const* perf, int n, Algo& algo) noexcept {
    for (int k = 0; k < n; ++k)
      if (usable(perf[k])) {
        algo = perf[k].algo;
        return;
      }
  }
  void choose(cudnnHandle_t h) {
    int n = 0;
    cudnnConvolutionFwdAlgoPerf_t pf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    cudnn_check(cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, conv, y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, pf),
                "cudnnGetConvolutionForwardAlgorithm_v7");
    first_usable(pf, n, fwd);
    cudnnConvolutionBwdDataAlgoPerf_t pd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    cudnn_check(
        cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w, y, conv, x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, pd),
        "cudnnGetConvolutionBackwardDataAlgorithm_v7");
    first_usable(pd, n, bwd_data);
    cudnnConvolutionBwdFilterAlgoPerf_t pw[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    cudnn_check(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x, y, conv, w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                                                              &n, pw),
                "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
    first_usable(pw, n, bwd_filter);
  }
};

// The CudnnConv of a geometry, made once per host thread (descriptors and the heuristics' choice are host work
// that a small step would otherwise repeat every call). At most kMaxEntries geometries are kept; past that the
// cache starts over.
template <class T>
CudnnConv<T> const& cudnn_conv(ConvGeometry const& g) {
  using Key = std::array<std::int64_t, 9>;
  constexpr std::size_t kMaxEntries = 64;
  thread_local std::map<Key, std::unique_ptr<CudnnConv<T>>> cache;
  Key const key{g.N, g.C, g.H, g.W, g.O, g.k, g.stride, g.pad, static_cast<std::int64_t>(g.algorithm)};
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  if (cache.size() >= kMaxEntries) cache.clear();
  return *cache.emplace(key, std::make_unique<CudnnConv<T>>(g)).first->second;
}
}  // namespace detail
#endif

// Part of Kernels<DeviceSpace>; contracts as HostConvKernels' conv2d_fwd / conv2d_bwd / fuses_pool2.
struct DeviceConvKernels {
  using i64 = std::int64_t;

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
  // cuDNN pools in a separate op: the conv2d op composes conv2d+relu and max_pool2d instead.
  static bool fuses_pool2(ConvGeometry const&) noexcept { return false; }

  // y = conv(x, w) + bias, then max(0, y) when g.relu().
  template <class T>
  static void conv2d_fwd_in_float(ConvGeometry const& g, T const* x, T const* w, T const* bias, T* y,
                                  std::uint8_t* codes = nullptr) {
    (void)codes;
    DDP_ASSERT(!g.pool2(), "conv2d_fwd: fused pooling is not available on CUDA (fuses_pool2 is false)");
    auto const& d = detail::cudnn_conv<T>(g);
    cudnnHandle_t const h = detail::cudnn_handle();
    std::size_t bytes = 0;
    detail::cudnn_check(cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, d.fwd, &bytes),
                        "cudnnGetConvolutionForwardWorkspaceSize");
    detail::DeviceScratch<std::uint8_t> ws(static_cast<i64>(bytes));
    T const one = 1, zero = 0;
    detail::cudnn_check(
        cudnnConvolutionForward(h, &one, d.x, x, d.w, w, d.conv, d.fwd, ws.data(), bytes, &zero, d.y, y),
        "cudnnConvolutionForward");
    if (bias) DeviceElementwiseKernels::add_channel_broadcast(g.N, g.O, g.L(), bias, y);
    if (g.relu()) DeviceElementwiseKernels::relu_fwd(g.N * g.O * g.L(), y, y);
  }

  // Null outputs are skipped; beta 0 overwrites (never reads), 1 accumulates. With g.relu(), gy is masked by y > 0.
  template <class T>
  static void conv2d_bwd_in_float(ConvGeometry const& g, T const* x, T const* w, T const* y, T const* gy, T beta_x,
                                  T* gx, T beta_w, T* gw, T beta_b, T* gb, std::uint8_t const* codes = nullptr) {
    (void)codes;
    DDP_ASSERT(!g.pool2(), "conv2d_bwd: fused pooling is not available on CUDA (fuses_pool2 is false)");
    i64 const ny = g.N * g.O * g.L();
    detail::DeviceScratch<T> masked(g.relu() ? ny : 0);
    if (g.relu()) {
      DeviceElementwiseKernels::relu_bwd(ny, y, gy, T(0), masked.data());
      gy = masked.data();
    }
    auto const& d = detail::cudnn_conv<T>(g);
    cudnnHandle_t const h = detail::cudnn_handle();
    T const one = 1;
    if (gw) {
      std::size_t bytes = 0;
      detail::cudnn_check(
          cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, d.bwd_filter, &bytes),
          "cudnnGetConvolutionBackwardFilterWorkspaceSize");
      detail::DeviceScratch<std::uint8_t> ws(static_cast<i64>(bytes));
      detail::cudnn_check(cudnnConvolutionBackwardFilter(h, &one, d.x, x, d.y, gy, d.conv, d.bwd_filter, ws.data(),
                                                         bytes, &beta_w, d.w, gw),
                          "cudnnConvolutionBackwardFilter");
    }
    if (gb) DeviceElementwiseKernels::sum_channels(g.N, g.O, g.L(), gy, beta_b, gb);
    if (gx) {
      std::size_t bytes = 0;
      detail::cudnn_check(cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, d.bwd_data, &bytes),
                          "cudnnGetConvolutionBackwardDataWorkspaceSize");
      detail::DeviceScratch<std::uint8_t> ws(static_cast<i64>(bytes));
      detail::cudnn_check(cudnnConvolutionBackwardData(h, &one, d.w, w, d.y, gy, d.conv, d.bwd_data, ws.data(), bytes,
                                                       &beta_x, d.x, gx),
                          "cudnnConvolutionBackwardData");
    }
  }
#else
  // Host-accessible memory: the host convolution runs on it directly (same algorithms, same results).
  static bool fuses_pool2(ConvGeometry const& g) noexcept { return HostConvKernels::fuses_pool2(g); }
  template <class T>
  static void conv2d_fwd_in_float(ConvGeometry const& g, T const* x, T const* w, T const* bias, T* y,
                                  std::uint8_t* codes = nullptr) {
    HostConvKernels::conv2d_fwd(g, x, w, bias, y, codes);
  }
  template <class T>
  static void conv2d_bwd_in_float(ConvGeometry const& g, T const* x, T const* w, T const* y, T const* gy, T beta_x,
                                  T* gx, T beta_w, T* gw, T beta_b, T* gb, std::uint8_t const* codes = nullptr) {
    HostConvKernels::conv2d_bwd(g, x, w, y, gy, beta_x, gx, beta_w, gw, beta_b, gb, codes);
  }
#endif

 public:
  // y = conv(x, w) + bias (then the epilogue), with x and w in this thread's precision (precision.hpp).
  template <class T>
  static void conv2d_fwd(ConvGeometry const& g, T const* x, T const* w, T const* bias, T* y,
                         std::uint8_t* codes = nullptr) {
    if constexpr (std::same_as<T, float>) {
      if (Precision const p = matmul_precision(); p != Precision::kFp32) {
        auto const xr = detail::rounded_copy(p, g.N * g.C * g.H * g.W, x);
        auto const wr = detail::rounded_copy(p, g.O * g.patch(), w);
        conv2d_fwd_in_float(g, xr.data(), wr.data(), bias, y, codes);
        return;
      }
    }
    conv2d_fwd_in_float(g, x, w, bias, y, codes);
  }
  // The gradients, with x, w and gy in this thread's precision (y, the epilogue's mask, as it is).
  template <class T>
  static void conv2d_bwd(ConvGeometry const& g, T const* x, T const* w, T const* y, T const* gy, T beta_x, T* gx,
                         T beta_w, T* gw, T beta_b, T* gb, std::uint8_t const* codes = nullptr) {
    if constexpr (std::same_as<T, float>) {
      if (Precision const p = matmul_precision(); p != Precision::kFp32) {
        i64 const ny = g.N * g.O * (g.pool2() ? (g.OH() / 2) * (g.OW() / 2) : g.L());
        auto const xr = detail::rounded_copy(p, g.N * g.C * g.H * g.W, x);
        auto const wr = detail::rounded_copy(p, g.O * g.patch(), w);
        auto const gyr = detail::rounded_copy(p, ny, gy);
        conv2d_bwd_in_float(g, xr.data(), wr.data(), y, gyr.data(), beta_x, gx, beta_w, gw, beta_b, gb, codes);
        return;
      }
    }
    conv2d_bwd_in_float(g, x, w, y, gy, beta_x, gx, beta_w, gw, beta_b, gb, codes);
  }
};

}  // namespace ddp
