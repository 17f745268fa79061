// Memory-space tags: where a tensor's or span's elements live. Part of every tensor and buffer type.
#pragma once

#include <concepts>
#include <string_view>

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

// A backend lists the spaces it accepts: `using accepted_spaces = SpaceList<HostSpace>;`.
template <MemorySpace... Ss>
struct SpaceList {
  template <class S>
  static constexpr bool contains = (std::same_as<S, Ss> || ...);
};

}  // namespace ddp
