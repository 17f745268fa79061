// Host kernels for image layers: conv2d (Winograd F(4×4, 3×3) for 3×3 stride-1 layers, im2col + Eigen GEMM per
// image otherwise; see ConvAlgorithm), max-pool, batch-norm.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "ddp/config.hpp"
#include "ddp/tensor/host_allocator.hpp"
#include "ddp/tensor/host_winograd.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

struct HostConvKernels {
  using i64 = std::int64_t;

  // col (C*k*k, OH*OW) from one image x (C, H, W); zero padding.
  template <class T>
  static void im2col(ConvGeometry const& g, T const* x, T* col) {
    i64 const OH = g.OH(), OW = g.OW();
    for (i64 c = 0; c < g.C; ++c)
      for (i64 ki = 0; ki < g.k; ++ki)
        for (i64 kj = 0; kj < g.k; ++kj) {
          T* row = col + ((c * g.k + ki) * g.k + kj) * OH * OW;
          for (i64 oh = 0; oh < OH; ++oh) {
            i64 ih = oh * g.stride - g.pad + ki;
            T* out = row + oh * OW;
            if (ih < 0 || ih >= g.H) {
              std::fill(out, out + OW, T(0));
              continue;
            }
            T const* in = x + (c * g.H + ih) * g.W;
            if (g.stride == 1) {
              // iw = ow - pad + kj; valid ow in [lo, hi)
              i64 lo = std::clamp<i64>(g.pad - kj, 0, OW), hi = std::clamp<i64>(g.W + g.pad - kj, 0, OW);
              std::fill(out, out + lo, T(0));
              if (hi > lo) std::memcpy(out + lo, in + lo - g.pad + kj, sizeof(T) * (hi - lo));
              std::fill(out + std::max(lo, hi), out + OW, T(0));
            } else {
              for (i64 ow = 0; ow < OW; ++ow) {
                i64 iw = ow * g.stride - g.pad + kj;
                out[ow] = (iw >= 0 && iw < g.W) ? in[iw] : T(0);
              }
            }
          }
        }
  }
  // x (C, H, W) += scatter of col (C*k*k, OH*OW)
  template <class T>
  static void col2im_add(ConvGeometry const& g, T const* col, T* x) {
    i64 const OH = g.OH(), OW = g.OW();
    for (i64 c = 0; c < g.C; ++c)
      for (i64 ki = 0; ki < g.k; ++ki)
        for (i64 kj = 0; kj < g.k; ++kj) {
          T const* row = col + ((c * g.k + ki) * g.k + kj) * OH * OW;
          for (i64 oh = 0; oh < OH; ++oh) {
            i64 ih = oh * g.stride - g.pad + ki;
            if (ih < 0 || ih >= g.H) continue;
            T* dst = x + (c * g.H + ih) * g.W;
            T const* src = row + oh * OW;
            if (g.stride == 1) {
              i64 lo = std::clamp<i64>(g.pad - kj, 0, OW), hi = std::clamp<i64>(g.W + g.pad - kj, 0, OW);
              for (i64 ow = lo; ow < hi; ++ow) dst[ow - g.pad + kj] += src[ow];
            } else {
              for (i64 ow = 0; ow < OW; ++ow) {
                i64 iw = ow * g.stride - g.pad + kj;
                if (iw >= 0 && iw < g.W) dst[iw] += src[ow];
              }
            }
          }
        }
  }

  // Whether g runs through Winograd F(4×4, 3×3) (host_winograd.hpp) rather than im2col + GEMM.
  static bool use_winograd(ConvGeometry const& g) noexcept {
    switch (g.algorithm) {
      case ConvAlgorithm::kIm2col:
        return false;
      case ConvAlgorithm::kWinograd:
        return detail::winograd::supports(g);
      case ConvAlgorithm::kAuto:
        break;
    }
    return detail::winograd::supports(g) && g.C >= 8 && g.O >= 8;
  }

  // Whether conv2d_fwd/bwd can run g with a fused 2×2, stride-2 max-pool after the ReLU (g.pool2()): the
  // Winograd path pools each image while it is still in cache.
  static bool fuses_pool2(ConvGeometry g) noexcept {
    g.epilogue = Epilogue::kReluMaxPool2;
    return use_winograd(g) && g.OH() >= 2 && g.OW() >= 2;
  }

  // y (N, O, OH, OW) = conv(x (N, C, H, W), w (O, C, k, k)) + bias (O) (bias may be null). With g.pool2()
  // (only where fuses_pool2), y is (N, O, OH/2, OW/2) and codes (N·OH/2·OW/2·O bytes) records each window's
  // winner for the backward.
  template <class T>
  static void conv2d_fwd(ConvGeometry const& g, T const* x, T const* w, T const* bias, T* y,
                         std::uint8_t* codes = nullptr) {
    DDP_ASSERT(!g.pool2() || (fuses_pool2(g) && g.relu() && codes),
               "conv2d_fwd: fused pooling needs Winograd, relu and codes");
    if (use_winograd(g)) {
      detail::HostBuffer<T> U(static_cast<std::size_t>(detail::winograd::kPos * g.O * g.C));
      detail::winograd::weight_transform(g.O, g.C, w, U.data());
      detail::winograd::forward(g, x, U.data(), bias, y, codes);
      return;
    }
    using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    i64 const L = g.L(), P = g.patch();
    detail::HostBuffer<T> col(static_cast<std::size_t>(P * L));  // recycled per thread
    Eigen::Map<Mat const> W(w, g.O, P);
    Eigen::Map<Mat const> Cm(col.data(), P, L);
    for (i64 n = 0; n < g.N; ++n) {
      im2col(g, x + n * g.C * g.H * g.W, col.data());
      Eigen::Map<Mat> Y(y + n * g.O * L, g.O, L);
      Y.noalias() = W * Cm;
      if (bias)
        for (i64 o = 0; o < g.O; ++o) Y.row(o).array() += bias[o];
      if (g.relu()) Y = Y.cwiseMax(T(0));
    }
  }

  // Backward of conv2d. Each output pointer may be null (not needed); beta (0 or 1) says whether to
  // accumulate into it (1) or overwrite it (0, never read). y is the layer's output (read when g.relu():
  // the gradient flows only where y > 0). With g.pool2(), y and gy are the pooled output and its gradient.
  template <class T>
  static void conv2d_bwd(ConvGeometry const& g, T const* x, T const* w, T const* y, T const* gy, T beta_x, T* gx,
                         T beta_w, T* gw, T beta_b, T* gb, std::uint8_t const* codes = nullptr) {
    DDP_ASSERT(!g.pool2() || (fuses_pool2(g) && codes), "conv2d_bwd: fused pooling needs Winograd and codes");
    if (use_winograd(g)) {
      detail::winograd::backward(g, x, w, gy, y, beta_x, gx, beta_w, gw, beta_b, gb, codes);
      return;
    }
    detail::HostBuffer<T> masked(static_cast<std::size_t>(g.relu() ? g.N * g.O * g.L() : 0));
    if (g.relu()) {
      i64 const n = g.N * g.O * g.L();
      T* m = masked.data();
      for (i64 i = 0; i < n; ++i) m[i] = y[i] > T(0) ? gy[i] : T(0);
      gy = m;
    }
    using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    i64 const L = g.L(), P = g.patch(), img = g.C * g.H * g.W;
    detail::HostBuffer<T> col(static_cast<std::size_t>(gw || gx ? P * L : 0));  // recycled per thread
    Eigen::Map<Mat> Cm(col.data(), P, L);
    Eigen::Map<Mat const> W(w, g.O, P);
    if (gw) {
      Eigen::Map<Mat> GW(gw, g.O, P);
      if (beta_w == T(0)) GW.setZero();
      for (i64 n = 0; n < g.N; ++n) {
        im2col(g, x + n * img, col.data());
        Eigen::Map<Mat const> GY(gy + n * g.O * L, g.O, L);
        GW.noalias() += GY * Cm.transpose();
      }
    }
    if (gb) {
      for (i64 o = 0; o < g.O; ++o) {
        T s = 0;
        for (i64 n = 0; n < g.N; ++n)
          s += Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1> const>(gy + (n * g.O + o) * L, L).sum();
        gb[o] = beta_b == T(0) ? s : gb[o] + s;
      }
    }
    if (gx) {
      if (beta_x == T(0)) std::fill(gx, gx + g.N * img, T(0));
      for (i64 n = 0; n < g.N; ++n) {
        Eigen::Map<Mat const> GY(gy + n * g.O * L, g.O, L);
        Cm.noalias() = W.transpose() * GY;
        col2im_add(g, col.data(), gx + n * img);
      }
    }
  }

  // Max pool over planes (N*C planes of H x W); idx holds each output's argmax within its plane.
  template <class T>
  static void maxpool_fwd(ConvGeometry const& g, T const* x, T* y, std::int32_t* idx) {
    i64 const OH = g.OH(), OW = g.OW(), planes = g.N * g.C;
    if (g.k == 2 && g.stride == 2) {  // the common case: a loop the compiler vectorises
      auto const W = static_cast<std::int32_t>(g.W);
      for (i64 p = 0; p < planes; ++p) {
        T const* in = x + p * g.H * g.W;
        for (i64 oh = 0; oh < OH; ++oh) {
          T const* r0 = in + (2 * oh) * g.W;
          T const* r1 = r0 + g.W;
          T* yo = y + (p * OH + oh) * OW;
          std::int32_t* io = idx + (p * OH + oh) * OW;
          auto const base = static_cast<std::int32_t>(2 * oh * g.W);
          i64 ow = 0;
#if defined(__AVX2__)
          if constexpr (std::is_same_v<T, float>) {
            for (; ow + 8 <= OW; ow += 8) {  // 8 windows: split both rows into even and odd columns
              auto split = [](float const* r, __m256& even, __m256& odd) {
                __m256 const lo = _mm256_loadu_ps(r), hi = _mm256_loadu_ps(r + 8);
                even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xD8));
                odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xDD)), 0xD8));
              };
              __m256 a, b, c, d;
              split(r0 + 2 * ow, a, b);
              split(r1 + 2 * ow, c, d);
              __m256 m = a, k = _mm256_setzero_ps();  // k: offset in the window, as float bits of an int
              auto take = [&](__m256 v, std::int32_t off) {
                __m256 const t = _mm256_or_ps(_mm256_cmp_ps(v, m, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
                m = _mm256_blendv_ps(m, v, t);
                k = _mm256_blendv_ps(k, _mm256_castsi256_ps(_mm256_set1_epi32(off)), t);
              };
              take(b, 1);
              take(c, W);
              take(d, W + 1);
              _mm256_storeu_ps(yo + ow, m);
              __m256i const pos = _mm256_add_epi32(_mm256_set1_epi32(base + static_cast<std::int32_t>(2 * ow)),
                                                   _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
              _mm256_storeu_si256(reinterpret_cast<__m256i*>(io + ow), _mm256_add_epi32(pos, _mm256_castps_si256(k)));
            }
          }
#endif
          for (; ow < OW; ++ow) {
            // Window order r0[j], r0[j+1], r1[j], r1[j+1]; a later value wins if larger or NaN (as PyTorch).
            T const a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
            T m = a;
            std::int32_t k = 0;
            bool t = (b > m) | (b != b);
            m = t ? b : m, k = t ? 1 : k;
            t = (c > m) | (c != c);
            m = t ? c : m, k = t ? W : k;
            t = (d > m) | (d != d);
            m = t ? d : m, k = t ? W + 1 : k;
            yo[ow] = m;
            io[ow] = base + static_cast<std::int32_t>(2 * ow) + k;
          }
        }
      }
      return;
    }
    for (i64 p = 0; p < planes; ++p) {
      T const* in = x + p * g.H * g.W;
      for (i64 oh = 0; oh < OH; ++oh)
        for (i64 ow = 0; ow < OW; ++ow) {
          i64 best = (oh * g.stride) * g.W + ow * g.stride;
          T bv = in[best];
          for (i64 ki = 0; ki < g.k; ++ki)
            for (i64 kj = 0; kj < g.k; ++kj) {
              i64 j = (oh * g.stride + ki) * g.W + ow * g.stride + kj;
              // NaN propagates, as in PyTorch
              if (in[j] > bv || std::isnan(in[j])) {
                bv = in[j];
                best = j;
              }
            }
          y[(p * OH + oh) * OW + ow] = bv;
          idx[(p * OH + oh) * OW + ow] = static_cast<std::int32_t>(best);
        }
    }
  }
  template <class T>
  static void maxpool_bwd(ConvGeometry const& g, T const* gy, std::int32_t const* idx, T beta, T* gx) {
    i64 const L = g.L(), planes = g.N * g.C, HW = g.H * g.W;
    if (beta == T(0)) std::fill(gx, gx + planes * HW, T(0));
    for (i64 p = 0; p < planes; ++p)
      for (i64 l = 0; l < L; ++l) gx[p * HW + idx[p * L + l]] += gy[p * L + l];
  }

  // Batch norm over (N, C, HW). Training: normalise with the batch's biased variance, return per-channel
  // mean and invstd (and the unbiased variance for the running estimate).
  template <class T>
  static void batchnorm_fwd_train(i64 N, i64 C, i64 HW, T const* x, T const* gamma, T const* beta_, T eps, T* y,
                                  T* mean, T* invstd, T* var_unbiased) {
    i64 const M = N * HW;
    for (i64 c = 0; c < C; ++c) {
      double s = 0, ss = 0;
      for (i64 n = 0; n < N; ++n) {
        T const* xp = x + (n * C + c) * HW;
        for (i64 i = 0; i < HW; ++i) s += xp[i];
      }
      double m = M ? s / double(M) : 0.0;
      for (i64 n = 0; n < N; ++n) {
        T const* xp = x + (n * C + c) * HW;
        for (i64 i = 0; i < HW; ++i) ss += (xp[i] - m) * (xp[i] - m);
      }
      double var = M ? ss / double(M) : 0.0;
      T is = T(1.0 / std::sqrt(var + double(eps)));
      mean[c] = T(m);
      invstd[c] = is;
      var_unbiased[c] = M > 1 ? T(ss / double(M - 1)) : T(var);
      T a = gamma ? gamma[c] * is : is, b = (beta_ ? beta_[c] : T(0)) - a * T(m);
      for (i64 n = 0; n < N; ++n) {
        T const* xp = x + (n * C + c) * HW;
        T* yp = y + (n * C + c) * HW;
        for (i64 i = 0; i < HW; ++i) yp[i] = a * xp[i] + b;
      }
    }
  }
  // out[c] = 1 / sqrt(var[c] + eps)
  template <class T>
  static void rsqrt_eps(i64 n, T const* var, T eps, T* out) {
    for (i64 i = 0; i < n; ++i) out[i] = T(1) / std::sqrt(var[i] + eps);
  }
  // Evaluation: y = gamma * (x - mean) * invstd + beta, with given per-channel mean/invstd.
  template <class T>
  static void batchnorm_fwd_eval(i64 N, i64 C, i64 HW, T const* x, T const* gamma, T const* beta_, T const* mean,
                                 T const* invstd, T* y) {
    for (i64 c = 0; c < C; ++c) {
      T a = gamma ? gamma[c] * invstd[c] : invstd[c], b = (beta_ ? beta_[c] : T(0)) - a * mean[c];
      for (i64 n = 0; n < N; ++n) {
        T const* xp = x + (n * C + c) * HW;
        T* yp = y + (n * C + c) * HW;
        for (i64 i = 0; i < HW; ++i) yp[i] = a * xp[i] + b;
      }
    }
  }
  // Backward. `training` selects whether mean/invstd were batch statistics (gradient flows through them)
  // or constants (eval). Null outputs are skipped; betas as in conv2d_bwd.
  template <class T>
  static void batchnorm_bwd(bool training, i64 N, i64 C, i64 HW, T const* x, T const* gamma, T const* mean,
                            T const* invstd, T const* gy, T beta_x, T* gx, T beta_g, T* ggamma, T beta_b, T* gbeta) {
    i64 const M = N * HW;
    for (i64 c = 0; c < C; ++c) {
      double sg = 0, sgx = 0;
      for (i64 n = 0; n < N; ++n) {
        T const* xp = x + (n * C + c) * HW;
        T const* gp = gy + (n * C + c) * HW;
        for (i64 i = 0; i < HW; ++i) {
          sg += gp[i];
          sgx += gp[i] * (xp[i] - mean[c]);
        }
      }
      T is = invstd[c];
      T sum_g = T(sg), sum_gxhat = T(sgx) * is;
      if (ggamma) ggamma[c] = beta_g == T(0) ? sum_gxhat : ggamma[c] + sum_gxhat;
      if (gbeta) gbeta[c] = beta_b == T(0) ? sum_g : gbeta[c] + sum_g;
      if (!gx) continue;
      T gm = gamma ? gamma[c] : T(1);
      for (i64 n = 0; n < N; ++n) {
        T const* xp = x + (n * C + c) * HW;
        T const* gp = gy + (n * C + c) * HW;
        T* op = gx + (n * C + c) * HW;
        for (i64 i = 0; i < HW; ++i) {
          T v;
          if (training) {
            T xhat = (xp[i] - mean[c]) * is;
            v = gm * is / T(M) * (T(M) * gp[i] - sum_g - xhat * sum_gxhat);
          } else {
            v = gm * is * gp[i];
          }
          op[i] = beta_x == T(0) ? v : op[i] + v;
        }
      }
    }
  }
};

}  // namespace ddp
