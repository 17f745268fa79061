// Memory-space tags: where a tensor's or span's elements live. Part of every tensor and buffer type.
#pragma once

#include <concepts>
#include <string_view>
#include <type_traits>

namespace ddp {

// Host memory: ordinary pageable RAM, reachable from any CPU thread (Eigen tensors, MPI buffers).
struct HostSpace {
  static constexpr std::string_view name = "host";
};

// Device memory: CUDA global memory (or Thrust's CPU device systems in CI). Not dereferenceable on the
// host when a GPU is used; NCCL and the device tensor path take it.
struct DeviceSpace {
  static constexpr std::string_view name = "device";
};

template <class S>
concept MemorySpace = requires {
  { S::name } -> std::convertible_to<std::string_view>;
};

static_assert(MemorySpace<HostSpace>);
static_assert(MemorySpace<DeviceSpace>);

// Whether any host thread may read and write a space's memory directly (plain loads, memcpy): a compile-time
// property. HostSpace: always. DeviceSpace: a property of Thrust's device system, declared by
// <ddp/tensor/device_system.hpp> (true for the CPU systems CPP, OMP and TBB; false for CUDA). A translation unit
// that does not include it treats DeviceSpace as not host-accessible.
template <MemorySpace S>
struct HostAccessible : std::bool_constant<std::same_as<S, HostSpace>> {};
template <MemorySpace S>
inline constexpr bool host_accessible_v = HostAccessible<S>::value;

// A backend lists the spaces it accepts: `using accepted_spaces = SpaceList<HostSpace>;`.
template <MemorySpace... Ss>
struct SpaceList {
  template <class S>
  static constexpr bool contains = (std::same_as<S, Ss> || ...);
};

// Every space whose memory host threads can touch (host_accessible_v): HostSpace, and DeviceSpace on Thrust's CPU
// systems. A backend that moves bytes with plain loads and stores (ThreadsBackend) lists this; its transport
// sees such buffers as host memory. Evaluated lazily, where a collective or DDP is instantiated.
struct HostAccessibleSpaces {
  template <class S>
  static constexpr bool contains = host_accessible_v<S>;
};

}  // namespace ddp
