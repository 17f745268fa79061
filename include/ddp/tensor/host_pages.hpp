// Host pages: handing the memory of a range back to the kernel while it stays mapped and reads as zero, and
// counting how much of a range is resident. ZeRO stage 2 (parallel/zero_redundancy.hpp) releases the gradients
// outside a rank's slices this way after each step, and reports what it keeps with resident_bytes().
// Linux: madvise(2) and mincore(2). Only for memory the host can address (host tensors, device tensors on
// Thrust's CPU systems).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ddp/error.hpp"

namespace ddp::detail {

inline std::uintptr_t host_page_size() noexcept { return static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE)); }

// Zeroes bytes [p, p + bytes). The whole pages inside the range go back to the kernel: MADV_REMOVE where the
// memory is shared (an MPI shared-memory window), MADV_DONTNEED where it is private (malloc, aligned_alloc);
// either way they read as zero and take no memory until written again. The partial pages at the two ends are
// memset. Returns the bytes handed back: 0 where the kernel refuses both (locked memory, say); the range is then
// zeroed by memset and keeps its memory, which resident_bytes() shows. The contents are zero either way.
inline std::size_t zero_and_release(void* p, std::size_t bytes) {
  if (bytes == 0) return 0;
  auto* const base = static_cast<unsigned char*>(p);
  std::uintptr_t const page = host_page_size(), lo = reinterpret_cast<std::uintptr_t>(base);
  std::uintptr_t const first = (lo + page - 1) & ~(page - 1), last = (lo + bytes) & ~(page - 1);
  if (first >= last) {  // no whole page inside
    std::memset(base, 0, bytes);
    return 0;
  }
  std::memset(base, 0, first - lo);
  std::memset(reinterpret_cast<void*>(last), 0, lo + bytes - last);
  void* const whole = reinterpret_cast<void*>(first);
  std::size_t const n = last - first;
  if (::madvise(whole, n, MADV_REMOVE) == 0) return n;  // shared memory: the backing pages are freed
  if (errno == EINVAL && ::madvise(whole, n, MADV_DONTNEED) == 0) return n;  // private memory
  std::memset(whole, 0, n);
  return 0;
}

// Bytes of the pages overlapping [p, p + bytes) that are resident now (mincore), so the ends may count a page
// the range shares with its neighbours. A released page that was read since counts too (the read maps the
// kernel's shared zero page), so the figure errs high, never low.
inline std::size_t resident_bytes(void const* p, std::size_t bytes) {
  if (bytes == 0) return 0;
  std::uintptr_t const page = host_page_size(), lo = reinterpret_cast<std::uintptr_t>(p);
  std::uintptr_t const first = lo & ~(page - 1), last = (lo + bytes + page - 1) & ~(page - 1);
  std::vector<unsigned char> in_core((last - first) / page);
  if (::mincore(reinterpret_cast<void*>(first), last - first, in_core.data()) != 0)
    throw Error(cat("resident_bytes: mincore over ", last - first, " bytes failed (", std::strerror(errno), ")"));
  std::size_t n = 0;
  for (unsigned char c : in_core) n += (c & 1u) ? page : 0;
  return n;
}

}  // namespace ddp::detail
