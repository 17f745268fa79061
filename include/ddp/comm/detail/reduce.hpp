// Element-wise reduction kernels for shared-memory collectives: reduce n source blocks through an
// L1-resident chunk and write the result to any number of destinations, folding kAvg's scale in.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ddp/comm/communicator.hpp"
#include "ddp/tensor/stream_copy.hpp"

namespace ddp::detail {

// The element-wise operations. On 16-bit floats (H) they compute in float and round: apply() once per pair (what
// MPI's user operations do), and the reduce_piece overload below once per element for all ranks at once.
struct PlusOp {
  template <class T>
  static T apply(T a, T b) noexcept {
    if constexpr (HalfFloat<T>)
      return T(float(a) + float(b));
    else
      return a + b;
  }
};
struct MaxOp {
  template <class T>
  static T apply(T a, T b) noexcept {
    if constexpr (HalfFloat<T>)
      return float(a) < float(b) ? b : a;
    else
      return a < b ? b : a;
  }
};
struct MinOp {
  template <class T>
  static T apply(T a, T b) noexcept {
    if constexpr (HalfFloat<T>)
      return float(b) < float(a) ? b : a;
    else
      return b < a ? b : a;
  }
};

// Elements per chunk: 8 KiB stays in L1 next to the streamed sources.
template <class T>
inline constexpr std::size_t kReduceChunk = 8192 / sizeof(T);

template <class Op, class T>
inline void combine2(T* __restrict out, T const* __restrict a, T const* __restrict b, std::size_t m) noexcept {
  for (std::size_t i = 0; i < m; ++i) out[i] = Op::apply(a[i], b[i]);
}
template <class Op, class T>
inline void combine_into(T* __restrict acc, T const* __restrict b, std::size_t m) noexcept {
  for (std::size_t i = 0; i < m; ++i) acc[i] = Op::apply(acc[i], b[i]);
}
template <class T>
inline void average(T* __restrict acc, std::size_t m, int world) noexcept {
  if constexpr (HalfFloat<T>) {
    float const inv = 1.0f / static_cast<float>(world);
    for (std::size_t i = 0; i < m; ++i) acc[i] = T(float(acc[i]) * inv);
  } else if constexpr (std::is_floating_point_v<T>) {
    T const inv = T(1) / static_cast<T>(world);
    for (std::size_t i = 0; i < m; ++i) acc[i] *= inv;
  } else {
    T const w = static_cast<T>(world);
    for (std::size_t i = 0; i < m; ++i) acc[i] /= w;
  }
}

// Two ranks, result written back to both sources: one fused streaming pass.
template <class Op, bool kAvg, class T>
inline void reduce_pair_inplace(T* __restrict a, T* __restrict b, std::size_t count) noexcept {
  if constexpr (kAvg && std::is_floating_point_v<T>) {
    for (std::size_t i = 0; i < count; ++i) {
      T const v = Op::apply(a[i], b[i]) * T(0.5);
      a[i] = v;
      b[i] = v;
    }
  } else {
    for (std::size_t i = 0; i < count; ++i) {
      T v = Op::apply(a[i], b[i]);
      if constexpr (kAvg) v /= T(2);
      a[i] = v;
      b[i] = v;
    }
  }
}

// out[j] = op over k of srcs[k][off + j] (rank order), for j < m, with kAvg's scale folded in: the one
// definition of a reduced value, so every kernel below gives the same bits.
template <class Op, bool kAvg, class T>
inline void reduce_piece(T* __restrict out, T const* const* srcs, int nsrc, std::size_t off, std::size_t m) noexcept {
  if (nsrc == 1) {
    std::memcpy(out, srcs[0] + off, m * sizeof(T));
  } else {
    combine2<Op>(out, srcs[0] + off, srcs[1] + off, m);
    for (int k = 2; k < nsrc; ++k) combine_into<Op>(out, srcs[k] + off, m);
  }
  if constexpr (kAvg) average(out, m, nsrc);
}

// 16-bit floats: every rank's value is added in float, in rank order, and the result (kAvg: scaled) rounded once.
template <class Op, bool kAvg, HalfFloat H>
inline void reduce_piece(H* __restrict out, H const* const* srcs, int nsrc, std::size_t off, std::size_t m) noexcept {
  constexpr std::size_t kPart = 256;
  float acc[kPart];
  float const inv = 1.0f / static_cast<float>(nsrc);
  for (std::size_t p = 0; p < m; p += kPart) {
    std::size_t const q = std::min(kPart, m - p);
    H const* const s0 = srcs[0] + off + p;
    for (std::size_t i = 0; i < q; ++i) acc[i] = float(s0[i]);
    for (int k = 1; k < nsrc; ++k) {
      H const* const sk = srcs[k] + off + p;
      for (std::size_t i = 0; i < q; ++i) acc[i] = Op::apply(acc[i], float(sk[i]));
    }
    if constexpr (kAvg)
      for (std::size_t i = 0; i < q; ++i) acc[i] *= inv;
    for (std::size_t i = 0; i < q; ++i) out[p + i] = H(acc[i]);
  }
}
template <class Op, bool kAvg, class T>
void reduce_blocks_impl(T const* const* srcs, int nsrc, T* const* dsts, int ndst, std::size_t count) noexcept {
  // Two ranks in place: one fused pass (16-bit floats take the chunked path, which adds in float).
  if constexpr (!HalfFloat<T>) {
    if (nsrc == 2 && ndst == 2 && dsts[0] == srcs[0] && dsts[1] == srcs[1] && srcs[0] != srcs[1]) {
      reduce_pair_inplace<Op, kAvg>(dsts[0], dsts[1], count);
      return;
    }
  }
  alignas(64) T tmp[kReduceChunk<T>];
  for (std::size_t off = 0; off < count; off += kReduceChunk<T>) {
    std::size_t const m = std::min(kReduceChunk<T>, count - off);
    reduce_piece<Op, kAvg>(tmp, srcs, nsrc, off, m);
    for (int d = 0; d < ndst; ++d) std::memcpy(dsts[d] + off, tmp, m * sizeof(T));
  }
}

template <class Op, bool kAvg, class T>
void reduce_streaming_impl(T const* const* srcs, int nsrc, T* const* dsts, int ndst, std::size_t count) noexcept {
  constexpr std::size_t kLine = 64 / sizeof(T);
  alignas(64) T v[kLine];
  auto const plain = [&](std::size_t from, std::size_t to) {
    for (std::size_t i = from; i < to; i += kLine) {
      std::size_t const m = std::min(kLine, to - i);
      reduce_piece<Op, kAvg>(v, srcs, nsrc, i, m);
      for (int d = 0; d < ndst; ++d) std::memcpy(dsts[d] + i, v, m * sizeof(T));
    }
  };
  // Whole lines from the first line boundary of dsts[0]; every destination must be at the same offset in its
  // line (else plain stores throughout).
  auto const offset = [](T const* p) { return reinterpret_cast<std::uintptr_t>(p) % 64; };
  bool aligned = offset(dsts[0]) % sizeof(T) == 0;
  for (int d = 1; d < ndst; ++d) aligned = aligned && offset(dsts[d]) == offset(dsts[0]);
  std::size_t const head = !aligned ? count : std::min(count, (64 - offset(dsts[0])) % 64 / sizeof(T));
  plain(0, head);
  std::size_t i = head;
  for (; i + kLine <= count; i += kLine) {
    reduce_piece<Op, kAvg>(v, srcs, nsrc, i, kLine);
    std::memcpy(dsts[0] + i, v, 64);
    for (int d = 1; d < ndst; ++d) stream_line(dsts[d] + i, v);
  }
  plain(i, count);
  stream_fence();
}

// Calls f(Op{}, std::bool_constant<kAvg>{}) with the element-wise operation of `op` and whether it averages.
template <class F>
void with_op(ReduceOp op, F&& f) {
  switch (op) {
    case ReduceOp::kSum:
      return f(PlusOp{}, std::false_type{});
    case ReduceOp::kAvg:
      return f(PlusOp{}, std::true_type{});
    case ReduceOp::kMax:
      return f(MaxOp{}, std::false_type{});
    case ReduceOp::kMin:
      return f(MinOp{}, std::false_type{});
  }
}

// reduce_blocks for an in-place all-reduce on a node where each rank's buffer is dsts[0] on that rank: plain
// stores into dsts[0] (this rank reads it next), streaming stores into the others (the peers' buffers), a cache
// line at a time, fenced before return. Writing a line a peer's core holds in another cache domain with a plain
// store first fetches it across domains; a streaming store does not (bench/RESULTS.md). Same bits as
// reduce_blocks.
template <class T>
void reduce_blocks_streaming(T const* const* srcs, int nsrc, T* const* dsts, int ndst, std::size_t count,
                             ReduceOp op) noexcept {
  if (count == 0 || nsrc <= 0 || ndst <= 0) return;
  with_op(op, [&](auto o, auto avg) {
    reduce_streaming_impl<decltype(o), decltype(avg)::value>(srcs, nsrc, dsts, ndst, count);
  });
}

// dst[d][i] = op over k of srcs[k][i] (k in rank order, so every destination gets bitwise the same value),
// for i < count. Destinations may alias sources. kAvg divides by nsrc in the same pass.
template <class T>
void reduce_blocks(T const* const* srcs, int nsrc, T* const* dsts, int ndst, std::size_t count, ReduceOp op) noexcept {
  if (count == 0 || nsrc <= 0) return;
  with_op(op, [&](auto o, auto avg) {
    reduce_blocks_impl<decltype(o), decltype(avg)::value>(srcs, nsrc, dsts, ndst, count);
  });
}

}  // namespace ddp::detail
