// Image op families (conv2d, max_pool2d, batch_norm2d): gradients against central finite differences in
// double over strides, paddings and channel counts, forward values against direct loops, and shape errors.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "test/autograd/testing.hpp"

using namespace ddp;
using namespace ddp::testing;

namespace {

Tensor<double> maxpool_reference(Tensor<double> const& x, std::int64_t k, std::int64_t s) {
  std::int64_t const N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  std::int64_t const OH = (H - k) / s + 1, OW = (W - k) / s + 1;
  Tensor<double> y(Shape{N, C, OH, OW});
  for (std::int64_t p = 0; p < N * C; ++p)
    for (std::int64_t i = 0; i < OH; ++i)
      for (std::int64_t j = 0; j < OW; ++j) {
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t a = 0; a < k; ++a)
          for (std::int64_t b = 0; b < k; ++b) m = std::max(m, x[(p * H + i * s + a) * W + j * s + b]);
        y[(p * OH + i) * OW + j] = m;
      }
  return y;
}

struct ConvCase {
  std::int64_t N, C, O, k, stride, pad;
};

}  // namespace

// ---- conv.hpp: conv2d ----

TEST_CASE("conv2d: gradients of input, weight and bias over stride 1/2, padding 0/1/2, several channel counts") {
  ConvCase const cases[] = {
      {1, 1, 1, 3, 1, 0}, {2, 3, 2, 3, 1, 1}, {1, 2, 4, 3, 2, 1}, {2, 1, 3, 2, 2, 0}, {1, 3, 2, 3, 1, 2},
      {2, 2, 2, 1, 1, 0}, {1, 2, 3, 3, 2, 2}, {2, 4, 1, 2, 1, 1}, {1, 1, 2, 5, 2, 2},
  };
  std::uint64_t seed = 100;
  for (ConvCase const& cc : cases) {
    Generator gen(++seed);
    // Random spatial size that fits the kernel (H ≠ W in general, so row/column mix-ups show).
    std::int64_t const lo = std::max<std::int64_t>(1, cc.k - 2 * cc.pad);
    std::int64_t const H = dim(gen, lo, lo + 4), W = dim(gen, lo, lo + 4);
    Shape const xs{cc.N, cc.C, H, W};
    VarD x = param(uniform(xs, gen)), w = param(uniform(Shape{cc.O, cc.C, cc.k, cc.k}, gen)),
         b = param(uniform(Shape{cc.O}, gen));
    Conv2dArgs const args{.stride = cc.stride, .padding = cc.pad};
    std::string const what =
        detail::cat("conv2d x ", xs, " O ", cc.O, " k ", cc.k, " stride ", cc.stride, " pad ", cc.pad);
    check_grad(what + " with bias", [args](Inputs const& v) { return conv2d(v[0], v[1], v[2], args); }, {x, w, b});
    check_grad(what + " no bias", [args](Inputs const& v) { return conv2d(v[0], v[1], VarD{}, args); }, {x, w});
    check_grad(what + " x constant", [args](Inputs const& v) { return conv2d(v[0], v[1], v[2], args); },
               {constant(x.value()), w, b});
    check_grad(what + " w, b constant", [args](Inputs const& v) { return conv2d(v[0], v[1], v[2], args); },
               {x, constant(w.value()), constant(b.value())});
  }
}

TEST_CASE("conv2d forward equals the direct 7-loop reference") {
  std::uint64_t seed = 200;
  for (ConvCase const& cc : {ConvCase{2, 3, 4, 3, 1, 0}, ConvCase{1, 2, 3, 3, 2, 1}, ConvCase{2, 1, 2, 2, 2, 2},
                             ConvCase{1, 3, 2, 4, 3, 1}, ConvCase{3, 2, 5, 1, 1, 0}}) {
    Generator gen(++seed);
    Tensor<double> const x = uniform(Shape{cc.N, cc.C, 7, 6}, gen), w = uniform(Shape{cc.O, cc.C, cc.k, cc.k}, gen),
                         b = uniform(Shape{cc.O}, gen);
    Conv2dArgs const args{.stride = cc.stride, .padding = cc.pad};
    Tensor<double> const y = conv2d(constant(x), constant(w), constant(b), args).value();
    Tensor<double> const y0 = conv2d(constant(x), constant(w), VarD{}, args).value();
    INFO("k ", cc.k, " stride ", cc.stride, " pad ", cc.pad);
    CHECK(max_abs_diff(y, conv2d_reference(x, w, &b, cc.stride, cc.pad)) < 1e-13);
    CHECK(max_abs_diff(y0, conv2d_reference(x, w, nullptr, cc.stride, cc.pad)) < 1e-13);
  }
  // A hand-computed case: 1 channel, 3x3 input 1..9, 2x2 kernel of ones, padding 1 -> sums of each window.
  Tensor<double> const x = from_values<double>(Shape{1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor<double> const y =
      conv2d(constant(x), constant(full<double>(Shape{1, 1, 2, 2}, 1.0)), VarD{}, Conv2dArgs{.stride = 2, .padding = 1})
          .value();
  REQUIRE(y.shape() == Shape{1, 1, 2, 2});
  CHECK(y[0] == 1);
  CHECK(y[1] == 2 + 3);
  CHECK(y[2] == 4 + 7);
  CHECK(y[3] == 5 + 6 + 8 + 9);
}

TEST_CASE("conv2d errors name the shapes") {
  Generator gen(300);
  VarD x = param(uniform(Shape{2, 3, 5, 5}, gen));
  check_throws_with<ShapeError>(
      [&] {
        (void)conv2d(x, param(uniform(Shape{4, 2, 3, 3}, gen)));
      },
      {"conv2d", "[2, 3, 5, 5]", "[4, 2, 3, 3]"});
  check_throws_with<ShapeError>([&] { (void)conv2d(x, param(uniform(Shape{4, 3, 3, 2}, gen))); }, {"[4, 3, 3, 2]"});
  check_throws_with<ShapeError>(
      [&] {
        (void)conv2d(param(uniform(Shape{3, 5, 5}, gen)), param(uniform(Shape{4, 3, 3, 3}, gen)));
      },
      {"[3, 5, 5]"});
  VarD w = param(uniform(Shape{4, 3, 3, 3}, gen));
  check_throws_with<ShapeError>([&] { (void)conv2d(x, w, param(uniform(Shape{3}, gen))); }, {"bias", "[3]", "[4]"});
  check_throws_with<ShapeError>([&] { (void)conv2d(param(uniform(Shape{1, 3, 2, 2}, gen)), w); }, {"[1, 3, 2, 2]"});
  check_throws_with<ArgumentError>([&] { (void)conv2d(x, w, VarD{}, Conv2dArgs{.stride = 0}); }, {"stride"});
}

// ---- conv.hpp: max_pool2d ----

TEST_CASE("max_pool2d: gradient with kernel 2/3, default and custom strides (distinct inputs, no ties)") {
  struct PoolCase {
    std::int64_t k, stride;  // stride 0: the default (= kernel)
  };
  std::uint64_t seed = 400;
  for (PoolCase const pc :
       {PoolCase{2, 0}, PoolCase{3, 0}, PoolCase{2, 1}, PoolCase{3, 1}, PoolCase{3, 2}, PoolCase{2, 3}}) {
    for (int rep = 0; rep < 2; ++rep) {
      Generator gen(++seed);
      std::int64_t const N = dim(gen, 1, 2), C = dim(gen, 1, 3), H = dim(gen, pc.k, pc.k + 5),
                         W = dim(gen, pc.k, pc.k + 5);
      Shape const xs{N, C, H, W};
      VarD x = param(distinct(xs, gen));
      check_grad(detail::cat("max_pool2d x ", xs, " k ", pc.k, " stride ", pc.stride),
                 [pc](Inputs const& v) { return max_pool2d(v[0], pc.k, pc.stride); }, {x});
      std::int64_t const s = pc.stride ? pc.stride : pc.k;
      Tensor<double> const y = max_pool2d(x, pc.k, pc.stride).value();
      CHECK(y.shape() == Shape{N, C, (H - pc.k) / s + 1, (W - pc.k) / s + 1});
      CHECK(max_abs_diff(y, maxpool_reference(x.value(), pc.k, s)) == 0.0);
    }
  }
}

TEST_CASE("max_pool2d: the gradient goes to each window's maximum, summed where windows overlap") {
  // 1x1x3x3 with the maximum (9) in the centre: every 2x2 window of stride 1 picks it.
  VarD x = param(from_values<double>(Shape{1, 1, 3, 3}, {1, 2, 3, 4, 9, 5, 6, 7, 8}));
  backward(sum(max_pool2d(x, 2, 1)));
  for (int i = 0; i < 9; ++i) CHECK(x.grad()[i] == (i == 4 ? 4.0 : 0.0));
}

TEST_CASE("max_pool2d 2x2 in float (the vectorised path): ties go to the first, NaN propagates, wide and odd sizes") {
  // Width 37 -> 18 windows per row: two vector blocks of 8 and a scalar tail; height 9 leaves a row uncovered.
  Generator gen(450);
  Shape const xs{2, 3, 9, 37};
  Tensor<float> x(xs);
  for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = static_cast<float>(gen.below(5)) - 2.0f;  // many ties
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x[37 + 20] = std::numeric_limits<float>::quiet_NaN();
  Var xv(x, RequiresGrad::kYes);
  Var y = max_pool2d(xv, 2);
  Tensor<float> gy(y.shape());
  for (std::int64_t i = 0; i < gy.numel(); ++i) gy[i] = static_cast<float>(i + 1);
  backward(sum(y * Var(gy)));
  // Reference: scan each window in order r0[j], r0[j+1], r1[j], r1[j+1]; a later value wins if larger or NaN.
  Tensor<float> gx_ref = zeros<float>(xs);
  std::int64_t const OH = 4, OW = 18;
  for (std::int64_t p = 0; p < 6; ++p)
    for (std::int64_t oh = 0; oh < OH; ++oh)
      for (std::int64_t ow = 0; ow < OW; ++ow) {
        std::int64_t const o = (p * OH + oh) * OW + ow;
        std::int64_t const at[4] = {(2 * oh) * 37 + 2 * ow, (2 * oh) * 37 + 2 * ow + 1, (2 * oh + 1) * 37 + 2 * ow,
                                    (2 * oh + 1) * 37 + 2 * ow + 1};
        std::int64_t best = at[0];
        float m = x[p * 9 * 37 + at[0]];
        for (int j = 1; j < 4; ++j) {
          float const v = x[p * 9 * 37 + at[j]];
          if (v > m || std::isnan(v)) m = v, best = at[j];
        }
        INFO("window ", o);
        if (std::isnan(m))
          CHECK(std::isnan(y.value()[o]));
        else
          CHECK(y.value()[o] == m);
        gx_ref[p * 9 * 37 + best] += gy[o];
      }
  CHECK(max_abs_diff(xv.grad(), gx_ref) == 0.0);
}

TEST_CASE("max_pool2d errors name the shape") {
  Generator gen(500);
  check_throws_with<ShapeError>(
      [&] {
        (void)max_pool2d(param(uniform(Shape{4, 4}, gen)), 2);
      },
      {"max_pool2d", "[4, 4]"});
  check_throws_with<ArgumentError>(
      [&] {
        (void)max_pool2d(param(uniform(Shape{1, 1, 2, 2}, gen)), 3);
      },
      {"max_pool2d", "[1, 1, 2, 2]"});
}

// ---- batch_norm.hpp ----

TEST_CASE("batch_norm2d: gradients of x, gamma, beta in training (batch statistics) and evaluation") {
  for (std::uint64_t seed = 600; seed < 604; ++seed) {
    Generator gen(seed);
    std::int64_t const N = dim(gen, 1, 3), C = dim(gen, 1, 3), H = dim(gen, 1, 4), W = dim(gen, 2, 4);
    Shape const xs{N, C, H, W};
    VarD x = param(uniform(xs, gen, -2.0, 2.0)), gamma = param(uniform(Shape{C}, gen, 0.5, 1.5)),
         beta = param(uniform(Shape{C}, gen));
    Tensor<double> const rm = uniform(Shape{C}, gen), rv = uniform(Shape{C}, gen, 0.5, 2.0);
    for (Mode mode : {Mode::kTrain, Mode::kEval}) {
      // Fresh copies of the running statistics per call: training updates them in place.
      auto f = [&rm, &rv, mode](Inputs const& v) { return batch_norm2d(v[0], v[1], v[2], clone(rm), clone(rv), mode); };
      std::string const what = detail::cat("batch_norm2d ", mode == Mode::kTrain ? "train" : "eval", " x ", xs);
      check_grad(what, f, {x, gamma, beta});
      check_grad(what + " x only", f, {x, constant(gamma.value()), constant(beta.value())});
      check_grad(what + " gamma, beta only", f, {constant(x.value()), gamma, beta});
    }
  }
}

TEST_CASE("batch_norm2d forward and running statistics against the formulas") {
  Generator gen(700);
  std::int64_t const N = 3, C = 2, HW = 4;
  Tensor<double> const x = uniform(Shape{N, C, 2, 2}, gen, -2.0, 3.0), g = uniform(Shape{C}, gen),
                       b = uniform(Shape{C}, gen);
  Tensor<double> const rm0 = uniform(Shape{C}, gen), rv0 = uniform(Shape{C}, gen, 0.5, 2.0);
  Tensor<double> rm = clone(rm0), rv = clone(rv0);
  BatchNormArgs const args{.momentum = 0.25, .eps = 1e-3};
  Tensor<double> const y = batch_norm2d(constant(x), constant(g), constant(b), rm, rv, Mode::kTrain, args).value();
  for (std::int64_t c = 0; c < C; ++c) {
    double m = 0, ss = 0;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t i = 0; i < HW; ++i) m += x[(n * C + c) * HW + i];
    m /= double(N * HW);
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t i = 0; i < HW; ++i) ss += (x[(n * C + c) * HW + i] - m) * (x[(n * C + c) * HW + i] - m);
    double const var = ss / double(N * HW), var_unbiased = ss / double(N * HW - 1);
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t i = 0; i < HW; ++i) {
        std::int64_t const j = (n * C + c) * HW + i;
        CHECK(y[j] == doctest::Approx(g[c] * (x[j] - m) / std::sqrt(var + 1e-3) + b[c]).epsilon(1e-13));
      }
    CHECK(rm[c] == doctest::Approx(0.75 * rm0[c] + 0.25 * m).epsilon(1e-14));
    CHECK(rv[c] == doctest::Approx(0.75 * rv0[c] + 0.25 * var_unbiased).epsilon(1e-14));
  }
  // Evaluation uses (and leaves alone) the running statistics.
  Tensor<double> const rm1 = clone(rm), rv1 = clone(rv);
  Tensor<double> const ye = batch_norm2d(constant(x), constant(g), constant(b), rm, rv, Mode::kEval, args).value();
  for (std::int64_t j = 0; j < x.numel(); ++j) {
    std::int64_t const c = (j / HW) % C;
    CHECK(ye[j] == doctest::Approx(g[c] * (x[j] - rm1[c]) / std::sqrt(rv1[c] + 1e-3) + b[c]).epsilon(1e-13));
  }
  CHECK(max_abs_diff(rm, rm1) == 0.0);
  CHECK(max_abs_diff(rv, rv1) == 0.0);
}

TEST_CASE("batch_norm2d errors name the shapes") {
  Generator gen(800);
  VarD x = param(uniform(Shape{2, 3, 2, 2}, gen)), g = param(uniform(Shape{3}, gen)), b = param(uniform(Shape{3}, gen));
  Tensor<double> rm = zeros<double>(Shape{3}), rv = full<double>(Shape{3}, 1.0);
  check_throws_with<ShapeError>(
      [&] {
        (void)batch_norm2d(param(uniform(Shape{2, 3}, gen)), g, b, rm, rv, Mode::kTrain);
      },
      {"batch_norm2d", "[2, 3]"});
  check_throws_with<ShapeError>([&] { (void)batch_norm2d(x, param(uniform(Shape{4}, gen)), b, rm, rv, Mode::kTrain); },
                                {"3 channels", "[4]"});
  check_throws_with<ShapeError>(
      [&] {
        (void)batch_norm2d(param(uniform(Shape{1, 3, 1, 1}, gen)), g, b, rm, rv, Mode::kTrain);
      },
      {"[1, 3, 1, 1]"});
}

TEST_CASE("a small CNN end to end: conv -> batch_norm -> tanh -> max_pool -> flatten -> linear") {
  Generator gen(900);
  VarD x = param(uniform(Shape{2, 2, 6, 6}, gen)), w = param(uniform(Shape{3, 2, 3, 3}, gen)),
       cb = param(uniform(Shape{3}, gen)), g = param(uniform(Shape{3}, gen, 0.5, 1.5)),
       bb = param(uniform(Shape{3}, gen)), fw = param(uniform(Shape{4, 12}, gen)), fb = param(uniform(Shape{4}, gen));
  Tensor<double> const rm = zeros<double>(Shape{3}), rv = full<double>(Shape{3}, 1.0);
  auto f = [&](Inputs const& v) {
    VarD h = conv2d(v[0], v[1], v[2], Conv2dArgs{.stride = 1, .padding = 1});
    h = tanh(batch_norm2d(h, v[3], v[4], clone(rm), clone(rv), Mode::kTrain));
    return linear(flatten(max_pool2d(h, 3)), v[5], v[6]);
  };
  check_grad("small CNN", f, {x, w, cb, g, bb, fw, fb});
}

TEST_CASE(
    "float and double agree on conv2d -> batch_norm2d -> relu -> max_pool2d -> cross_entropy, forward and gradients") {
  Generator gen(901);
  Tensor<double> const x = uniform(Shape{3, 2, 7, 7}, gen), w = uniform(Shape{4, 2, 3, 3}, gen),
                       cb = uniform(Shape{4}, gen), g = uniform(Shape{4}, gen, 0.5, 1.5), bb = uniform(Shape{4}, gen),
                       fw = uniform(Shape{5, 36}, gen);
  Tensor<std::int32_t> const t = random_targets(3, 5, gen);
  auto net = [&t](auto const& x_, auto const& w_, auto const& cb_, auto const& g_, auto const& bb_, auto const& fw_,
                  auto const& rm, auto const& rv) {
    auto h = conv2d(x_, w_, cb_, Conv2dArgs{.stride = 2, .padding = 1});
    h = relu(batch_norm2d(h, g_, bb_, rm, rv, Mode::kTrain));
    return cross_entropy(linear(flatten(max_pool2d(h, 2, 1)), fw_), t);
  };
  std::vector<VarD> d;
  std::vector<Var> f;
  for (auto const* p : {&x, &w, &cb, &g, &bb, &fw}) {
    d.push_back(param(clone(*p)));
    f.emplace_back(to_float(*p), RequiresGrad::kYes);
  }
  Tensor<double> rmd = zeros<double>(Shape{4}), rvd = full<double>(Shape{4}, 1.0);
  Tensor<float> rmf = zeros<float>(Shape{4}), rvf = full<float>(Shape{4}, 1.0f);
  VarD const ld = net(d[0], d[1], d[2], d[3], d[4], d[5], rmd, rvd);
  Var const lf = net(f[0], f[1], f[2], f[3], f[4], f[5], rmf, rvf);
  CHECK(lf.item() == doctest::Approx(ld.item()).epsilon(1e-5));
  CHECK(float_vs_double(rmf, rmd) < 1e-5);
  CHECK(float_vs_double(rvf, rvd) < 1e-5);
  backward(ld);
  backward(lf);
  for (std::size_t i = 0; i < d.size(); ++i) {
    INFO("input ", i);
    CHECK(float_vs_double(f[i].grad(), d[i].grad()) < 1e-4);
  }
}
