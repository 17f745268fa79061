// Winograd F(4x4, 3x3) convolution (host_winograd.hpp) against the direct definition: forward values in
// double, gradients by central differences in double (every padding 0..3, partial edge tiles, odd sizes,
// accumulation into existing gradients), float results against the im2col path at a realistic layer size,
// and which algorithm kAuto picks.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "test/autograd/testing.hpp"

using namespace ddp;
using namespace ddp::testing;

namespace {

double max_abs(Tensor<double> const& t) {
  double m = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(t[i]));
  return m;
}

// max |a - b| / max |b|
template <class T>
double rel_diff(Tensor<T> const& a, Tensor<T> const& b) {
  double m = 0, s = 0;
  for (std::int64_t i = 0; i < b.numel(); ++i) {
    m = std::max(m, std::abs(double(a[i]) - double(b[i])));
    s = std::max(s, std::abs(double(b[i])));
  }
  return m / std::max(s, 1e-30);
}

constexpr Conv2dArgs winograd(std::int64_t pad) {
  return {.stride = 1, .padding = pad, .algorithm = ConvAlgorithm::kWinograd};
}

}  // namespace

TEST_CASE("Winograd forward equals the direct definition (double): paddings 0-3, sizes that leave partial tiles") {
  Generator gen(7001);
  for (std::int64_t pad = 0; pad <= 3; ++pad)
    for (int rep = 0; rep < 6; ++rep) {
      std::int64_t const N = dim(gen, 1, 3), C = dim(gen, 1, 9), O = dim(gen, 1, 9);
      std::int64_t const lo = std::max<std::int64_t>(1, 3 - 2 * pad);
      std::int64_t const H = dim(gen, lo, 14), W = dim(gen, lo, 14);
      Tensor<double> const x = uniform(Shape{N, C, H, W}, gen), w = uniform(Shape{O, C, 3, 3}, gen),
                           b = uniform(Shape{O}, gen);
      INFO("x ", x.shape(), " O ", O, " pad ", pad);
      Tensor<double> const y = conv2d(constant(x), constant(w), constant(b), winograd(pad)).value();
      Tensor<double> const y0 = conv2d(constant(x), constant(w), VarD{}, winograd(pad)).value();
      Tensor<double> const ref = conv2d_reference(x, w, &b, 1, pad);
      CHECK(max_abs_diff(y, ref) <= 1e-12 * std::max(1.0, max_abs(ref)));
      CHECK(max_abs_diff(y0, conv2d_reference(x, w, nullptr, 1, pad)) <= 1e-12 * std::max(1.0, max_abs(ref)));
    }
}

TEST_CASE("Winograd gradients of input, weight and bias (double, central differences)") {
  struct Case {
    std::int64_t N, C, O, H, W, pad;
  };
  // 4x4 tiles: sizes 1..9 give whole and partial tiles; pad 3 runs the data gradient through im2col.
  Case const cases[] = {{1, 1, 1, 3, 3, 0}, {2, 2, 3, 6, 5, 0}, {1, 3, 2, 7, 9, 1}, {2, 2, 2, 4, 4, 1},
                        {1, 2, 3, 5, 8, 2}, {1, 1, 2, 1, 2, 2}, {1, 2, 2, 3, 4, 3}, {1, 4, 3, 10, 6, 1}};
  std::uint64_t seed = 7100;
  for (Case const& cc : cases) {
    Generator gen(++seed);
    Shape const xs{cc.N, cc.C, cc.H, cc.W};
    VarD x = param(uniform(xs, gen)), w = param(uniform(Shape{cc.O, cc.C, 3, 3}, gen)),
         b = param(uniform(Shape{cc.O}, gen));
    Conv2dArgs const args = winograd(cc.pad);
    std::string const what = detail::cat("winograd x ", xs, " O ", cc.O, " pad ", cc.pad);
    check_grad(what, [args](Inputs const& v) { return conv2d(v[0], v[1], v[2], args); }, {x, w, b});
    check_grad(what + " x constant", [args](Inputs const& v) { return conv2d(v[0], v[1], v[2], args); },
               {constant(x.value()), w, b});
    check_grad(what + " w constant", [args](Inputs const& v) { return conv2d(v[0], v[1], VarD{}, args); },
               {x, constant(w.value())});
    // x and w each feed two convolutions: their gradients accumulate (beta = 1 in the kernels).
    check_grad(what + " used twice",
               [args](Inputs const& v) { return conv2d(v[0], v[1], VarD{}, args) + conv2d(v[0], v[1], v[2], args); },
               {x, w, b});
  }
}

TEST_CASE("Winograd in float agrees with im2col at a BasicNet layer and at odd shapes") {
  struct Case {
    std::int64_t N, C, O, H, W, pad;
  };
  Generator gen(7200);
  for (Case const cc : {Case{3, 32, 64, 26, 26, 0}, Case{2, 9, 11, 13, 10, 1}, Case{1, 16, 8, 31, 17, 2}}) {
    Shape const xs{cc.N, cc.C, cc.H, cc.W};
    Tensor<float> const x = to_float(uniform(xs, gen)), w = to_float(uniform(Shape{cc.O, cc.C, 3, 3}, gen, -0.2, 0.2)),
                        b = to_float(uniform(Shape{cc.O}, gen)),
                        gy_dir =
                            to_float(uniform(Shape{cc.N, cc.O, cc.H + 2 * cc.pad - 2, cc.W + 2 * cc.pad - 2}, gen));
    auto run = [&](ConvAlgorithm a) {
      Var xv(x, RequiresGrad::kYes), wv(w, RequiresGrad::kYes), bv(b, RequiresGrad::kYes);
      Var y = conv2d(xv, wv, bv, Conv2dArgs{.stride = 1, .padding = cc.pad, .algorithm = a});
      backward(sum(y * Var(gy_dir)));
      return std::array<Tensor<float>, 4>{y.value(), xv.grad(), wv.grad(), bv.grad()};
    };
    auto const wino = run(ConvAlgorithm::kWinograd), ref = run(ConvAlgorithm::kIm2col);
    INFO("x ", xs, " O ", cc.O, " pad ", cc.pad);
    CHECK(rel_diff(wino[0], ref[0]) < 2e-5);  // forward
    CHECK(rel_diff(wino[1], ref[1]) < 2e-5);  // input gradient
    CHECK(rel_diff(wino[2], ref[2]) < 2e-5);  // weight gradient
    CHECK(rel_diff(wino[3], ref[3]) < 1e-5);  // bias gradient (float sums of ~2000 terms, in another order)
  }
}

TEST_CASE(
    "kAuto runs 3x3 stride-1 layers with >= 8 input and output channels through Winograd, others through im2col") {
  Generator gen(7300);
  auto forward = [&](std::int64_t C, std::int64_t O, std::int64_t k, std::int64_t stride, ConvAlgorithm a) {
    Generator g2(42);
    Tensor<float> const x = to_float(uniform(Shape{2, C, 11, 9}, g2)), w = to_float(uniform(Shape{O, C, k, k}, g2));
    return conv2d(Var(x), Var(w), Var{}, Conv2dArgs{.stride = stride, .padding = 1, .algorithm = a}).value();
  };
  auto same = [](Tensor<float> const& a, Tensor<float> const& b) { return max_abs_diff(a, b) == 0.0; };
  CHECK(same(forward(8, 8, 3, 1, ConvAlgorithm::kAuto), forward(8, 8, 3, 1, ConvAlgorithm::kWinograd)));
  CHECK_FALSE(same(forward(8, 8, 3, 1, ConvAlgorithm::kAuto), forward(8, 8, 3, 1, ConvAlgorithm::kIm2col)));
  CHECK(same(forward(4, 16, 3, 1, ConvAlgorithm::kAuto), forward(4, 16, 3, 1, ConvAlgorithm::kIm2col)));
  CHECK(same(forward(16, 16, 3, 2, ConvAlgorithm::kAuto), forward(16, 16, 3, 2, ConvAlgorithm::kIm2col)));
  CHECK(same(forward(16, 16, 5, 1, ConvAlgorithm::kAuto), forward(16, 16, 5, 1, ConvAlgorithm::kIm2col)));
  (void)gen;
}

TEST_CASE("kWinograd on a layer it cannot run is an error naming the kernel and stride") {
  Generator gen(7400);
  VarD x = param(uniform(Shape{1, 2, 8, 8}, gen));
  check_throws_with<ArgumentError>(
      [&] {
        (void)conv2d(x, param(uniform(Shape{2, 2, 5, 5}, gen)), VarD{}, winograd(0));
      },
      {"kWinograd", "kernel 5"});
  check_throws_with<ArgumentError>(
      [&] {
        (void)conv2d(x, param(uniform(Shape{2, 2, 3, 3}, gen)), VarD{},
                     Conv2dArgs{.stride = 2, .algorithm = ConvAlgorithm::kWinograd});
      },
      {"kWinograd", "stride 2"});
}

TEST_CASE("conv2d with a fused ReLU: gradients (double) on both algorithms, and bitwise the unfused result (float)") {
  Generator gen(7500);
  for (ConvAlgorithm a : {ConvAlgorithm::kWinograd, ConvAlgorithm::kIm2col}) {
    VarD x = param(uniform(Shape{2, 3, 7, 6}, gen)), w = param(uniform(Shape{4, 3, 3, 3}, gen)),
         b = param(uniform(Shape{4}, gen));
    Conv2dArgs const args{.stride = 1, .padding = 1, .algorithm = a, .epilogue = Epilogue::kRelu};
    check_grad(detail::cat("conv2d+relu algorithm ", int(a)),
               [args](Inputs const& v) { return conv2d(v[0], v[1], v[2], args); }, {x, w, b});
  }
  for (std::int64_t C : {3, 16}) {  // im2col and Winograd under kAuto
    Tensor<float> const xt = to_float(uniform(Shape{2, C, 13, 11}, gen)),
                        wt = to_float(uniform(Shape{16, C, 3, 3}, gen, -0.3, 0.3)),
                        bt = to_float(uniform(Shape{16}, gen)), dir = to_float(uniform(Shape{2, 16, 13, 11}, gen));
    auto run = [&](bool fused) {
      Var x(xt, RequiresGrad::kYes), w(wt, RequiresGrad::kYes), b(bt, RequiresGrad::kYes);
      Conv2dArgs const args{.padding = 1, .epilogue = fused ? Epilogue::kRelu : Epilogue::kNone};
      Var y = fused ? conv2d(x, w, b, args) : relu(conv2d(x, w, b, args));
      backward(sum(y * Var(dir)));
      return std::array<Tensor<float>, 4>{y.value(), x.grad(), w.grad(), b.grad()};
    };
    auto const f = run(true), u = run(false);
    INFO("C ", C);
    for (int i = 0; i < 4; ++i) CHECK(max_abs_diff(f[i], u[i]) == 0.0);
  }
}

TEST_CASE("conv2d with a fused ReLU and 2x2 max-pool: bitwise the composed ops (float), gradients (double)") {
  Generator gen(7600);
  // op: the fused op where the kernels can, the composition elsewhere
  struct Case2 {
    std::int64_t C, O, H, W, pad;
    char const* op;
  };
  for (Case2 const cc :
       {Case2{16, 8, 13, 11, 1, "conv2d+relu+max_pool2d"},  // 13x11 output: a row and a column uncovered
        Case2{9, 8, 10, 12, 0, "conv2d+relu+max_pool2d"},
        Case2{8, 264, 6, 7, 0, "conv2d+relu+max_pool2d"},  // more channels than one pooling block
        Case2{3, 8, 10, 12, 1, "max_pool2d"}}) {
    Tensor<float> const xt = to_float(uniform(Shape{3, cc.C, cc.H, cc.W}, gen)),
                        wt = to_float(uniform(Shape{cc.O, cc.C, 3, 3}, gen, -0.3, 0.3)),
                        bt = to_float(uniform(Shape{cc.O}, gen));
    std::int64_t const PH = (cc.H + 2 * cc.pad - 2) / 2, PW = (cc.W + 2 * cc.pad - 2) / 2;
    Tensor<float> const dir = to_float(uniform(Shape{3, cc.O, PH, PW}, gen));
    auto run = [&](bool fused) {
      Var x(xt, RequiresGrad::kYes), w(wt, RequiresGrad::kYes), b(bt, RequiresGrad::kYes);
      Var y = fused ? conv2d(x, w, b, Conv2dArgs{.padding = cc.pad, .epilogue = Epilogue::kReluMaxPool2})
                    : max_pool2d(conv2d(x, w, b, Conv2dArgs{.padding = cc.pad, .epilogue = Epilogue::kRelu}), 2);
      if (fused) CHECK(std::string(y.node().op) == cc.op);
      backward(sum(y * Var(dir)));
      return std::array<Tensor<float>, 4>{y.value(), x.grad(), w.grad(), b.grad()};
    };
    auto const f = run(true), u = run(false);
    INFO("C ", cc.C, " O ", cc.O, " H ", cc.H, " W ", cc.W, " pad ", cc.pad);
    for (int i = 0; i < 4; ++i) CHECK(max_abs_diff(f[i], u[i]) == 0.0);
  }
  VarD x = param(uniform(Shape{2, 3, 9, 8}, gen)), w = param(uniform(Shape{4, 3, 3, 3}, gen)),
       b = param(uniform(Shape{4}, gen));
  Conv2dArgs const args{.padding = 1, .algorithm = ConvAlgorithm::kWinograd, .epilogue = Epilogue::kReluMaxPool2};
  check_grad("conv2d+relu+max_pool2d", [args](Inputs const& v) { return conv2d(v[0], v[1], v[2], args); }, {x, w, b});
  // One enum, so "pool without relu" or "pool 3" cannot be spelled; a value outside it is named.
  check_throws_with<ArgumentError>([&] { (void)conv2d(x, w, b, Conv2dArgs{.epilogue = static_cast<Epilogue>(7)}); },
                                   {"epilogue", "7"});
}
