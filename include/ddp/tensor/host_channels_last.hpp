// Moving data between NCHW planes (channels × positions) and channel-fastest rows (positions × channels), the
// layout the Winograd transforms vectorise over. The only host kernels that move single values: transposes
// done in 8×8 register blocks for float with AVX, element by element otherwise. Positions map to rows through
// a callable `row(p)`, so a caller can scatter rows into any arrangement (e.g. split by x mod 4).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "ddp/config.hpp"

namespace ddp::detail {

// dst[0, n) = src[0, n), in whole cache lines where it can (kept inline: n is a channel count).
template <class T>
DDP_ALWAYS_INLINE void copy_lanes(T const* src, std::int64_t n, T* dst) {
  constexpr std::int64_t kLine = 64 / sizeof(T);
  std::int64_t i = 0;
  for (; i + kLine <= n; i += kLine) std::memcpy(dst + i, src + i, 64);
  for (; i < n; ++i) dst[i] = src[i];
}

#if defined(__AVX__)
DDP_ALWAYS_INLINE void transpose8x8(__m256 (&r)[8]) {
  __m256 const t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  __m256 const t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  __m256 const t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  __m256 const t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  __m256 const u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  __m256 const u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  __m256 const u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  __m256 const u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}
#endif

// row(p)[c] = src[c·ss + p] for c < nc, p < np; with a mask (same layout as src), only where mask > 0
// (0 elsewhere): the gradient of a fused ReLU.
template <class T, class Row>
DDP_ALWAYS_INLINE void planes_to_rows(T const* src, std::int64_t ss, std::int64_t nc, std::int64_t np, Row&& row,
                                      T const* mask = nullptr) {
  std::int64_t c0 = 0;
#if defined(__AVX__)
  if constexpr (std::is_same_v<T, float>) {
    for (; c0 + 8 <= nc; c0 += 8) {
      std::int64_t p0 = 0;
      for (; p0 + 8 <= np; p0 += 8) {
        __m256 r[8];
        for (int i = 0; i < 8; ++i) {
          r[i] = _mm256_loadu_ps(src + (c0 + i) * ss + p0);
          if (mask)
            r[i] = _mm256_and_ps(
                r[i], _mm256_cmp_ps(_mm256_loadu_ps(mask + (c0 + i) * ss + p0), _mm256_setzero_ps(), _CMP_GT_OQ));
        }
        transpose8x8(r);
        for (int j = 0; j < 8; ++j) _mm256_storeu_ps(row(p0 + j) + c0, r[j]);
      }
      for (; p0 < np; ++p0) {
        T* d = row(p0) + c0;
        for (int i = 0; i < 8; ++i) {
          std::int64_t const at = (c0 + i) * ss + p0;
          d[i] = !mask || mask[at] > T(0) ? src[at] : T(0);
        }
      }
    }
  }
#endif
  for (std::int64_t p = 0; p < np; ++p) {
    T* d = row(p);
    for (std::int64_t c = c0; c < nc; ++c) d[c] = !mask || mask[c * ss + p] > T(0) ? src[c * ss + p] : T(0);
  }
}

// dst[c·ds + p] = (beta == 0 ? 0 : dst[c·ds + p]) + row(p)[c] + bias[c] (bias may be null) for c < nc, p < np;
// with relu (beta must be 0), max(0, ·) of that.
template <class T, class Row>
DDP_ALWAYS_INLINE void rows_to_planes(Row&& row, std::int64_t nc, std::int64_t np, T const* bias, T beta, T* dst,
                                      std::int64_t ds, bool relu = false) {
  std::int64_t c0 = 0;
#if defined(__AVX__)
  if constexpr (std::is_same_v<T, float>) {
    for (; c0 + 8 <= nc; c0 += 8) {
      std::int64_t p0 = 0;
      for (; p0 + 8 <= np; p0 += 8) {
        __m256 r[8];
        for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(row(p0 + j) + c0);
        transpose8x8(r);
        for (int i = 0; i < 8; ++i) {
          float* d = dst + (c0 + i) * ds + p0;
          __m256 v = bias ? _mm256_add_ps(r[i], _mm256_set1_ps(bias[c0 + i])) : r[i];
          if (beta != T(0)) v = _mm256_add_ps(v, _mm256_loadu_ps(d));
          if (relu) v = _mm256_max_ps(v, _mm256_setzero_ps());
          _mm256_storeu_ps(d, v);
        }
      }
      for (; p0 < np; ++p0) {
        T const* sr = row(p0) + c0;
        for (int i = 0; i < 8; ++i) {
          T& d = dst[(c0 + i) * ds + p0];
          T const v = sr[i] + (bias ? bias[c0 + i] : T(0));
          d = beta == T(0) ? v : d + v;
          if (relu) d = std::max(d, T(0));
        }
      }
    }
  }
#endif
  for (std::int64_t c = c0; c < nc; ++c) {
    T const b = bias ? bias[c] : T(0);
    for (std::int64_t p = 0; p < np; ++p) {
      T& d = dst[c * ds + p];
      T const v = row(p)[c] + b;
      d = beta == T(0) ? v : d + v;
      if (relu) d = std::max(d, T(0));
    }
  }
}

}  // namespace ddp::detail
