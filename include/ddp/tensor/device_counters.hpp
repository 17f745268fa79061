// DeviceCounts: what the device layer did on this thread that a step free of host work must not do: device
// allocations, synchronous copies between host and device, and host waits for a device result (a reduction read
// on the host: loss.item(), a norm, a non-finite check). The choke points count (SpaceAllocator<DeviceSpace>,
// device_from_host / device_to_host, device_reduce), so a test on Thrust's CPU system sees what a GPU run would.
// Uploads the host does not wait for (device_from_host_async: pinned staging, cudaMemcpyAsync) are counted apart,
// as allowed:
//   auto const before = device_counts();  train_step();  auto const step = device_counts() - before;
// Per thread, as each rank of the threads backend is one: a rank sees its own step's counts.
#pragma once

#include <cstdint>
#include <string>

#include "ddp/error.hpp"

namespace ddp {

struct DeviceCounts {
  std::uint64_t allocations = 0;      // device tensors and scratch (the stream-ordered pool on CUDA)
  std::uint64_t allocated_bytes = 0;  //
  std::uint64_t sync_copies = 0;      // host <-> device copies the host waits for (cudaMemcpy)
  std::uint64_t copied_bytes = 0;     //
  std::uint64_t host_waits = 0;       // reductions returned to the host (the host waits for the device)
  std::uint64_t async_copies = 0;     // host -> device copies the host does not wait for (from_host_async)
  std::uint64_t async_bytes = 0;      //

  friend DeviceCounts operator-(DeviceCounts const& a, DeviceCounts const& b) noexcept {
    return {a.allocations - b.allocations,   a.allocated_bytes - b.allocated_bytes, a.sync_copies - b.sync_copies,
            a.copied_bytes - b.copied_bytes, a.host_waits - b.host_waits,           a.async_copies - b.async_copies,
            a.async_bytes - b.async_bytes};
  }
  friend bool operator==(DeviceCounts const&, DeviceCounts const&) = default;

  // "12 allocations (3.1 MB), 2 synchronous copies (1.0 kB), 5 host waits" (and ", 2 asynchronous copies
  // (25.1 kB)" where there were some)
  std::string describe() const {
    auto bytes = [](std::uint64_t b) {
      return b >= 1'000'000 ? detail::cat(static_cast<double>(b) / 1e6, " MB")
                            : detail::cat(static_cast<double>(b) / 1e3, " kB");
    };
    return detail::cat(
        allocations, allocations == 1 ? " allocation (" : " allocations (", bytes(allocated_bytes), "), ", sync_copies,
        sync_copies == 1 ? " synchronous copy (" : " synchronous copies (", bytes(copied_bytes), "), ", host_waits,
        host_waits == 1 ? " host wait" : " host waits",
        async_copies == 0
            ? std::string()
            : detail::cat(", ", async_copies, async_copies == 1 ? " asynchronous copy (" : " asynchronous copies (",
                          bytes(async_bytes), ")"));
  }
};

namespace detail {
inline DeviceCounts& device_counts_here() noexcept {
  thread_local DeviceCounts counts;
  return counts;
}
inline void count_allocation(std::uint64_t bytes) noexcept {
  auto& c = device_counts_here();
  ++c.allocations;
  c.allocated_bytes += bytes;
}
inline void count_sync_copy(std::uint64_t bytes) noexcept {
  auto& c = device_counts_here();
  ++c.sync_copies;
  c.copied_bytes += bytes;
}
inline void count_host_wait() noexcept { ++device_counts_here().host_waits; }
inline void count_async_copy(std::uint64_t bytes) noexcept {
  auto& c = device_counts_here();
  ++c.async_copies;
  c.async_bytes += bytes;
}
}  // namespace detail

// This thread's counts since it started.
inline DeviceCounts device_counts() noexcept { return detail::device_counts_here(); }

}  // namespace ddp
