// Tensor<T, Space>: a shared, row-major, up-to-4-D buffer whose memory space is part of its type.
#pragma once

#include <concepts>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>

#include "ddp/error.hpp"
#include "ddp/tensor/host_allocator.hpp"
#include "ddp/tensor/memory_space.hpp"
#include "ddp/tensor/shape.hpp"
#include "ddp/tensor/space_span.hpp"

namespace ddp {

template <MemorySpace S>
struct Kernels;  // kernels.hpp (host), device.hpp (device)

// How each memory space allocates. A space plugs in by specialising this (device.hpp does for DeviceSpace).
template <MemorySpace S>
struct SpaceAllocator {
  static_assert(sizeof(S) == 0,
                "no allocator for this memory space: include <ddp/tensor/device.hpp> (and depend on //:ddp_device_cpu) "
                "for DeviceSpace tensors, or use HostSpace");
};

template <>
struct SpaceAllocator<HostSpace> {
  // Uninitialised, 64-byte aligned storage; large blocks are recycled per thread (host_allocator.hpp).
  template <class T>
  static std::shared_ptr<T[]> allocate(std::size_t n) {
    std::size_t const bytes = n * sizeof(T);
    return std::shared_ptr<T[]>(static_cast<T*>(detail::HostBlockCache::allocate(bytes)),
                                [bytes](T* p) { detail::HostBlockCache::deallocate(p, bytes); });
  }
};

template <class T>
concept TensorElement = std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, std::int32_t> ||
    std::same_as<T, std::int64_t> || std::same_as<T, std::uint8_t>;

// A tensor is a cheap handle: copies share storage (like torch.Tensor). Views (reshape, slices of an
// arena) share the owner and keep it alive. Contents are uninitialised unless made by zeros()/full().
// Thread safety: distinct tensors may be used from distinct threads; one tensor's elements are not
// synchronised.
template <TensorElement T, MemorySpace Space = HostSpace>
class Tensor {
 public:
  using value_type = T;
  using space = Space;

  Tensor() = default;
  explicit Tensor(Shape shape)
      : owner_(SpaceAllocator<Space>::template allocate<T>(static_cast<std::size_t>(shape.numel()))),
        data_(static_cast<T*>(owner_.get())),
        shape_(shape) {}

  static Tensor empty(Shape shape) { return Tensor(shape); }

  // A view of memory someone else owns; `owner` keeps it alive (may be null for borrowed memory).
  static Tensor view(std::shared_ptr<void> owner, T* data, Shape shape) {
    Tensor t;
    t.owner_ = std::move(owner);
    t.data_ = data;
    t.shape_ = shape;
    return t;
  }

  bool defined() const noexcept { return data_ != nullptr || (shape_.rank() > 0 && shape_.numel() == 0); }
  T* data() const noexcept { return data_; }
  Shape const& shape() const noexcept { return shape_; }
  int rank() const noexcept { return shape_.rank(); }
  std::int64_t numel() const noexcept { return shape_.numel(); }
  std::int64_t size(int d) const { return shape_.dim(d); }
  std::shared_ptr<void> const& owner() const noexcept { return owner_; }
  SpaceSpan<T, Space> span() const noexcept { return {data_, static_cast<std::size_t>(numel())}; }

  // Same storage, new shape (numel must match).
  Tensor reshape(Shape s) const {
    if (s.numel() != numel())
      throw ShapeError(detail::cat("cannot reshape tensor of shape ", shape_, " (", numel(), " elements) to ", s, " (",
                                   s.numel(), " elements)"));
    return view(owner_, data_, s);
  }

  // Host element access (device memory is not dereferenceable on the host).
  T& operator[](std::int64_t i) const noexcept requires std::same_as<Space, HostSpace> { return data_[i]; }
  // The value of a one-element tensor, on the host (a synchronising copy for device memory).
  T item() const {
    if (numel() != 1) throw ShapeError(detail::cat("item() needs a one-element tensor, got shape ", shape_));
    if constexpr (std::same_as<Space, HostSpace>) {
      return data_[0];
    } else {
      T v;
      Kernels<Space>::to_host(std::int64_t{1}, data_, &v);
      return v;
    }
  }

 private:
  std::shared_ptr<void> owner_;
  T* data_ = nullptr;
  Shape shape_;
};

// Host tensors: construction helpers that touch elements.
template <TensorElement T = float>
Tensor<T> zeros(Shape s) {
  Tensor<T> t(s);
  if (t.numel()) std::memset(t.data(), 0, sizeof(T) * t.numel());
  return t;
}
template <TensorElement T = float>
Tensor<T> full(Shape s, T v) {
  Tensor<T> t(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = v;
  return t;
}
template <TensorElement T = float>
Tensor<T> from_values(Shape s, std::initializer_list<T> vals) {
  if (static_cast<std::int64_t>(vals.size()) != s.numel())
    throw ShapeError(detail::cat("from_values: ", vals.size(), " values for shape ", s));
  Tensor<T> t(s);
  std::int64_t i = 0;
  for (T v : vals) t[i++] = v;
  return t;
}
// Deep copy of a host tensor.
template <TensorElement T>
Tensor<T> clone(Tensor<T> const& x) {
  Tensor<T> t(x.shape());
  if (x.numel()) std::memcpy(t.data(), x.data(), sizeof(T) * x.numel());
  return t;
}

}  // namespace ddp
