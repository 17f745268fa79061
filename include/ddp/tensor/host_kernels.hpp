// Kernels<HostSpace>: host math on Eigen (GEMM through Eigen's blocked kernels, vectorised element loops).
// All loops are sequential and deterministic: same inputs -> bitwise same outputs, run to run.
#pragma once

#include <Eigen/Core>
#if defined(__SSE2__)  // x86-64 (streaming stores below); other targets take the portable loops
#include <immintrin.h>
#endif
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <limits>

#include "ddp/tensor/half.hpp"
#include "ddp/tensor/host_conv_kernels.hpp"
#include "ddp/tensor/host_gemm.hpp"
#include "ddp/tensor/host_optim_kernels.hpp"
#include "ddp/tensor/host_transformer_kernels.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/tensor/random.hpp"
#include "ddp/tensor/stream_copy.hpp"  // stream_fence

namespace ddp {

namespace detail {
template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
template <class T>
using MapArr = Eigen::Map<Arr<T>>;
template <class T>
using CMapArr = Eigen::Map<Arr<T> const>;
template <class T>
using MapMat = Eigen::Map<RowMat<T>>;
template <class T>
using CMapMat = Eigen::Map<RowMat<T> const>;

// dst = beta * dst + expr, where beta is 0 or 1 and beta == 0 never reads dst (it may hold garbage).
template <class Dst, class Expr, class T>
DDP_ALWAYS_INLINE void assign_or_add(Dst&& dst, Expr const& expr, T beta) {
  if (beta == T(0))
    dst = expr;
  else if (beta == T(1))
    dst += expr;
  else
    dst = beta * dst + expr;
}
// out[j] = Σ_{k<K} coef[k] · B[k·N + j] for j < N, written with non-temporal stores where the ISA has
// them (AVX-512 / AVX), plain stores otherwise. Call stream_fence() before the data is read elsewhere.
inline void stream_combination(std::int64_t N, std::int64_t K, float const* coef, float const* B, float* out) {
  std::int64_t j = 0;
  auto scalar = [&](std::int64_t jj) {
    float v = 0;
    for (std::int64_t k = 0; k < K; ++k) v += coef[k] * B[k * N + jj];
    out[jj] = v;
  };
#if defined(__AVX512F__)
  for (; j < N && (reinterpret_cast<std::uintptr_t>(out + j) & 63) != 0; ++j) scalar(j);
  for (; j + 16 <= N; j += 16) {
    __m512 v = _mm512_mul_ps(_mm512_set1_ps(coef[0]), _mm512_loadu_ps(B + j));
    for (std::int64_t k = 1; k < K; ++k)
      v = _mm512_fmadd_ps(_mm512_set1_ps(coef[k]), _mm512_loadu_ps(B + k * N + j), v);
    _mm512_stream_ps(out + j, v);
  }
#elif defined(__AVX__)
  for (; j < N && (reinterpret_cast<std::uintptr_t>(out + j) & 31) != 0; ++j) scalar(j);
  for (; j + 8 <= N; j += 8) {
    __m256 v = _mm256_mul_ps(_mm256_set1_ps(coef[0]), _mm256_loadu_ps(B + j));
    for (std::int64_t k = 1; k < K; ++k)
      v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_set1_ps(coef[k]), _mm256_loadu_ps(B + k * N + j)));
    _mm256_stream_ps(out + j, v);
  }
#endif
  for (; j < N; ++j) scalar(j);
}
}  // namespace detail

template <>
struct Kernels<HostSpace> : HostConvKernels, HostOptimKernels, HostTransformerKernels {
  using i64 = std::int64_t;

  // C(M,N) = alpha * op(A) * op(B) + beta * C, row-major, op(A) is (M,K), op(B) is (K,N).
  // beta == 0 never reads C.
  template <class T>
  static void gemm(Trans ta, Trans tb, i64 M, i64 N, i64 K, T alpha, T const* A, T const* B, T beta, T* C) {
    using namespace detail;
    MapMat<T> c(C, M, N);
    if (K == 0) {
      if (beta == T(0))
        c.setZero();
      else
        c *= beta;
      return;
    }
    if (skinny_gemm(ta, tb, M, N, K, alpha, A, B, beta, C)) return;
    bool const tiny = M * N * K <= kTinyGemm;
#if defined(DDP_HOST_BLAS_OPENBLAS)
    if (!tiny)
      return host_gemm(ta, tb, M, N, K, alpha, A, ta == Trans::kNo ? K : M, B, tb == Trans::kNo ? N : K, beta, C, N);
#endif
    CMapMat<T> a(A, ta == Trans::kNo ? M : K, ta == Trans::kNo ? K : M);
    CMapMat<T> b(B, tb == Trans::kNo ? K : N, tb == Trans::kNo ? N : K);
    auto run = [&](auto const& opa, auto const& opb) {
      if (tiny) return tiny_gemm(c, alpha, opa, opb, beta);
      if (beta == T(0)) {
        if (alpha == T(1))
          c.noalias() = opa * opb;
        else
          c.noalias() = alpha * (opa * opb);
      } else {
        if (beta != T(1)) c *= beta;
        if (alpha == T(1))
          c.noalias() += opa * opb;
        else
          c.noalias() += alpha * (opa * opb);
      }
    };
    if (ta == Trans::kNo && tb == Trans::kNo)
      run(a, b);
    else if (ta == Trans::kNo && transposed_nt(M, N, K)) {
      // Cᵀ = B·Aᵀ, written straight through a transposed view of C: Eigen's kernels run this orientation
      // ~1.5x faster for few rows and a long inner dimension (a Linear layer on 9216 features, batch 32).
      auto ct = c.transpose();
      if (beta == T(0)) {
        if (alpha == T(1))
          ct.noalias() = b * a.transpose();
        else
          ct.noalias() = alpha * (b * a.transpose());
      } else {
        if (beta != T(1)) ct *= beta;
        if (alpha == T(1))
          ct.noalias() += b * a.transpose();
        else
          ct.noalias() += alpha * (b * a.transpose());
      }
    } else if (ta == Trans::kNo)
      run(a, b.transpose());
    else if (tb == Trans::kNo)
      run(a.transpose(), b);
    else
      run(a.transpose(), b.transpose());
  }

  // Coefficient-based product: no packing or blocking overhead for toy-sized products. Flattened: whether
  // GCC inlines Eigen's product evaluator otherwise depends on how much else the translation unit holds (an
  // outlined evaluator cost the toy model's step ~1,700 instructions, measured with callgrind).
  template <class T, class MatC, class OpA, class OpB>
  [[gnu::flatten]] static void tiny_gemm(MatC& c, T alpha, OpA const& opa, OpB const& opb, T beta) {
    if (beta == T(0)) {
      c.noalias() = alpha * opa.lazyProduct(opb);
      return;
    }
    if (beta != T(1)) c *= beta;
    c.noalias() += alpha * opa.lazyProduct(opb);
  }

  // Few rows (small batches) or a tiny inner dimension (outer products): Eigen's GEMM would pack the
  // large operand (an extra pass over, e.g., a 400 MB weight) and zero C before accumulating. These loops
  // stream the large operand once and write C once. Returns false when the shape is not skinny.
  static constexpr i64 kSkinny = 4;
  // A·Bᵀ with few rows and a long inner dimension runs as (B·Aᵀ)ᵀ (measured in bench/RESULTS.md).
  static constexpr bool transposed_nt(i64 M, i64 N, i64 K) noexcept { return M < N && K >= 1024; }
  static constexpr i64 kTinyGemm = 8192;
  static constexpr i64 kStreamBytes =
      i64{64}
      << 20;  // results this large bypass the caches  // M·N·K below which Eigen's GEMM packing costs more than it saves
  template <class T>
  static bool skinny_gemm(Trans ta, Trans tb, i64 M, i64 N, i64 K, T alpha, T const* A, T const* B, T beta, T* C) {
    using Row = Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>>;
    using CRow = Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic> const>;
    auto a_at = [&](i64 i, i64 k) { return ta == Trans::kNo ? A[i * K + k] : A[k * M + i]; };
    if (M <= kSkinny && ta == Trans::kNo && tb == Trans::kYes && K >= 64) {
      // C[r, j] = alpha A[r, :]·B[j, :] + beta C[r, j]; B (N, K) streamed row by row.
      for (i64 j = 0; j < N; ++j) {
        CRow bj(B + j * K, K);
        for (i64 r = 0; r < M; ++r) {
          T const d = alpha * (CRow(A + r * K, K) * bj).sum();
          C[r * N + j] = beta == T(0) ? d : beta * C[r * N + j] + d;
        }
      }
      return true;
    }
    if (M <= kSkinny && ta == Trans::kNo && tb == Trans::kNo) {
      // C[r, :] = beta C[r, :] + Σ_k alpha A[r, k] B[k, :]; B (K, N) streamed row by row.
      for (i64 r = 0; r < M; ++r) {
        Row c(C + r * N, N);
        if (beta == T(0))
          c.setZero();
        else if (beta != T(1))
          c *= beta;
      }
      for (i64 k = 0; k < K; ++k) {
        CRow bk(B + k * N, N);
        for (i64 r = 0; r < M; ++r) Row(C + r * N, N) += (alpha * A[r * K + k]) * bk;
      }
      return true;
    }
    if (K <= kSkinny && tb == Trans::kNo && N >= 64) {
      // Outer-product shape: C[i, :] = beta C[i, :] + Σ_k alpha op(A)[i, k] B[k, :]; C written once.
      if constexpr (std::same_as<T, float>) {
        // A fresh result far larger than the caches (a big weight's gradient) is written with streaming
        // stores: no read-for-ownership of C, which halves its memory traffic.
        if (beta == T(0) && M * N * i64(sizeof(T)) >= kStreamBytes) {
          for (i64 i = 0; i < M; ++i) {
            T coef[kSkinny];
            for (i64 k = 0; k < K; ++k) coef[k] = alpha * a_at(i, k);
            detail::stream_combination(N, K, coef, B, C + i * N);
          }
          detail::stream_fence();
          return true;
        }
      }
      for (i64 i = 0; i < M; ++i) {
        Row c(C + i * N, N);
        auto term = [&](i64 k) { return (alpha * a_at(i, k)) * CRow(B + k * N, N); };
        switch (K) {
          case 1:
            detail::assign_or_add(c, term(0), beta);
            break;
          case 2:
            detail::assign_or_add(c, term(0) + term(1), beta);
            break;
          case 3:
            detail::assign_or_add(c, term(0) + term(1) + term(2), beta);
            break;
          default:
            detail::assign_or_add(c, term(0) + term(1) + term(2) + term(3), beta);
            break;
        }
      }
      return true;
    }
    return false;
  }

  // ---- element-wise ----
  template <class T>
  static void fill(i64 n, T v, T* y) {
    detail::MapArr<T>(y, n).setConstant(v);
  }
  template <class T>
  static void copy(i64 n, T const* x, T* y) {
    if (n && x != y) std::memcpy(y, x, sizeof(T) * n);
  }
  // y = To(float(x) * scale): the casts to and from the 16-bit floats (one rounding into To).
  template <class From, class To>
  static void cast(i64 n, float scale, From const* x, To* y) {
    for (i64 i = 0; i < n; ++i) y[i] = To(static_cast<float>(x[i]) * scale);
  }
  // y = a * x + b * y  (b == 0 never reads y)
  template <class T>
  static void axpby(i64 n, T a, T const* x, T b, T* y) {
    using namespace detail;
    MapArr<T> yy(y, n);
    CMapArr<T> xx(x, n);
    if (b == T(0)) {
      if (a == T(1))
        yy = xx;
      else
        yy = a * xx;
    } else if (b == T(1)) {
      if (a == T(1))
        yy += xx;
      else
        yy += a * xx;
    } else {
      yy = a * xx + b * yy;
    }
  }
  // out = sa * a + sb * b
  template <class T>
  static void add(i64 n, T sa, T const* a, T sb, T const* b, T* out) {
    using namespace detail;
    MapArr<T>(out, n) = sa * CMapArr<T>(a, n) + sb * CMapArr<T>(b, n);
  }
  // out = a * b + beta * out
  template <class T>
  static void mul(i64 n, T const* a, T const* b, T beta, T* out) {
    using namespace detail;
    assign_or_add(MapArr<T>(out, n), CMapArr<T>(a, n) * CMapArr<T>(b, n), beta);
  }
  // y[r, c] += bias[c]   (y is (rows, cols))
  template <class T>
  static void add_row_broadcast(i64 rows, i64 cols, T const* bias, T* y) {
    using namespace detail;
    MapMat<T> yy(y, rows, cols);
    Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic> const> bb(bias, cols);
    yy.rowwise() += bb;
  }
  // y[r, c] = x[r, c] + bias[c]   (one pass; y may be x)
  template <class T>
  static void add_row_broadcast(i64 rows, i64 cols, T const* x, T const* bias, T* y) {
    using namespace detail;
    MapMat<T> yy(y, rows, cols);
    Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic> const> bb(bias, cols);
    yy = CMapMat<T>(x, rows, cols).rowwise() + bb;
  }
  // out[c] = beta * out[c] + sum_r x[r, c]. Whole rows are added (contiguous, vectorised; a column reduction over a
  // row-major matrix was 4x slower), in order, in blocks of 32 rows whose sums are then added in order: float error
  // near (32 + rows/32) ulps instead of rows ulps.
  template <class T>
  static void sum_rows(i64 rows, i64 cols, T const* x, T beta, T* out) {
    using A = Eigen::Array<T, Eigen::Dynamic, 1>;
    Eigen::Map<A> o(out, cols);
    if (beta == T(0))
      o.setZero();
    else if (beta != T(1))
      o *= beta;
    constexpr i64 kBlock = 32;
    A part(cols);
    for (i64 r0 = 0; r0 < rows; r0 += kBlock) {
      i64 const r1 = std::min(rows, r0 + kBlock);
      part = Eigen::Map<A const>(x + r0 * cols, cols);
      for (i64 r = r0 + 1; r < r1; ++r) part += Eigen::Map<A const>(x + r * cols, cols);
      o += part;
    }
  }
  // y[n, c, :] += bias[c]   (y is (N, C, HW))
  template <class T>
  static void add_channel_broadcast(i64 N, i64 C, i64 HW, T const* bias, T* y) {
    for (i64 n = 0; n < N; ++n)
      for (i64 c = 0; c < C; ++c) detail::MapArr<T>(y + (n * C + c) * HW, HW) += bias[c];
  }
  // out[c] = beta * out[c] + sum_{n, hw} x[n, c, hw]
  template <class T>
  static void sum_channels(i64 N, i64 C, i64 HW, T const* x, T beta, T* out) {
    for (i64 c = 0; c < C; ++c) {
      T s = 0;
      for (i64 n = 0; n < N; ++n) s += detail::CMapArr<T>(x + (n * C + c) * HW, HW).sum();
      out[c] = beta == T(0) ? s : beta * out[c] + s;
    }
  }
  // Dropout masks: mask[i] = 0 where element i's 32 random bits are below `threshold`, `keep` elsewhere.
  // Stream: element i's bits are value i of the PCG32 stream at (state, inc), i.e. a Generator's next n values.
  template <class T>
  static void bernoulli_mask_stream(i64 n, std::uint64_t state, std::uint64_t inc, std::uint32_t threshold, T keep,
                                    T* mask) {
    Generator g;
    g.set_state({.state = state, .inc = inc});
    std::uint32_t u[1024];
    for (i64 i0 = 0; i0 < n; i0 += 1024) {
      i64 const m = std::min<i64>(1024, n - i0);
      g.fill_u32(u, m);
      for (i64 i = 0; i < m; ++i) mask[i0 + i] = u[i] < threshold ? T(0) : keep;
    }
  }
  // Counter: element j of row r (rows of per_row elements) draws counter_u32(seed, step, first_sample + r, j).
  template <class T>
  static void bernoulli_mask_counter(i64 rows, i64 per_row, std::uint64_t seed, std::uint64_t step, i64 first_sample,
                                     std::uint32_t threshold, T keep, T* mask) {
    for (i64 r = 0; r < rows; ++r)
      for (i64 j = 0; j < per_row; ++j)
        mask[r * per_row + j] = detail::counter_u32(seed, step, first_sample + r, j) < threshold ? T(0) : keep;
  }
  // y = beta * y + v  (beta == 0 never reads y)
  template <class T>
  static void add_scalar(i64 n, T v, T beta, T* y) {
    detail::MapArr<T> yy(y, n);
    if (beta == T(0))
      yy.setConstant(v);
    else if (beta == T(1))
      yy += v;
    else
      yy = beta * yy + v;
  }
  // Element-wise copy from host memory (for masks and indices made on the host).
  template <class T>
  static void from_host(i64 n, T const* src, T* dst) {
    copy(n, src, dst);
  }
  template <class T>
  static void from_host_async(i64 n, T const* src, T* dst) {
    copy(n, src, dst);
  }
  template <class T>
  static void to_host(i64 n, T const* src, T* dst) {
    copy(n, src, dst);
  }
  template <class T>
  static T sum(i64 n, T const* x) {
    return n ? detail::CMapArr<T>(x, n).sum() : T(0);
  }
  // ||x||_p (torch.linalg.vector_norm): (Σ|x_i|^p)^(1/p) for p > 0, max |x_i| for p = +inf; 0 for n = 0; NaN
  // if any element is NaN. p = 2 and p = 1 need no pow. Accumulates in T.
  template <class T>
  static T norm(i64 n, T const* x, T p) {
    if (n == 0) return T(0);
    detail::CMapArr<T> const a(x, n);
    if (p == std::numeric_limits<T>::infinity()) return a.abs().template maxCoeff<Eigen::PropagateNaN>();
    if (p == T(2)) return std::sqrt(a.square().sum());
    if (p == T(1)) return a.abs().sum();
    return std::pow(a.abs().pow(p).sum(), T(1) / p);
  }
  // y = min(max(y, lo), hi) element-wise (lo <= hi); NaN stays NaN (both comparisons fail).
  template <class T>
  static void clamp(i64 n, T lo, T hi, T* y) {
    for (i64 i = 0; i < n; ++i) {
      T const v = y[i];
      y[i] = v < lo ? lo : (v > hi ? hi : v);
    }
  }

  // ---- activations: forward y = f(x); backward gx = beta * gx + gy * f'(.) ----
  template <class T>
  static void relu_fwd(i64 n, T const* x, T* y) {
    detail::MapArr<T>(y, n) = detail::CMapArr<T>(x, n).max(T(0));
  }
  template <class T>
  static void relu_bwd(i64 n, T const* y, T const* gy, T beta, T* gx) {
    // A plain loop: Eigen 3.4 does not vectorise select(); GCC does this at -O3.
    if (beta == T(0))
      for (i64 i = 0; i < n; ++i) gx[i] = y[i] > T(0) ? gy[i] : T(0);
    else
      for (i64 i = 0; i < n; ++i) gx[i] += y[i] > T(0) ? gy[i] : T(0);
  }
  template <class T>
  static void tanh_fwd(i64 n, T const* x, T* y) {
    detail::MapArr<T>(y, n) = detail::CMapArr<T>(x, n).tanh();
  }
  template <class T>
  static void tanh_bwd(i64 n, T const* y, T const* gy, T beta, T* gx) {
    using namespace detail;
    CMapArr<T> yy(y, n), g(gy, n);
    assign_or_add(MapArr<T>(gx, n), g * (T(1) - yy.square()), beta);
  }
  template <class T>
  static void sigmoid_fwd(i64 n, T const* x, T* y) {
    using namespace detail;
    MapArr<T>(y, n) = T(1) / (T(1) + (-CMapArr<T>(x, n)).exp());
  }
  template <class T>
  static void sigmoid_bwd(i64 n, T const* y, T const* gy, T beta, T* gx) {
    using namespace detail;
    CMapArr<T> yy(y, n), g(gy, n);
    assign_or_add(MapArr<T>(gx, n), g * yy * (T(1) - yy), beta);
  }

  // ---- softmax family over the last dim of (rows, cols) ----
  template <class T>
  static void log_softmax_fwd(i64 rows, i64 cols, T const* x, T* y) {
    for (i64 r = 0; r < rows; ++r) {
      detail::CMapArr<T> xr(x + r * cols, cols);
      T m = xr.maxCoeff();
      // (x - m) - log Σ exp(x - m): forming m + log Σ first would round it to ulp(m) (6e-5 at 1000 in float).
      T log_z = std::log((xr - m).exp().sum());
      detail::MapArr<T>(y + r * cols, cols) = (xr - m) - log_z;
    }
  }
  // gx = beta gx + gy - softmax * rowsum(gy), softmax = exp(y)
  template <class T>
  static void log_softmax_bwd(i64 rows, i64 cols, T const* y, T const* gy, T beta, T* gx) {
    for (i64 r = 0; r < rows; ++r) {
      detail::CMapArr<T> yr(y + r * cols, cols), g(gy + r * cols, cols);
      T s = g.sum();
      detail::assign_or_add(detail::MapArr<T>(gx + r * cols, cols), g - yr.exp() * s, beta);
    }
  }
  // Mean cross-entropy of logits (rows, cols) against class ids; writes softmax probabilities for backward.
  template <class T>
  static T cross_entropy_fwd(i64 rows, i64 cols, T const* logits, std::int32_t const* target, T* probs) {
    T total = 0;
    for (i64 r = 0; r < rows; ++r) {
      detail::CMapArr<T> xr(logits + r * cols, cols);
      detail::MapArr<T> pr(probs + r * cols, cols);
      T m = xr.maxCoeff();
      pr = (xr - m).exp();
      T z = pr.sum();
      pr /= z;
      total += std::log(z) - (xr[target[r]] - m);  // as in log_softmax_fwd: never form m + log z
    }
    return rows ? total / T(rows) : T(0);
  }
  // gx = beta gx + g * (probs - onehot(target)) / rows
  template <class T>
  static void cross_entropy_bwd(i64 rows, i64 cols, T const* probs, std::int32_t const* target, T g, T beta, T* gx) {
    T s = rows ? g / T(rows) : T(0);
    detail::assign_or_add(detail::MapArr<T>(gx, rows * cols), s * detail::CMapArr<T>(probs, rows * cols), beta);
    for (i64 r = 0; r < rows; ++r) gx[r * cols + target[r]] -= s;
  }
  // The same two with the loss and its gradient in the tensors' memory (loss[0], g[0]), as the autograd calls them:
  // on a device nothing comes back to the host.
  template <class T>
  static void cross_entropy_fwd(i64 rows, i64 cols, T const* logits, std::int32_t const* target, T* probs, T* loss) {
    *loss = cross_entropy_fwd(rows, cols, logits, target, probs);
  }
  template <class T>
  static void cross_entropy_bwd(i64 rows, i64 cols, T const* probs, std::int32_t const* target, T const* g, T beta,
                                T* gx) {
    cross_entropy_bwd(rows, cols, probs, target, *g, beta, gx);
  }
  // Mean negative log-likelihood of log-probabilities (rows, cols).
  template <class T>
  static T nll_fwd(i64 rows, i64 cols, T const* logp, std::int32_t const* target) {
    T total = 0;
    for (i64 r = 0; r < rows; ++r) total -= logp[r * cols + target[r]];
    return rows ? total / T(rows) : T(0);
  }
  template <class T>
  static void nll_bwd(i64 rows, i64 cols, std::int32_t const* target, T g, T beta, T* gx) {
    if (beta == T(0)) fill(rows * cols, T(0), gx);
    T s = rows ? g / T(rows) : T(0);
    for (i64 r = 0; r < rows; ++r) gx[r * cols + target[r]] -= s;
  }
  // Mean squared error over n elements.
  template <class T>
  static T mse_fwd(i64 n, T const* p, T const* t) {
    using namespace detail;
    return n ? (CMapArr<T>(p, n) - CMapArr<T>(t, n)).square().sum() / T(n) : T(0);
  }
  // gp = beta gp + g * 2 (p - t) / n
  template <class T>
  static void mse_bwd(i64 n, T const* p, T const* t, T g, T beta, T* gp) {
    using namespace detail;
    T s = n ? T(2) * g / T(n) : T(0);
    assign_or_add(MapArr<T>(gp, n), s * (CMapArr<T>(p, n) - CMapArr<T>(t, n)), beta);
  }
};

}  // namespace ddp
