// shared_average: the threads backend's all-reduce arithmetic over memory every rank can address, for code that
// reduces straight from the ranks' own buffers (OwnerReduce, parallel/owner_reduce.hpp). Ranks must share one
// address space (SharedAddressSpace communicators: ThreadsBackend); the caller synchronises them.
#pragma once

#include <cstddef>
#include <span>

#include "ddp/comm/detail/reduce.hpp"

namespace ddp {

// out[j] = (sum over ranks k, in rank order, of ranks[k][offset + j]) / ranks.size(), for j < count: bitwise what
// ThreadsBackend's all_reduce(kAvg) leaves at that offset.
template <class T>
void shared_average(T* out, std::span<T const* const> ranks, std::size_t offset, std::size_t count) noexcept {
  detail::reduce_piece<detail::PlusOp, true>(out, ranks.data(), static_cast<int>(ranks.size()), offset, count);
}

// Elements shared_average() keeps in L1 beside the streamed sources: a good chunk for a caller's buffer.
template <class T>
inline constexpr std::size_t kSharedAverageChunk = detail::kReduceChunk<T>;

}  // namespace ddp
