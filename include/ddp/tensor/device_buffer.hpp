// DeviceBuffer<T>: an owning CUDA device array (cudaMalloc RAII) with host copies; what NcclBackend's
// DeviceSpan collectives run on. Opt-in: depend on //:ddp_nccl.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "ddp/error.hpp"
#include "ddp/tensor/space_span.hpp"

namespace ddp {

namespace detail {
inline void cuda_check(cudaError_t rc, char const* call) {
  if (rc != cudaSuccess) {
    throw CudaError(cat("CUDA: ", call, " failed: ", cudaGetErrorName(rc), " (", cudaGetErrorString(rc), ")"));
  }
}
}  // namespace detail

// Move-only. Copies to and from the host are synchronous (cudaMemcpy on the legacy default stream, which
// orders after work on other blocking streams, including NcclBackend's).
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t size) : size_(size) {
    if (size_ != 0) detail::cuda_check(cudaMalloc(reinterpret_cast<void**>(&data_), size_ * sizeof(T)), "cudaMalloc");
  }
  explicit DeviceBuffer(std::span<T const> host) : DeviceBuffer(host.size()) { copy_from(host); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  DeviceBuffer(DeviceBuffer const&) = delete;
  DeviceBuffer& operator=(DeviceBuffer const&) = delete;
  ~DeviceBuffer() { release(); }

  T* data() noexcept { return data_; }
  T const* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  DeviceSpan<T> span() noexcept { return DeviceSpan<T>(data_, size_); }
  DeviceSpan<T const> span() const noexcept { return DeviceSpan<T const>(data_, size_); }

  void copy_from(std::span<T const> host) {
    if (host.size() != size_) {
      throw ArgumentError(detail::cat("DeviceBuffer::copy_from: host has ", host.size(), " elements, buffer ", size_));
    }
    if (size_ != 0) {
      detail::cuda_check(cudaMemcpy(data_, host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    }
  }
  std::vector<T> to_host() const {
    std::vector<T> out(size_);
    if (size_ != 0) {
      detail::cuda_check(cudaMemcpy(out.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    }
    return out;
  }

 private:
  void release() noexcept {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace ddp
