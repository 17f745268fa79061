// The host transformer kernels' row loops on Eigen's packets (detail::SoftmaxRow, detail::LayerNormRow), against
// double-precision references: lengths on both sides of every packet width (SSE 4, AVX 8, AVX-512 16 floats), so
// the whole-packet loops and the tails both run, whichever instruction set the build targets. The fused attention that
// uses the softmax rows is tested in host_gemm_test.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ddp/ddp.hpp"

using namespace ddp;

namespace {
using i64 = std::int64_t;

// The softmax rows attention runs on (detail::SoftmaxRow, on Eigen's packets): every length around the packet
// widths (4, 8, 16 lanes), plain and causal, out of place and in place, float and double, against double. The masked
// entries hold NaN: they must never reach a result, and come out exactly 0.
template <class T>
void softmax_rows_against_double() {
  T const nan = std::numeric_limits<T>::quiet_NaN();
  for (i64 cols : {1, 3, 4, 7, 8, 9, 15, 16, 17, 31, 33, 64, 65}) {
    CAPTURE(cols);
    Generator g(static_cast<std::uint64_t>(cols));
    double const scale = 0.37;
    for (SoftmaxMask mask : {SoftmaxMask::kNone, SoftmaxMask::kCausal}) {
      i64 const rows = cols + 2;  // causal: two more rows than a block, the second block's first rows
      std::vector<T> x(rows * cols), gy(rows * cols);
      for (auto& v : x) v = g.uniform<T>(-4, 4);
      for (auto& v : gy) v = g.uniform<T>(-1, 1);
      auto live = [&](i64 r) { return mask == SoftmaxMask::kCausal ? r % cols + 1 : cols; };
      for (i64 r = 0; r < rows; ++r)
        for (i64 j = live(r); j < cols; ++j) x[r * cols + j] = gy[r * cols + j] = nan;
      std::vector<T> y(rows * cols, nan), inplace(x);
      Kernels<HostSpace>::softmax_fwd(rows, cols, T(scale), mask, x.data(), y.data());
      Kernels<HostSpace>::softmax_fwd(rows, cols, T(scale), mask, inplace.data(), inplace.data());
      CHECK(inplace == y);
      std::vector<T> gx(gy);  // the causal backward, in place (attention's dS), from the float forward's y
      if (mask == SoftmaxMask::kCausal)
        for (i64 b = 0; b < rows / cols; ++b)
          Kernels<HostSpace>::softmax_bwd_causal(cols, T(scale), y.data() + b * cols * cols,
                                                 gx.data() + b * cols * cols);
      double worst = 0, worst_g = 0;
      i64 masked_nonzero = 0;
      for (i64 r = 0; r < rows; ++r) {
        i64 const n = live(r);
        double m = -1e300, z = 0, dot = 0;
        for (i64 j = 0; j < n; ++j) m = std::max(m, double(x[r * cols + j]));
        for (i64 j = 0; j < n; ++j) z += std::exp((double(x[r * cols + j]) - m) * scale);
        for (i64 j = 0; j < n; ++j) dot += double(y[r * cols + j]) * double(gy[r * cols + j]);
        for (i64 j = 0; j < n; ++j) {
          double const p = std::exp((double(x[r * cols + j]) - m) * scale) / z;
          double const e = std::abs(p - double(y[r * cols + j]));
          if (!(e <= worst)) worst = std::isnan(e) ? 1e9 : e;
          if (mask == SoftmaxMask::kCausal && r < rows / cols * cols) {
            double const gr = scale * double(y[r * cols + j]) * (double(gy[r * cols + j]) - dot);
            double const eg = std::abs(gr - double(gx[r * cols + j]));
            if (!(eg <= worst_g)) worst_g = std::isnan(eg) ? 1e9 : eg;
          }
        }
        for (i64 j = n; j < cols; ++j) {
          masked_nonzero += !(y[r * cols + j] == T(0) && !std::signbit(y[r * cols + j]));
          if (mask == SoftmaxMask::kCausal && r < rows / cols * cols) masked_nonzero += gx[r * cols + j] != T(0);
        }
      }
      CHECK(worst < 1e-6);
      CHECK(worst_g < 1e-6);
      CHECK(masked_nonzero == 0);
    }
  }
}

// The layer norm rows (detail::LayerNormRow, on Eigen's packets): widths around every packet width, with and without
// weight and bias, gradients overwritten and added, float and double, against double.
template <class T>
void layer_norm_rows_against_double() {
  for (i64 cols : {1, 3, 4, 7, 8, 9, 15, 16, 17, 31, 33, 128, 130}) {
    CAPTURE(cols);
    for (int affine = 0; affine < 2; ++affine) {
      CAPTURE(affine);
      i64 const rows = 3;
      Generator g(static_cast<std::uint64_t>(cols * 2 + affine));
      std::vector<T> x(rows * cols), gy(rows * cols), w(cols), b(cols);
      for (auto& v : x) v = g.uniform<T>(-2, 3);
      for (auto& v : gy) v = g.uniform<T>(-1, 1);
      for (auto& v : w) v = g.uniform<T>(0.5, 1.5);
      for (auto& v : b) v = g.uniform<T>(-1, 1);
      T const* wp = affine ? w.data() : nullptr;
      T const* bp = affine ? b.data() : nullptr;
      double const eps = 1e-5;
      std::vector<T> y(rows * cols), mean(rows), rstd(rows), gx(rows * cols), gw(cols, T(2)), gb(cols, T(2)),
          gx1(rows * cols, T(1));
      Kernels<HostSpace>::layer_norm_fwd(rows, cols, T(eps), x.data(), wp, bp, y.data(), mean.data(), rstd.data());
      Kernels<HostSpace>::layer_norm_bwd(rows, cols, x.data(), mean.data(), rstd.data(), wp, gy.data(), T(0), gx.data(),
                                         T(1), gw.data(), T(0), gb.data());
      Kernels<HostSpace>::layer_norm_bwd(rows, cols, x.data(), mean.data(), rstd.data(), wp, gy.data(), T(1),
                                         gx1.data(), T(0), static_cast<T*>(nullptr), T(0), static_cast<T*>(nullptr));
      double worst = 0;
      auto track = [&](double ref, T got) {
        double const e = std::abs(ref - double(got)) / std::max(1.0, std::abs(ref));
        if (!(e <= worst)) worst = std::isnan(e) ? 1e9 : e;
      };
      std::vector<double> rgw(cols, 2.0), rgb(cols, 0.0);
      for (i64 r = 0; r < rows; ++r) {
        double m = 0, v = 0;
        for (i64 j = 0; j < cols; ++j) m += x[r * cols + j];
        m /= double(cols);
        for (i64 j = 0; j < cols; ++j) v += (x[r * cols + j] - m) * (x[r * cols + j] - m);
        double const rs = 1.0 / std::sqrt(v / double(cols) + eps);
        track(m, mean[r]);
        track(rs, rstd[r]);
        double mg = 0, mgx = 0;
        for (i64 j = 0; j < cols; ++j) {
          double const xh = (x[r * cols + j] - m) * rs, wj = affine ? double(w[j]) : 1.0;
          track(xh * wj + (affine ? double(b[j]) : 0.0), y[r * cols + j]);
          rgw[j] += gy[r * cols + j] * xh;
          rgb[j] += gy[r * cols + j];
          mg += gy[r * cols + j] * wj;
          mgx += gy[r * cols + j] * wj * xh;
        }
        mg /= double(cols);
        mgx /= double(cols);
        for (i64 j = 0; j < cols; ++j) {
          double const xh = (x[r * cols + j] - m) * rs, wj = affine ? double(w[j]) : 1.0;
          double const ref = rs * (gy[r * cols + j] * wj - mg - xh * mgx);
          track(ref, gx[r * cols + j]);
          track(1.0 + ref, gx1[r * cols + j]);
        }
      }
      for (i64 j = 0; j < cols; ++j) {
        track(rgw[j], gw[j]);
        track(rgb[j], gb[j]);
      }
      CHECK(worst < (sizeof(T) == 4 ? 2e-5 : 1e-12));
    }
  }
}
}  // namespace

TEST_CASE("softmax rows on packets: lengths around every packet width, plain and causal, in place, NaN masked") {
  softmax_rows_against_double<float>();
  softmax_rows_against_double<double>();
}

TEST_CASE("layer norm rows on packets: widths around every packet width, affine or not, gradients set and added") {
  layer_norm_rows_against_double<float>();
  layer_norm_rows_against_double<double>();
}
