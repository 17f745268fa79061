// Collectives on small host buffers (metadata: counts, flags, signatures, metrics, checkpoint bytes) over any
// backend: direct where the backend takes host memory, staged through a buffer of its own space otherwise
// (NcclBackend: device memory), so every layer above can exchange host words with every backend alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ddp/comm/communicator.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp {

namespace detail {
template <class C>
inline constexpr bool takes_host_memory = C::accepted_spaces::template contains<HostSpace>;

// A copy of host data in the backend's native space (whose kernels must be visible: for DeviceSpace,
// <ddp/tensor/device.hpp>).
template <class C, class T>
Tensor<T, native_space_t<C>> staged_copy(std::span<T const> host) {
  using S = native_space_t<C>;
  Tensor<T, S> t(Shape{static_cast<std::int64_t>(host.size())});
  Kernels<S>::from_host(static_cast<std::int64_t>(host.size()), host.data(), t.data());
  return t;
}
template <class C, class T>
SpaceSpan<T, native_space_t<C>> span_of(Tensor<T, native_space_t<C>> const& t) {
  return {t.data(), static_cast<std::size_t>(t.numel())};
}
}  // namespace detail

// all_reduce of a host buffer, in place. Costs two small copies on a device-only backend.
template <Communicator C, CommElement T>
void host_all_reduce(C& comm, std::span<T> buf, ReduceOp op, CollectiveTag tag = {}) {
  if constexpr (detail::takes_host_memory<C>) {
    comm.all_reduce(HostSpan<T>(buf.data(), buf.size()), op, tag);
  } else {
    auto t = detail::staged_copy<C>(std::span<T const>(buf));
    comm.all_reduce(detail::span_of<C>(t), op, tag);
    Kernels<native_space_t<C>>::to_host(t.numel(), t.data(), buf.data());
  }
}

// broadcast of a host buffer from `root`, in place.
template <Communicator C, CommElement T>
void host_broadcast(C& comm, std::span<T> buf, int root, CollectiveTag tag = {}) {
  if constexpr (detail::takes_host_memory<C>) {
    comm.broadcast(HostSpan<T>(buf.data(), buf.size()), root, tag);
  } else {
    auto t = detail::staged_copy<C>(std::span<T const>(buf));
    comm.broadcast(detail::span_of<C>(t), root, tag);
    Kernels<native_space_t<C>>::to_host(t.numel(), t.data(), buf.data());
  }
}

// all_gather of host buffers: out.size() == world_size * in.size().
template <Communicator C, CommElement T>
void host_all_gather(C& comm, std::span<T const> in, std::span<T> out, CollectiveTag tag = {}) {
  if constexpr (detail::takes_host_memory<C>) {
    comm.all_gather(HostSpan<T const>(in.data(), in.size()), HostSpan<T>(out.data(), out.size()), tag);
  } else {
    auto src = detail::staged_copy<C>(in);
    Tensor<T, native_space_t<C>> dst(Shape{static_cast<std::int64_t>(out.size())});
    comm.all_gather(SpaceSpan<T const, native_space_t<C>>(src.data(), in.size()), detail::span_of<C>(dst), tag);
    Kernels<native_space_t<C>>::to_host(dst.numel(), dst.data(), out.data());
  }
}

}  // namespace ddp
