// ddp's only macros: version, host/device annotations, internal assertions.
#pragma once

#define DDP_VERSION_MAJOR 0
#define DDP_VERSION_MINOR 1
#define DDP_VERSION_PATCH 0

// CCCL 3 no longer defines __host__/__device__ for plain g++; use our own spelling.
#if defined(__CUDACC__)
#define DDP_HOST_DEVICE __host__ __device__
#else
#define DDP_HOST_DEVICE
#endif

// Host code with the compiler's _Float16 (GCC 12+ and Clang on x86-64): ddp::float16 converts through it.
#if defined(__FLT16_MAX__) && !defined(__CUDACC__)
#define DDP_HAS_FLOAT16_TYPE 1
#else
#define DDP_HAS_FLOAT16_TYPE 0
#endif

#if defined(__GNUC__)
#define DDP_ALWAYS_INLINE inline __attribute__((always_inline))
#define DDP_LIKELY(x) __builtin_expect(!!(x), 1)
#define DDP_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define DDP_ALWAYS_INLINE inline
#define DDP_LIKELY(x) (x)
#define DDP_UNLIKELY(x) (x)
#endif

// Before a loop whose iterations are independent (no aliasing the compiler must assume): lets it vectorise.
#if defined(__clang__)
#define DDP_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define DDP_IVDEP _Pragma("GCC ivdep")
#else
#define DDP_IVDEP
#endif

// Internal invariants (not user errors: those throw ddp::Error). Active unless DDP_NO_ASSERT.
#if defined(DDP_NO_ASSERT)
#define DDP_ASSERT(cond, msg) ((void)0)
#else
#define DDP_ASSERT(cond, msg) ((cond) ? (void)0 : ::ddp::detail::assert_fail(#cond, msg, __FILE__, __LINE__))
#endif

namespace ddp::detail {
[[noreturn]] void assert_fail(char const* cond, char const* msg, char const* file, int line);
}  // namespace ddp::detail

#include <cstdio>
#include <cstdlib>

namespace ddp::detail {
[[noreturn]] inline void assert_fail(char const* cond, char const* msg, char const* file, int line) {
  std::fprintf(stderr, "ddp internal assertion failed: %s (%s) at %s:%d\n", cond, msg, file, line);
  std::abort();
}
}  // namespace ddp::detail
