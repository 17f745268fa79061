// Kernels<DeviceSpace> against Kernels<HostSpace> on random inputs, float and double, every kernel: bitwise where
// both do one rounding per element in the same order (element-wise ops, pooling, batch-norm, optimizer updates,
// and GEMM/convolution, which the CPU device system delegates to the host kernels), to a few ulps where sums or
// exp/log/tanh may differ. Built with g++ on Thrust's CPU system (//:ddp_device_cpu); with nvcc on CUDA the same
// file runs on the GPU (//test/tensor:device_kernels_cuda_test, tagged gpu).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/tensor/device.hpp"

using namespace ddp;

namespace {

using i64 = std::int64_t;
using H = Kernels<HostSpace>;
using D = Kernels<DeviceSpace>;

template <class T>
std::vector<T> random(i64 n, Generator& g, double lo = -1.0, double hi = 1.0) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& e : v) e = static_cast<T>(g.uniform(lo, hi));
  return v;
}
template <class T>
Tensor<T, DeviceSpace> up(std::vector<T> const& v) {
  Tensor<T, DeviceSpace> t(Shape{static_cast<i64>(v.size())});
  D::from_host(static_cast<i64>(v.size()), v.data(), t.data());
  return t;
}
template <class T>
std::vector<T> down(Tensor<T, DeviceSpace> const& t) {
  std::vector<T> v(static_cast<std::size_t>(t.numel()));
  D::to_host(t.numel(), t.data(), v.data());
  return v;
}

// Tolerance per element type: 0 asks for bitwise equality (NaN equals NaN).
template <class T>
constexpr double ulps(int k) {
  return k * double(std::numeric_limits<T>::epsilon());
}
// Bitwise on the CPU device system (this test is compiled with -ffp-contract=off: with contraction, GCC fuses
// a·x + b·y into an FMA in one loop and not the other, a 1-ulp difference); on a GPU, nvcc contracts.
template <class T>
constexpr double exact() {
  return DeviceSystem::is_cuda ? ulps<T>(8) : 0.0;
}
// GEMM and convolution: the host's own kernels on the CPU system (bitwise); cuBLAS/cuDNN sum in other orders.
template <class T>
constexpr double blas() {
  return DeviceSystem::is_cuda ? (sizeof(T) == 4 ? 1e-5 : 1e-12) : 0.0;
}
// Convolution: both sides may take Winograd (the host for 3x3 stride 1; cuDNN picks its own engine), whose
// transforms round more than a direct sum. Measured on an H100 (cuDNN 9, 2026-11-24): up to 1.6e-5 in fp32
// for gw of the 8-channel 3x3 case, so 1e-5 was too tight; 5e-5 keeps a 3x margin.
template <class T>
constexpr double conv() {
  return DeviceSystem::is_cuda ? (sizeof(T) == 4 ? 5e-5 : 1e-12) : 0.0;
}

template <class T>
void expect_close(std::string const& what, std::vector<T> const& host, std::vector<T> const& dev, double rtol) {
  INFO(what);
  REQUIRE(host.size() == dev.size());
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < host.size(); ++i) {
    double const a = double(host[i]), b = double(dev[i]);
    if (std::isnan(a) && std::isnan(b)) continue;
    double const e = rtol == 0 ? (std::memcmp(&host[i], &dev[i], sizeof(T)) == 0 ? 0.0 : INFINITY)
                               : std::abs(a - b) / std::max(1.0, std::abs(a));
    if (!(e <= worst)) worst = e, at = i;
  }
  CHECK_MESSAGE(worst <= rtol, what << ": element " << at << " host " << double(host[at]) << " device "
                                    << double(dev[at]) << " (error " << worst << ", tolerance " << rtol << ")");
}
template <class T>
void expect_close(std::string const& what, T host, T dev, double rtol) {
  expect_close(what, std::vector<T>{host}, std::vector<T>{dev}, rtol);
}

}  // namespace

TEST_CASE("DeviceSystem: the CPU system is host-accessible, CUDA is not") {
  CHECK(host_accessible_v<DeviceSpace> == DeviceSystem::host_accessible);
  CHECK(HostAccessibleSpaces::contains<DeviceSpace> == DeviceSystem::host_accessible);
  CHECK(DeviceSystem::host_accessible == !DeviceSystem::is_cuda);
  CHECK((DeviceSystem::name == "cuda") == DeviceSystem::is_cuda);
  MESSAGE("device system: ", DeviceSystem::name);
}

TEST_CASE("device tensors: allocation, from_host/to_host round trip, item(), to_space") {
  Generator g(1);
  auto h = random<float>(1000, g);
  auto d = up(h);
  CHECK(down(d) == h);
  Tensor<float> host(Shape{1});
  host[0] = 2.5f;
  CHECK(to_space<DeviceSpace>(host).item() == 2.5f);
  Tensor<std::int32_t> ids(Shape{3});
  ids[0] = 7, ids[1] = -1, ids[2] = 3;
  auto dids = to_space<DeviceSpace>(ids);
  std::vector<std::int32_t> back(3);
  D::to_host(3, dids.data(), back.data());
  CHECK(back == std::vector<std::int32_t>{7, -1, 3});
  Tensor<double, DeviceSpace> empty(Shape{0});
  CHECK(empty.defined());
}

TEST_CASE_TEMPLATE("dropout masks (a generator's stream, the counter draw) equal the host's bitwise", T, float,
                   double) {
  // Sizes around the device kernel's 65536-thread stride, so threads write one element, several, or none.
  for (i64 n : {i64{0}, i64{1}, i64{1000}, i64{65536}, i64{65537}, i64{200003}}) {
    for (double p : {0.25, 0.5}) {
      INFO("n ", n, " p ", p);
      auto const threshold = static_cast<std::uint32_t>(p * 4294967296.0);
      T const keep = T(1.0 / (1.0 - p));
      Generator g(11, 3);
      (void)g.next_u32();
      GeneratorState const at = g.state();
      std::vector<T> hm(static_cast<std::size_t>(n));
      Tensor<T, DeviceSpace> dm(Shape{n});
      H::bernoulli_mask_stream(n, at.state, at.inc, threshold, keep, hm.data());
      D::bernoulli_mask_stream(n, at.state, at.inc, threshold, keep, dm.data());
      CHECK(down(dm) == hm);
      i64 zeros = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        T const want = g.next_u32() < threshold ? T(0) : keep;  // the generator's own values, in order
        if (hm[static_cast<std::size_t>(i)] != want) FAIL_CHECK("stream mask ", i, " is not the generator's value");
        zeros += hm[static_cast<std::size_t>(i)] == T(0);
      }
      if (n >= 1000) CHECK(std::abs(double(zeros) / double(n) - p) < 0.05);
      i64 const rows = 7, per_row = n / 7;
      H::bernoulli_mask_counter(rows, per_row, 42, 9, 100, threshold, keep, hm.data());
      D::bernoulli_mask_counter(rows, per_row, 42, 9, 100, threshold, keep, dm.data());
      std::vector<T> const got = down(dm);
      CHECK(std::equal(hm.begin(), hm.begin() + rows * per_row, got.begin()));
    }
  }
}

TEST_CASE_TEMPLATE("element-wise kernels equal the host's bitwise", T, float, double) {
  Generator g(2);
  i64 const n = 1037;
  auto x = random<T>(n, g), y0 = random<T>(n, g), b = random<T>(n, g);
  auto dx = up(x), db = up(b);
  auto run = [&](char const* name, auto host_op, auto dev_op) {
    auto hy = y0;
    auto dy = up(y0);
    host_op(hy.data());
    dev_op(dy.data());
    expect_close(name, hy, down(dy), exact<T>());
  };
  run(
      "fill", [&](T* y) { H::fill(n, T(0.25), y); }, [&](T* y) { D::fill(n, T(0.25), y); });
  run(
      "copy", [&](T* y) { H::copy(n, x.data(), y); }, [&](T* y) { D::copy(n, dx.data(), y); });
  for (T a : {T(1), T(0.3)})
    for (T beta : {T(0), T(1), T(0.5)}) {
      run(
          "axpby", [&](T* y) { H::axpby(n, a, x.data(), beta, y); }, [&](T* y) { D::axpby(n, a, dx.data(), beta, y); });
      run(
          "mul", [&](T* y) { H::mul(n, x.data(), b.data(), beta, y); },
          [&](T* y) { D::mul(n, dx.data(), db.data(), beta, y); });
      run(
          "add_scalar", [&](T* y) { H::add_scalar(n, a, beta, y); }, [&](T* y) { D::add_scalar(n, a, beta, y); });
    }
  run(
      "add", [&](T* y) { H::add(n, T(1), x.data(), T(-0.5), b.data(), y); },
      [&](T* y) { D::add(n, T(1), dx.data(), T(-0.5), db.data(), y); });
  i64 const cols = 17, rows = 61;  // 1037 = 61 · 17
  run(
      "add_row_broadcast", [&](T* y) { H::add_row_broadcast(rows, cols, b.data(), y); },
      [&](T* y) { D::add_row_broadcast(rows, cols, db.data(), y); });
  run(
      "add_row_broadcast (y = x + bias)", [&](T* y) { H::add_row_broadcast(rows, cols, x.data(), b.data(), y); },
      [&](T* y) { D::add_row_broadcast(rows, cols, dx.data(), db.data(), y); });
  run(
      "add_channel_broadcast", [&](T* y) { H::add_channel_broadcast(1, 61, 17, b.data(), y); },
      [&](T* y) { D::add_channel_broadcast(1, 61, 17, db.data(), y); });
  run(
      "relu_fwd", [&](T* y) { H::relu_fwd(n, x.data(), y); }, [&](T* y) { D::relu_fwd(n, dx.data(), y); });
  for (T beta : {T(0), T(1)})
    run(
        "relu_bwd", [&](T* y) { H::relu_bwd(n, x.data(), b.data(), beta, y); },
        [&](T* y) { D::relu_bwd(n, dx.data(), db.data(), beta, y); });
  run(
      "rsqrt_eps", [&](T* y) { H::rsqrt_eps(n, b.data(), T(2), y); },
      [&](T* y) { D::rsqrt_eps(n, db.data(), T(2), y); });
  run(
      "clamp", [&](T* y) { H::clamp(n, T(-0.3), T(0.4), y); }, [&](T* y) { D::clamp(n, T(-0.3), T(0.4), y); });
  std::vector<T> nan_y{T(-2), std::numeric_limits<T>::quiet_NaN(), T(2)};
  auto dn = up(nan_y);
  D::clamp(3, T(-1), T(1), dn.data());
  auto const clamped = down(dn);
  CHECK(clamped[0] == T(-1));
  CHECK(std::isnan(clamped[1]));
  CHECK(clamped[2] == T(1));
}

TEST_CASE_TEMPLATE("reductions and transcendental activations agree to a few ulps", T, float, double) {
  Generator g(3);
  i64 const rows = 37, cols = 29, n = rows * cols;
  auto x = random<T>(n, g), gy = random<T>(n, g), y0 = random<T>(n, g);
  auto dx = up(x), dgy = up(gy);
  double const tol = ulps<T>(64);
  expect_close("sum", H::sum(n, x.data()), D::sum(n, dx.data()), tol);
  for (T p : {T(1), T(2), T(3), std::numeric_limits<T>::infinity()})
    expect_close("norm", H::norm(n, x.data(), p), D::norm(n, dx.data(), p), tol);
  auto xn = x;  // a NaN survives the max in any combining order, and the sums
  xn[n / 2] = std::numeric_limits<T>::quiet_NaN();
  auto dxn = up(xn);
  for (T p : {T(2), std::numeric_limits<T>::infinity()}) CHECK(std::isnan(D::norm(n, dxn.data(), p)));
  for (T beta : {T(0), T(1)}) {
    std::vector<T> h(y0.begin(), y0.begin() + cols);
    auto d = up(h);
    H::sum_rows(rows, cols, x.data(), beta, h.data());
    D::sum_rows(rows, cols, dx.data(), beta, d.data());
    expect_close("sum_rows", h, down(d), tol);
    std::vector<T> hc(y0.begin(), y0.begin() + 37);
    auto dc = up(hc);
    H::sum_channels(1, 37, 29, x.data(), beta, hc.data());
    D::sum_channels(1, 37, 29, dx.data(), beta, dc.data());
    expect_close("sum_channels", hc, down(dc), tol);
  }
  auto act = [&](char const* name, auto hf, auto df, auto hb, auto db) {
    std::vector<T> hy(n);
    auto dy = up(hy);
    hf(n, x.data(), hy.data());
    df(n, dx.data(), dy.data());
    expect_close(std::string(name) + " fwd", hy, down(dy), tol);
    for (T beta : {T(0), T(1)}) {
      auto hg = y0;
      auto dg = up(y0);
      hb(n, hy.data(), gy.data(), beta, hg.data());
      db(n, dy.data(), dgy.data(), beta, dg.data());
      expect_close(std::string(name) + " bwd", hg, down(dg), tol);
    }
  };
  act(
      "tanh", [](auto... a) { H::tanh_fwd(a...); }, [](auto... a) { D::tanh_fwd(a...); },
      [](auto... a) { H::tanh_bwd(a...); }, [](auto... a) { D::tanh_bwd(a...); });
  act(
      "sigmoid", [](auto... a) { H::sigmoid_fwd(a...); }, [](auto... a) { D::sigmoid_fwd(a...); },
      [](auto... a) { H::sigmoid_bwd(a...); }, [](auto... a) { D::sigmoid_bwd(a...); });
}

TEST_CASE_TEMPLATE("softmax family and losses agree with the host to a few ulps", T, float, double) {
  Generator g(4);
  i64 const rows = 23, cols = 10, n = rows * cols;
  auto x = random<T>(n, g, -4, 4), gy = random<T>(n, g), y0 = random<T>(n, g), t = random<T>(n, g);
  std::vector<std::int32_t> target(rows);
  for (auto& c : target) c = static_cast<std::int32_t>(g.below(cols));
  auto dx = up(x), dgy = up(gy), dt = up(t);
  auto dtarget = up(target);
  double const tol = ulps<T>(64);

  std::vector<T> hy(n);
  auto dy = up(hy);
  H::log_softmax_fwd(rows, cols, x.data(), hy.data());
  D::log_softmax_fwd(rows, cols, dx.data(), dy.data());
  expect_close("log_softmax_fwd", hy, down(dy), tol);
  for (T beta : {T(0), T(1)}) {
    auto hg = y0;
    auto dg = up(y0);
    H::log_softmax_bwd(rows, cols, hy.data(), gy.data(), beta, hg.data());
    D::log_softmax_bwd(rows, cols, dy.data(), dgy.data(), beta, dg.data());
    expect_close("log_softmax_bwd", hg, down(dg), tol);
  }

  std::vector<T> hp(n);
  auto dp = up(hp);
  T const hl = H::cross_entropy_fwd(rows, cols, x.data(), target.data(), hp.data());
  T const dl = D::cross_entropy_fwd(rows, cols, dx.data(), dtarget.data(), dp.data());
  expect_close("cross_entropy_fwd loss", hl, dl, tol);
  expect_close("cross_entropy_fwd probs", hp, down(dp), tol);
  for (T beta : {T(0), T(1)}) {
    auto hg = y0;
    auto dg = up(y0);
    H::cross_entropy_bwd(rows, cols, hp.data(), target.data(), T(0.7), beta, hg.data());
    D::cross_entropy_bwd(rows, cols, dp.data(), dtarget.data(), T(0.7), beta, dg.data());
    expect_close("cross_entropy_bwd", hg, down(dg), tol);
  }

  expect_close("nll_fwd", H::nll_fwd(rows, cols, hy.data(), target.data()),
               D::nll_fwd(rows, cols, dy.data(), dtarget.data()), tol);
  for (T beta : {T(0), T(1)}) {
    auto hg = y0;
    auto dg = up(y0);
    H::nll_bwd(rows, cols, target.data(), T(1.5), beta, hg.data());
    D::nll_bwd(rows, cols, dtarget.data(), T(1.5), beta, dg.data());
    expect_close("nll_bwd", hg, down(dg), exact<T>());
  }

  expect_close("mse_fwd", H::mse_fwd(n, x.data(), t.data()), D::mse_fwd(n, dx.data(), dt.data()), tol);
  for (T beta : {T(0), T(1)}) {
    auto hg = y0;
    auto dg = up(y0);
    H::mse_bwd(n, x.data(), t.data(), T(0.9), beta, hg.data());
    D::mse_bwd(n, dx.data(), dt.data(), T(0.9), beta, dg.data());
    expect_close("mse_bwd", hg, down(dg), exact<T>());
  }
  CHECK(D::cross_entropy_fwd(0, cols, dx.data(), dtarget.data(), dp.data()) == T(0));
  CHECK(D::mse_fwd(0, dx.data(), dt.data()) == T(0));
}

TEST_CASE_TEMPLATE("gemm: every transpose, beta 0 (C holds NaN) and 1, equals the host bitwise", T, float, double) {
  Generator g(5);
  struct Case {
    i64 M, N, K;
  };
  for (Case c : {Case{3, 4, 5}, Case{2, 300, 200}, Case{64, 96, 128}, Case{120, 80, 3}, Case{5, 7, 0}}) {
    auto A = random<T>(c.M * c.K, g), B = random<T>(c.K * c.N, g), C0 = random<T>(c.M * c.N, g);
    for (Trans ta : {Trans::kNo, Trans::kYes})
      for (Trans tb : {Trans::kNo, Trans::kYes})
        for (T beta : {T(0), T(1)}) {
          auto hc = C0;
          if (beta == T(0)) std::fill(hc.begin(), hc.end(), std::numeric_limits<T>::quiet_NaN());
          auto dc = up(hc);
          H::gemm(ta, tb, c.M, c.N, c.K, T(0.5), A.data(), B.data(), beta, hc.data());
          D::gemm(ta, tb, c.M, c.N, c.K, T(0.5), up(A).data(), up(B).data(), beta, dc.data());
          expect_close(
              detail::cat("gemm ", c.M, "x", c.N, "x", c.K, " ta ", int(ta), " tb ", int(tb), " beta ", double(beta)),
              hc, down(dc), blas<T>());
        }
  }
}

TEST_CASE_TEMPLATE("conv2d forward and backward equal the host's (Winograd, im2col, relu, fused pooling)", T, float,
                   double) {
  Generator g(6);
  std::vector<ConvGeometry> cases{
      {.N = 2, .C = 3, .H = 9, .W = 8, .O = 4, .k = 3, .stride = 1, .pad = 1},
      {.N = 1, .C = 2, .H = 7, .W = 7, .O = 3, .k = 2, .stride = 2, .pad = 0},
      {.N = 2, .C = 8, .H = 10, .W = 10, .O = 8, .k = 3, .stride = 1, .pad = 0, .epilogue = Epilogue::kRelu},
      {.N = 2, .C = 8, .H = 10, .W = 10, .O = 8, .k = 3, .stride = 1, .pad = 0, .epilogue = Epilogue::kReluMaxPool2},
  };
  for (ConvGeometry geo : cases) {
    if (geo.pool2() && !D::fuses_pool2(geo)) continue;  // cuDNN: the conv2d op composes the pooling instead
    if (!DeviceSystem::is_cuda) CHECK(D::fuses_pool2(geo) == H::fuses_pool2(geo));
    i64 const nx = geo.N * geo.C * geo.H * geo.W, nw = geo.O * geo.C * geo.k * geo.k;
    i64 const ny = geo.pool2() ? geo.N * geo.O * (geo.OH() / 2) * (geo.OW() / 2) : geo.N * geo.O * geo.L();
    auto x = random<T>(nx, g), w = random<T>(nw, g), b = random<T>(geo.O, g), gy = random<T>(ny, g);
    std::vector<T> hy(ny);
    std::vector<std::uint8_t> hcodes(geo.pool2() ? ny : 0);
    auto dx = up(x), dw = up(w), db = up(b), dgy = up(gy), dy = up(hy);
    Tensor<std::uint8_t, DeviceSpace> dcodes(Shape{geo.pool2() ? ny : 0});
    H::conv2d_fwd(geo, x.data(), w.data(), b.data(), hy.data(), geo.pool2() ? hcodes.data() : nullptr);
    D::conv2d_fwd(geo, dx.data(), dw.data(), db.data(), dy.data(), geo.pool2() ? dcodes.data() : nullptr);
    std::string const label = detail::cat("conv2d k", geo.k, " s", geo.stride, " p", geo.pad, geo.relu() ? " relu" : "",
                                          geo.pool2() ? " pool2" : "");
    expect_close(label + " fwd", hy, down(dy), conv<T>());
    for (T beta : {T(0), T(1)}) {
      auto hgx = random<T>(nx, g), hgw = random<T>(nw, g), hgb = random<T>(geo.O, g);
      auto dgx = up(hgx), dgw = up(hgw), dgb = up(hgb);
      H::conv2d_bwd(geo, x.data(), w.data(), hy.data(), gy.data(), beta, hgx.data(), beta, hgw.data(), beta, hgb.data(),
                    geo.pool2() ? hcodes.data() : nullptr);
      D::conv2d_bwd(geo, dx.data(), dw.data(), dy.data(), dgy.data(), beta, dgx.data(), beta, dgw.data(), beta,
                    dgb.data(), geo.pool2() ? dcodes.data() : nullptr);
      expect_close(label + " gx", hgx, down(dgx), conv<T>());
      expect_close(label + " gw", hgw, down(dgw), conv<T>());
      // The host's bias gradient sums planes with Eigen, whose vectorised sum depends on the buffer's alignment.
      expect_close(label + " gb", hgb, down(dgb), std::max(conv<T>(), ulps<T>(16)));
    }
  }
}

// The main job's CNN layers at a training batch (256 on a GPU, where cuDNN's heuristics pick other algorithms
// than for the small cases above, FFT and Winograd among them; 16 on the CPU system): every algorithm setting
// stays within the dot-product error bound of the host's result, |device − host| ≤ 1e-5 · Σ|a·b| over the
// element's products (Σ|a·b|: the same convolution of |x|, |w|, |gy|), and a second call repeats bitwise (only
// deterministic algorithms are chosen). On the CPU system both sides are the host kernels: bitwise.
TEST_CASE("conv2d at the main job's geometries: each algorithm setting within the error bound, repeating bitwise") {
  using T = float;
  Generator g(11);
  i64 const n = DeviceSystem::is_cuda ? 256 : 16;
  double const tol = DeviceSystem::is_cuda ? 1e-5 : 0.0;
  auto abs_of = [](std::vector<T> v) {
    for (auto& e : v) e = std::abs(e);
    return v;
  };
  auto within = [&](std::string const& what, std::vector<T> const& host, std::vector<T> const& dev,
                    std::vector<T> const& bound) {
    INFO(what);
    REQUIRE(host.size() == dev.size());
    double worst = 0;
    std::size_t at = 0;
    for (std::size_t i = 0; i < host.size(); ++i) {
      double const e = tol == 0 ? (std::memcmp(&host[i], &dev[i], sizeof(T)) == 0 ? 0.0 : INFINITY)
                                : std::abs(double(host[i]) - double(dev[i])) / std::max(double(bound[i]), 1e-30);
      if (e > worst) worst = e, at = i;
    }
    INFO(what, ": element ", at, " host ", host[at], " device ", dev[at], " bound ", bound[at], " (error/bound ", worst,
         ", tolerance ", tol, ")");
    CHECK(worst <= tol);
  };
  for (ConvAlgorithm algo : {ConvAlgorithm::kAuto, ConvAlgorithm::kIm2col})
    for (ConvGeometry geo : {ConvGeometry{.N = n, .C = 1, .H = 28, .W = 28, .O = 32, .k = 3},
                             ConvGeometry{.N = n, .C = 32, .H = 26, .W = 26, .O = 64, .k = 3}}) {
      geo.algorithm = algo;  // no relu: a y within an ulp of 0 would mask gy differently on the two sides
      std::string const label = detail::cat("conv2d C", geo.C, " N", geo.N, " algorithm ", int(algo));
      INFO(label);
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
      {
        auto const& d = detail::cudnn_conv<T>(geo);
        MESSAGE(label, ": cuDNN fwd algo ", int(d.fwd), ", bwd data algo ", int(d.bwd_data), ", bwd filter algo ",
                int(d.bwd_filter));
      }
#endif
      i64 const nx = geo.N * geo.C * geo.H * geo.W, nw = geo.O * geo.C * geo.k * geo.k, ny = geo.N * geo.O * geo.L();
      auto x = random<T>(nx, g), w = random<T>(nw, g), gy = random<T>(ny, g);
      std::vector<T> hy(ny), hgx(nx), hgw(nw), by(ny), bgx(nx), bgw(nw);
      H::conv2d_fwd(geo, x.data(), w.data(), static_cast<T const*>(nullptr), hy.data());
      H::conv2d_bwd(geo, x.data(), w.data(), hy.data(), gy.data(), T(0), hgx.data(), T(0), hgw.data(), T(0),
                    static_cast<T*>(nullptr));
      auto const ax = abs_of(x), aw = abs_of(w), agy = abs_of(gy);  // the bounds: Σ|a·b| per element
      H::conv2d_fwd(geo, ax.data(), aw.data(), static_cast<T const*>(nullptr), by.data());
      H::conv2d_bwd(geo, ax.data(), aw.data(), by.data(), agy.data(), T(0), bgx.data(), T(0), bgw.data(), T(0),
                    static_cast<T*>(nullptr));
      auto dx = up(x), dw = up(w), dgy = up(gy), dy = up(hy);
      std::vector<std::vector<T>> runs;  // y, gx, gw per call
      for (int call = 0; call < 2; ++call) {
        auto dgx = up(hgx), dgw = up(hgw);
        D::conv2d_fwd(geo, dx.data(), dw.data(), static_cast<T const*>(nullptr), dy.data());
        D::conv2d_bwd(geo, dx.data(), dw.data(), dy.data(), dgy.data(), T(0), dgx.data(), T(0), dgw.data(), T(0),
                      static_cast<T*>(nullptr));
        runs.push_back(down(dy)), runs.push_back(down(dgx)), runs.push_back(down(dgw));
      }
      within(label + " fwd", hy, runs[0], by);
      within(label + " gx", hgx, runs[1], bgx);
      within(label + " gw", hgw, runs[2], bgw);
      for (int k = 0; k < 3; ++k) expect_close(label + " second call, bitwise", runs[k], runs[3 + k], 0.0);
    }
}

TEST_CASE_TEMPLATE("max-pool forward (values, argmax, NaN) and backward (overlapping windows) equal the host bitwise",
                   T, float, double) {
  Generator g(7);
  for (auto [k, s] : {std::pair<i64, i64>{2, 2}, {3, 2}, {3, 1}, {2, 1}}) {
    ConvGeometry geo{.N = 2, .C = 3, .H = 9, .W = 11, .O = 3, .k = k, .stride = s, .pad = 0};
    i64 const nx = geo.N * geo.C * geo.H * geo.W, ny = geo.N * geo.C * geo.L();
    auto x = random<T>(nx, g), gy = random<T>(ny, g), gx0 = random<T>(nx, g);
    x[5] = x[6];                                  // a tie
    x[40] = std::numeric_limits<T>::quiet_NaN();  // NaN propagates
    std::vector<T> hy(ny);
    std::vector<std::int32_t> hidx(ny);
    auto dx = up(x), dy = up(hy), dgy = up(gy);
    auto didx = up(hidx);
    H::maxpool_fwd(geo, x.data(), hy.data(), hidx.data());
    D::maxpool_fwd(geo, dx.data(), dy.data(), didx.data());
    std::string const label = detail::cat("maxpool k", k, " s", s);
    expect_close(label + " fwd", hy, down(dy), exact<T>());
    CHECK_MESSAGE(hidx == down(didx), label);
    for (T beta : {T(0), T(1)}) {
      auto hgx = gx0;
      auto dgx = up(gx0);
      H::maxpool_bwd(geo, gy.data(), hidx.data(), beta, hgx.data());
      D::maxpool_bwd(geo, dgy.data(), didx.data(), beta, dgx.data());
      expect_close(label + " bwd", hgx, down(dgx), exact<T>());
    }
  }
}

TEST_CASE_TEMPLATE("batch-norm: training and evaluation forward, backward, equal the host bitwise", T, float, double) {
  Generator g(8);
  i64 const N = 3, C = 4, HW = 15, n = N * C * HW;
  auto x = random<T>(n, g, -2, 3), gamma = random<T>(C, g), beta = random<T>(C, g), gy = random<T>(n, g);
  auto dx = up(x), dgamma = up(gamma), dbeta = up(beta), dgy = up(gy);
  for (bool with_affine : {true, false}) {
    T const* hgm = with_affine ? gamma.data() : nullptr;
    T const* hbt = with_affine ? beta.data() : nullptr;
    T const* dgm = with_affine ? dgamma.data() : nullptr;
    T const* dbt = with_affine ? dbeta.data() : nullptr;
    std::vector<T> hy(n), hm(C), hs(C), hv(C);
    auto dy = up(hy), dm = up(hm), ds = up(hs), dv = up(hv);
    H::batchnorm_fwd_train(N, C, HW, x.data(), hgm, hbt, T(1e-5), hy.data(), hm.data(), hs.data(), hv.data());
    D::batchnorm_fwd_train(N, C, HW, dx.data(), dgm, dbt, T(1e-5), dy.data(), dm.data(), ds.data(), dv.data());
    expect_close("bn train y", hy, down(dy), exact<T>());
    expect_close("bn train mean", hm, down(dm), exact<T>());
    expect_close("bn train invstd", hs, down(ds), exact<T>());
    expect_close("bn train var", hv, down(dv), exact<T>());
    std::vector<T> ey(n);
    auto dey = up(ey);
    H::batchnorm_fwd_eval(N, C, HW, x.data(), hgm, hbt, hm.data(), hs.data(), ey.data());
    D::batchnorm_fwd_eval(N, C, HW, dx.data(), dgm, dbt, dm.data(), ds.data(), dey.data());
    expect_close("bn eval y", ey, down(dey), exact<T>());
    for (bool training : {true, false})
      for (T b : {T(0), T(1)}) {
        auto hgx = random<T>(n, g), hgg = random<T>(C, g), hgb = random<T>(C, g);
        auto dgx = up(hgx), dgg = up(hgg), dgb = up(hgb);
        H::batchnorm_bwd(training, N, C, HW, x.data(), hgm, hm.data(), hs.data(), gy.data(), b, hgx.data(), b,
                         hgg.data(), b, hgb.data());
        D::batchnorm_bwd(training, N, C, HW, dx.data(), dgm, dm.data(), ds.data(), dgy.data(), b, dgx.data(), b,
                         dgg.data(), b, dgb.data());
        expect_close("bn bwd gx", hgx, down(dgx), exact<T>());
        expect_close("bn bwd ggamma", hgg, down(dgg), exact<T>());
        expect_close("bn bwd gbeta", hgb, down(dgb), exact<T>());
      }
  }
}

TEST_CASE_TEMPLATE("optimizer updates (SGD variants, Adam, AdamW) equal the host bitwise", T, float, double) {
  Generator g(9);
  i64 const n = 5000;  // more than one host chunk
  auto w = random<T>(n, g), gr = random<T>(n, g), buf = random<T>(n, g), m = random<T>(n, g), v = random<T>(n, g, 0, 1);
  for (SgdStep<T> p :
       {SgdStep<T>{T(0.1), T(0), T(0), T(0), false, false}, SgdStep<T>{T(0.1), T(0), T(0), T(0.01), false, false},
        SgdStep<T>{T(0.1), T(0.9), T(0), T(0.01), false, true}, SgdStep<T>{T(0.1), T(0.9), T(0.1), T(0), false, false},
        SgdStep<T>{T(0.1), T(0.9), T(0), T(0.01), true, false}}) {
    auto hw = w, hb = buf;
    auto dw = up(w), db = up(buf);
    H::sgd_update(n, hw.data(), gr.data(), hb.data(), p);
    D::sgd_update(n, dw.data(), up(gr).data(), db.data(), p);
    expect_close("sgd w", hw, down(dw), exact<T>());
    if (p.momentum != T(0)) expect_close("sgd buf", hb, down(db), exact<T>());
  }
  for (bool decoupled : {false, true})
    for (T wd : {T(0), T(0.01)}) {
      AdamStep<T> p{
          T(1e-3), T(0.9), T(0.999), T(1e-8), wd, decoupled, T(1e-3) / (T(1) - T(0.9)), std::sqrt(T(1) - T(0.999))};
      auto hw = w, hm = m, hv = v;
      auto dw = up(w), dm = up(m), dv = up(v);
      H::adam_update(n, hw.data(), gr.data(), hm.data(), hv.data(), p);
      D::adam_update(n, dw.data(), up(gr).data(), dm.data(), dv.data(), p);
      // Eigen's vectorised sqrt (EIGEN_FAST_MATH) is not correctly rounded; the device kernel's is.
      expect_close("adam w", hw, down(dw), ulps<T>(8));
      expect_close("adam m", hm, down(dm), exact<T>());
      expect_close("adam v", hv, down(dv), exact<T>());
    }
}

namespace {

// |got − want| ≤ tol · bound for every element, with want and bound computed in double by the naive loops below
// (bound: Σ|a·b| over the element's products, the scale of a dot product's rounding error).
template <class T>
void expect_within_reference(std::string const& what, std::vector<T> const& got, std::vector<double> const& want,
                             std::vector<double> const& bound, double tol) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    double const e = std::abs(double(got[i]) - want[i]) / std::max(bound[i], 1e-300);
    if (!(e <= worst)) worst = e, at = i;
  }
  CHECK_MESSAGE(worst <= tol, what << ": element " << at << " device " << double(got[at]) << " reference " << want[at]
                                   << " (error/bound " << worst << ", tolerance " << tol << ")");
}

// The direct convolution in double: x (N, C, H, W), w (O, C, k, k), y (N, O, OH, OW); `abs` sums |x·w| instead.
// gx and gw are its adjoints for a given gy.
struct NaiveConv {
  ConvGeometry g;
  template <class F>
  void each(F&& f) const {  // f(x index, w index, y index) for every product of the convolution
    auto const at = [](i64 i) { return static_cast<std::size_t>(i); };
    for (i64 n = 0; n < g.N; ++n)
      for (i64 o = 0; o < g.O; ++o)
        for (i64 i = 0; i < g.OH(); ++i)
          for (i64 j = 0; j < g.OW(); ++j)
            for (i64 c = 0; c < g.C; ++c)
              for (i64 p = 0; p < g.k; ++p)
                for (i64 q = 0; q < g.k; ++q) {
                  i64 const h = i * g.stride + p - g.pad, v = j * g.stride + q - g.pad;
                  if (h < 0 || h >= g.H || v < 0 || v >= g.W) continue;
                  f(at(((n * g.C + c) * g.H + h) * g.W + v), at(((o * g.C + c) * g.k + p) * g.k + q),
                    at(((n * g.O + o) * g.OH() + i) * g.OW() + j));
                }
  }
};

}  // namespace

// On Thrust's CPU system the device GEMM and convolution are the host kernels, so the tests above compare them
// with themselves; these compare them with an independent reference, naive loops in double, on every system.
TEST_CASE_TEMPLATE("gemm against a naive double reference, every transpose, beta 0 and 1", T, float, double) {
  Generator g(17);
  struct Case {
    i64 M, N, K;
  };
  for (Case c : {Case{3, 4, 5}, Case{2, 300, 200}, Case{64, 96, 128}, Case{120, 80, 3}}) {
    auto A = random<T>(c.M * c.K, g), B = random<T>(c.K * c.N, g), C0 = random<T>(c.M * c.N, g);
    for (Trans ta : {Trans::kNo, Trans::kYes})
      for (Trans tb : {Trans::kNo, Trans::kYes})
        for (T beta : {T(0), T(1)}) {
          double const alpha = 0.5;
          std::vector<double> want(static_cast<std::size_t>(c.M * c.N)), bound(want.size());
          for (i64 m = 0; m < c.M; ++m)
            for (i64 n = 0; n < c.N; ++n) {
              double s = 0, a = 0;
              for (i64 k = 0; k < c.K; ++k) {
                double const x = double(A[static_cast<std::size_t>(ta == Trans::kNo ? m * c.K + k : k * c.M + m)]);
                double const y = double(B[static_cast<std::size_t>(tb == Trans::kNo ? k * c.N + n : n * c.K + k)]);
                s += x * y, a += std::abs(x * y);
              }
              auto const e = static_cast<std::size_t>(m * c.N + n);
              want[e] = alpha * s + double(beta) * double(C0[e]);
              bound[e] = alpha * a + std::abs(double(beta) * double(C0[e]));
            }
          auto hc = C0;
          if (beta == T(0)) std::fill(hc.begin(), hc.end(), std::numeric_limits<T>::quiet_NaN());
          auto dc = up(hc);
          D::gemm(ta, tb, c.M, c.N, c.K, T(alpha), up(A).data(), up(B).data(), beta, dc.data());
          // A dot product of K terms rounds by at most about K ulps of Σ|a·b| (plus the scaling and beta's add).
          double const tol = double(c.K + 4) * double(std::numeric_limits<T>::epsilon());
          expect_within_reference(
              detail::cat("gemm ", c.M, "x", c.N, "x", c.K, " ta ", int(ta), " tb ", int(tb), " beta ", double(beta)),
              down(dc), want, bound, tol);
        }
  }
}

TEST_CASE_TEMPLATE("conv2d forward and backward against a naive double reference", T, float, double) {
  Generator g(19);
  // Winograd's transforms round more than a direct sum (3x3, stride 1, >= 8 channels takes it on the host; cuDNN
  // picks its own): a looser bound than a GEMM's (float measured up to 1.1e-6 on the CPU system, Winograd's gx),
  // the one the GPU test above holds cuDNN to, far below what a wrong index or a missing term gives.
  double const tol = sizeof(T) == 4 ? 1e-5 : 1e-12;
  for (ConvGeometry geo : {ConvGeometry{.N = 2, .C = 3, .H = 7, .W = 6, .O = 4, .k = 3, .stride = 2, .pad = 1},
                           ConvGeometry{.N = 2, .C = 8, .H = 10, .W = 9, .O = 8, .k = 3},
                           ConvGeometry{.N = 1, .C = 1, .H = 28, .W = 28, .O = 5, .k = 5, .pad = 2}})
    for (ConvAlgorithm algo : {ConvAlgorithm::kAuto, ConvAlgorithm::kIm2col}) {
      geo.algorithm = algo;
      std::string const label = detail::cat("conv2d C", geo.C, " O", geo.O, " k", geo.k, " s", geo.stride, " p",
                                            geo.pad, " algorithm ", int(algo));
      i64 const nx = geo.N * geo.C * geo.H * geo.W, nw = geo.O * geo.C * geo.k * geo.k, ny = geo.N * geo.O * geo.L();
      auto x = random<T>(nx, g), w = random<T>(nw, g), gy = random<T>(ny, g);
      std::vector<double> y(static_cast<std::size_t>(ny)), by(y.size()), gx(static_cast<std::size_t>(nx)),
          bgx(gx.size()), gw(static_cast<std::size_t>(nw)), bgw(gw.size());
      NaiveConv{geo}.each([&](std::size_t xi, std::size_t wi, std::size_t yi) {
        double const a = double(x[xi]), b = double(w[wi]), d = double(gy[yi]);
        y[yi] += a * b, by[yi] += std::abs(a * b);
        gx[xi] += d * b, bgx[xi] += std::abs(d * b);
        gw[wi] += d * a, bgw[wi] += std::abs(d * a);
      });
      auto dx = up(x), dw = up(w), dgy = up(gy);
      Tensor<T, DeviceSpace> dy(Shape{ny}), dgx(Shape{nx}), dgw(Shape{nw});
      D::conv2d_fwd(geo, dx.data(), dw.data(), static_cast<T const*>(nullptr), dy.data());
      D::conv2d_bwd(geo, dx.data(), dw.data(), dy.data(), dgy.data(), T(0), dgx.data(), T(0), dgw.data(), T(0),
                    static_cast<T*>(nullptr));
      expect_within_reference(label + " fwd", down(dy), y, by, tol);
      expect_within_reference(label + " gx", down(dgx), gx, bgx, tol);
      expect_within_reference(label + " gw", down(dgw), gw, bgw, tol);
    }
}
