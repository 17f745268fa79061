// detail::exact_average: the mean of V vectors laid out alike, held k per rank (V = k x world), bitwise the same
// whichever ranks hold which of them. It is how the virtual replicas of local SGD and DiLoCo (local_rounds.hpp)
// average parameters, optimizer state and pseudo-gradients in deterministic mode: each tensor of the layout gets a
// shared exponent (the max over all V, one kMax all-reduce of two words per tensor), every value is rounded once to
// an int64 multiple of 2^(e - bits) (bucket/exact_quantum.hpp), the integers are summed on the rank and across ranks
// (kSum, one all-reduce per chunk: integer addition is associative), and the mean is converted back once and
// written into every one of the rank's vectors. Host memory only.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ddp/bucket/exact_quantum.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"

namespace ddp::detail {

// What exact_average averages: tensors (each its own shared exponent; `name` in errors) inside vectors of `extent`
// elements, sent in chunks (each one all-reduce of whole tensors; the gaps between chunks are not averaged).
struct ExactLayout {
  struct Part {
    std::string name{};
    std::int64_t offset = 0, numel = 0;
  };
  struct Chunk {
    std::int64_t offset = 0, numel = 0;
  };
  std::vector<Part> tensors{};
  std::vector<Chunk> chunks{};
  std::int64_t extent = 0;
};

// Replaces each of xs (this rank's vectors, laid out by `layout`) by the mean of all `total` vectors over the ranks
// of `comm`, which each hold xs.size() = total / world of them. `on_chunk(c, bytes, began)` runs after chunk c's
// all-reduce (its int64 sums: the bytes this rank sent; when it began, on the steady clock). A non-finite value anywhere raises DdpError naming the tensor, on every
// rank alike (`who` starts the message). Returns the bytes this rank sent (exponent words and sums).
template <class T, Communicator C, class OnChunk>
std::int64_t exact_average(C& comm, ExactLayout const& layout, std::span<T* const> xs, std::int64_t total,
                           std::string_view tag, std::string_view who, OnChunk&& on_chunk) {
  static_assert(std::is_floating_point_v<T>, "exact_average: float or double values");
  std::size_t const nt = layout.tensors.size();
  bool const several = comm.world_size() > 1;
  std::vector<std::int64_t> words(2 * nt, 0);  // per tensor: the exponent, then whether a value is non-finite
  for (std::size_t t = 0; t < nt; ++t) {
    auto const& e = layout.tensors[t];
    words[t] = kExactFloorExponent;
    for (T* const x : xs) {
      auto const m = exact_magnitude(x + e.offset, e.numel);
      words[t] = std::max(words[t], m.exponent);
      words[nt + t] = std::max<std::int64_t>(words[nt + t], m.finite ? 0 : 1);
    }
  }
  std::int64_t bytes = 0;
  if (several) {
    host_all_reduce(comm, std::span<std::int64_t>(words), ReduceOp::kMax, CollectiveTag{"average.exponents", -1});
    bytes += static_cast<std::int64_t>(words.size() * sizeof(std::int64_t));
  }
  for (std::size_t t = 0; t < nt; ++t)
    if (words[nt + t] != 0)
      throw DdpError(cat(who, ": '", layout.tensors[t].name,
                         "' holds a non-finite value on some replica, so it has no exact average (lower the learning "
                         "rate, or clip the gradients)"));
  int const bits = exact_bits(total);
  std::vector<std::int64_t> sums(static_cast<std::size_t>(layout.extent), 0);
  for (std::size_t t = 0; t < nt; ++t) {
    auto const& e = layout.tensors[t];
    double const scale = std::ldexp(1.0, bits - static_cast<int>(words[t]));
    std::int64_t* __restrict const acc = sums.data() + e.offset;
    for (T* const x : xs) {
      T const* __restrict const v = x + e.offset;
      for (std::int64_t i = 0; i < e.numel; ++i) acc[i] += exact_quantize(v[i], scale);
    }
  }
  for (std::size_t c = 0; c < layout.chunks.size(); ++c) {
    if (!several) break;
    auto const& ch = layout.chunks[c];
    auto const began = std::chrono::steady_clock::now();
    host_all_reduce(comm, std::span<std::int64_t>(sums.data() + ch.offset, static_cast<std::size_t>(ch.numel)),
                    ReduceOp::kSum, CollectiveTag{tag, static_cast<std::int64_t>(c)});
    std::int64_t const sent = ch.numel * static_cast<std::int64_t>(sizeof(std::int64_t));
    bytes += sent;
    on_chunk(c, sent, began);
  }
  for (std::size_t t = 0; t < nt; ++t) {
    auto const& e = layout.tensors[t];
    double const factor = std::ldexp(1.0, static_cast<int>(words[t]) - bits) / static_cast<double>(total);
    std::int64_t const* __restrict const acc = sums.data() + e.offset;
    for (T* const x : xs) {
      T* __restrict const v = x + e.offset;
      for (std::int64_t i = 0; i < e.numel; ++i) v[i] = static_cast<T>(static_cast<double>(acc[i]) * factor);
    }
  }
  return bytes;
}

}  // namespace ddp::detail
