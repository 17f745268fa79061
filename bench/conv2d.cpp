// bench/conv2d: one convolution layer's forward, data gradient and weight gradient, single thread, for
// each host algorithm (im2col + GEMM, Winograd F(4x4, 3x3)), with the Winograd parts broken down.
//   bazel run //bench:conv2d -- [N C O H W pad]     (default: BasicNet's conv2, 64 x 32 -> 64, 26 x 26)
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <ddp/ddp.hpp>

using namespace ddp;
using Clock = std::chrono::steady_clock;

namespace {
template <class F>
double median_ms(F&& f, int iters = 30) {
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> t(iters);
  for (auto& v : t) {
    auto t0 = Clock::now();
    f();
    v = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
  std::nth_element(t.begin(), t.begin() + iters / 2, t.end());
  return t[iters / 2];
}
}  // namespace

int main(int argc, char** argv) {
  std::int64_t a[6] = {64, 32, 64, 26, 26, 0};
  for (int i = 1; i < argc && i <= 6; ++i) a[i - 1] = std::atoll(argv[i]);
  ConvGeometry g{.N = a[0], .C = a[1], .H = a[3], .W = a[4], .O = a[2], .k = 3, .stride = 1, .pad = a[5]};
  double const gflop = 2.0 * g.N * g.O * g.L() * g.C * 9 / 1e9;  // direct multiply-adds of one pass
  std::printf("conv2d 3x3: x [%ld, %ld, %ld, %ld] -> O %ld, pad %ld; %.3f GFLOP per pass (direct); Eigen SIMD: %s\n",
              g.N, g.C, g.H, g.W, g.O, g.pad, gflop, Eigen::SimdInstructionSetsInUse());
  Generator gen(1);
  std::vector<float> x(g.N * g.C * g.H * g.W), w(g.O * g.C * 9), b(g.O), y(g.N * g.O * g.L()), gy(y.size()),
      gx(x.size()), gw(w.size()), gb(b.size());
  for (auto* v : {&x, &w, &b, &gy})
    for (auto& e : *v) e = gen.uniform(-1.0f, 1.0f);
  using K = Kernels<HostSpace>;
  for (ConvAlgorithm algo : {ConvAlgorithm::kIm2col, ConvAlgorithm::kWinograd}) {
    g.algorithm = algo;
    double const f = median_ms([&] { K::conv2d_fwd(g, x.data(), w.data(), b.data(), y.data()); });
    double const d = median_ms([&] {
      K::conv2d_bwd(g, x.data(), w.data(), y.data(), gy.data(), 0.0f, gx.data(), 0.0f, static_cast<float*>(nullptr),
                    0.0f, static_cast<float*>(nullptr));
    });
    double const wg = median_ms([&] {
      K::conv2d_bwd(g, x.data(), w.data(), y.data(), gy.data(), 0.0f, static_cast<float*>(nullptr), 0.0f, gw.data(),
                    0.0f, static_cast<float*>(nullptr));
    });
    double const both = median_ms([&] {
      K::conv2d_bwd(g, x.data(), w.data(), y.data(), gy.data(), 0.0f, gx.data(), 0.0f, gw.data(), 0.0f, gb.data());
    });
    std::printf(
        "%-9s forward %7.2f ms   data grad %7.2f ms   weight grad %7.2f ms   whole backward %7.2f ms   "
        "forward + backward %7.2f ms\n",
        algo == ConvAlgorithm::kIm2col ? "im2col" : "winograd", f, d, wg, both, f + both);
  }
  // Winograd parts: one pass of each transform over the whole batch, and the 36 GEMMs of one pass.
  namespace wd = detail::winograd;
  wd::Tiling const tl(g, sizeof(float));
  std::int64_t const ct = tl.chunk_tiles();
  std::vector<float> V(wd::kPos * g.C * ct + 64), M(wd::kPos * g.O * ct + 64), U(wd::kPos * g.O * g.C);
  wd::Scratch<float> s(tl, g);
  wd::weight_transform(g.O, g.C, w.data(), U.data());
  auto each_chunk = [&](auto&& fn) {
    for (std::int64_t n0 = 0; n0 < g.N; n0 += tl.images_per_chunk) fn(n0, std::min(tl.images_per_chunk, g.N - n0));
  };
  double const it = median_ms(
      [&] { each_chunk([&](auto n0, auto cn) { wd::input_transform(g, tl, x.data(), n0, cn, V.data(), s); }); });
  double const ot = median_ms([&] {
    each_chunk([&](auto n0, auto cn) {
      wd::output_transform(g, tl, M.data(), b.data(), n0, cn, y.data(), static_cast<std::uint8_t*>(nullptr), s);
    });
  });
  double const oa = median_ms([&] {
    each_chunk([&](auto n0, auto cn) {
      wd::output_adjoint(g, tl, gy.data(), static_cast<float const*>(nullptr),
                         static_cast<std::uint8_t const*>(nullptr), n0, cn, M.data(), static_cast<float*>(nullptr), s);
    });
  });
  double const gm = median_ms([&] {
    each_chunk([&](auto, auto cn) {
      std::int64_t const tc = cn * tl.per_image;
      for (int xi = 0; xi < wd::kPos; ++xi)
        Eigen::Map<wd::RowMat<float>>(M.data() + xi * tc * g.O, tc, g.O).noalias() =
            Eigen::Map<wd::RowMat<float> const>(V.data() + xi * tc * g.C, tc, g.C) *
            Eigen::Map<wd::RowMat<float> const>(U.data() + xi * g.O * g.C, g.O, g.C).transpose();
    });
  });
  double const gemm_gflop = 2.0 * wd::kPos * g.O * g.C * tl.per_image * g.N / 1e9;
  std::printf(
      "winograd parts (one pass, %ld tiles in chunks of %ld images): input transform %.2f ms, output "
      "transform %.2f ms, output adjoint %.2f ms, 36 GEMMs %.2f ms (%.1f GFLOP/s)\n",
      tl.per_image * g.N, tl.images_per_chunk, it, ot, oa, gm, gemm_gflop / gm * 1e3);
  return 0;
}
