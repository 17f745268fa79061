// Non-temporal (streaming) stores: the destination's lines go to memory without being fetched into this
// core's cache first, and other cores' copies are invalidated. For data this core will not read again soon
// (the host Winograd transforms' outputs) or another core reads next (NodeAllReduce's shared window, where a
// plain store would first fetch every line back from the core that read it last). stream_copy: SSE2 MOVNTDQ on
// x86-64, memcpy elsewhere. The stores are weakly ordered: call stream_fence() before another core may read
// them (before the barrier flag) or before this core reads them back.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ddp::detail {

inline void stream_copy(void* dst, void const* src, std::size_t bytes) noexcept {
  if (bytes == 0 || dst == src) return;
#if defined(__SSE2__)
  auto* d = static_cast<std::byte*>(dst);
  auto const* s = static_cast<std::byte const*>(src);
  // A head up to the next 16-byte boundary of the destination, then 64 bytes per iteration, then the tail.
  std::size_t const head = std::min(bytes, (16 - reinterpret_cast<std::uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  for (; bytes >= 64; d += 64, s += 64, bytes -= 64) {
    __m128i const a = _mm_loadu_si128(reinterpret_cast<__m128i const*>(s));
    __m128i const b = _mm_loadu_si128(reinterpret_cast<__m128i const*>(s + 16));
    __m128i const c = _mm_loadu_si128(reinterpret_cast<__m128i const*>(s + 32));
    __m128i const e = _mm_loadu_si128(reinterpret_cast<__m128i const*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, bytes);
#else
  std::memcpy(dst, src, bytes);
#endif
}

// One cache line: 64 bytes from `src` to `dst`, both 64-byte aligned, with streaming stores (memcpy without SSE2).
inline void stream_line(void* dst, void const* src) noexcept {
#if defined(__SSE2__)
  auto* d = static_cast<__m128i*>(dst);
  auto const* s = static_cast<__m128i const*>(src);
  _mm_stream_si128(d, _mm_load_si128(s));
  _mm_stream_si128(d + 1, _mm_load_si128(s + 1));
  _mm_stream_si128(d + 2, _mm_load_si128(s + 2));
  _mm_stream_si128(d + 3, _mm_load_si128(s + 3));
#else
  std::memcpy(dst, src, 64);
#endif
}

// Orders the streaming stores before every later store (SFENCE); a no-op where stream_copy is memcpy.
inline void stream_fence() noexcept {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace ddp::detail
