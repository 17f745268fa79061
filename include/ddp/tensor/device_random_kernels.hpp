// Device dropout masks over Thrust: each element's random bits drawn where it is written (PCG32 jump-ahead for a
// Generator's stream, the counter draw for deterministic training), the same masks as the host kernels, bit
// for bit, with no host generation and no copy.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ddp/tensor/device_launch.hpp"
#include "ddp/tensor/random.hpp"

namespace ddp {

namespace detail::dev {
// Thread t writes elements t, t + stride, ...: it jumps to value t of the stream once, then strides.
template <class T>
struct BernoulliStream {
  i64 n, stride;
  std::uint64_t state, inc;
  PcgJump step;  // `stride` values at once
  std::uint32_t threshold;
  T keep;
  T* mask;
  DDP_HOST_DEVICE void operator()(i64 t) const {
    std::uint64_t s = pcg_jump(inc, static_cast<std::uint64_t>(t))(state);
    for (i64 i = t; i < n; i += stride) {
      mask[i] = pcg_output(s) < threshold ? T(0) : keep;
      s = step(s);
    }
  }
};
template <class T>
struct BernoulliCounter {
  i64 per_row;
  std::uint64_t seed, step;
  i64 first_sample;
  std::uint32_t threshold;
  T keep;
  T* mask;
  DDP_HOST_DEVICE void operator()(i64 i) const {
    i64 const r = i / per_row, j = i % per_row;
    mask[i] = counter_u32(seed, step, first_sample + r, j) < threshold ? T(0) : keep;
  }
};
}  // namespace detail::dev

// Part of Kernels<DeviceSpace>; contracts as Kernels<HostSpace>::bernoulli_mask_stream / _counter.
struct DeviceRandomKernels {
  using i64 = std::int64_t;
  template <class T>
  static void bernoulli_mask_stream(i64 n, std::uint64_t state, std::uint64_t inc, std::uint32_t threshold, T keep,
                                    T* mask) {
    i64 const threads = std::min<i64>(n, i64{1} << 16);
    if (threads <= 0) return;
    detail::device_for(threads,
                       detail::dev::BernoulliStream<T>{n, threads, state, inc | 1u,
                                                       detail::pcg_jump(inc | 1u, static_cast<std::uint64_t>(threads)),
                                                       threshold, keep, mask});
  }
  template <class T>
  static void bernoulli_mask_counter(i64 rows, i64 per_row, std::uint64_t seed, std::uint64_t step, i64 first_sample,
                                     std::uint32_t threshold, T keep, T* mask) {
    if (per_row <= 0) return;
    detail::device_for(rows * per_row,
                       detail::dev::BernoulliCounter<T>{per_row, seed, step, first_sample, threshold, keep, mask});
  }
};

}  // namespace ddp
