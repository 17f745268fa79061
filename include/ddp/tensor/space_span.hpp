// SpaceSpan<T, Space>: a contiguous run of elements that knows which memory space it lives in.
// Collectives take these, so handing device memory to a host-only backend (or the reverse) fails to compile.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>

#include "ddp/tensor/memory_space.hpp"

namespace ddp {

template <class T, MemorySpace Space>
class SpaceSpan {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  using space = Space;

  constexpr SpaceSpan() noexcept = default;
  constexpr SpaceSpan(T* data, std::size_t size) noexcept : data_(data), size_(size) {}

  // Host memory converts implicitly from std::span / containers: all_reduce(std::span(v), ...).
  template <class U, std::size_t E>
  requires std::same_as<Space, HostSpace> && std::is_convertible_v<U (*)[], T (*)[]>
  constexpr SpaceSpan(std::span<U, E> s) noexcept : data_(s.data()), size_(s.size()) {}

  template <class C>
  requires std::same_as<Space, HostSpace> && requires(C& c) { std::span<T>(c); }
  constexpr SpaceSpan(C& c) noexcept : SpaceSpan(std::span<T>(c)) {}

  // Non-const to const.
  template <class U>
  requires std::same_as<T, U const>
  constexpr SpaceSpan(SpaceSpan<U, Space> s) noexcept : data_(s.data()), size_(s.size()) {}

  constexpr T* data() const noexcept { return data_; }
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  constexpr bool empty() const noexcept { return size_ == 0; }
  constexpr SpaceSpan subspan(std::size_t offset, std::size_t count) const noexcept {
    return SpaceSpan(data_ + offset, count);
  }
  constexpr SpaceSpan first(std::size_t count) const noexcept { return SpaceSpan(data_, count); }

  // Only host spans can be viewed as std::span (device memory is not dereferenceable on the host).
  constexpr std::span<T> host() const noexcept requires std::same_as<Space, HostSpace> { return {data_, size_}; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

template <class T>
using HostSpan = SpaceSpan<T, HostSpace>;
template <class T>
using DeviceSpan = SpaceSpan<T, DeviceSpace>;

template <class T>
constexpr HostSpan<T> host_span(T* p, std::size_t n) noexcept {
  return {p, n};
}
template <class T>
constexpr DeviceSpan<T> device_span(T* p, std::size_t n) noexcept {
  return {p, n};
}

}  // namespace ddp
