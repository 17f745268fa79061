// Dense op families (linear, elementwise, activation, reduce, shape_ops): gradients against central finite
// differences in double on random shapes, forward values against direct loops, and shape errors.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <string>

#include "test/autograd/testing.hpp"

using namespace ddp;
using namespace ddp::testing;

namespace {

std::string label(char const* what, std::uint64_t seed, Shape const& s) {
  return detail::cat(what, " seed ", seed, " shape ", s);
}

// A random shape of the given rank, each dim in [1, hi].
Shape random_shape(Generator& gen, int rank, std::int64_t hi = 4) {
  std::array<std::int64_t, 4> d{};
  for (int i = 0; i < rank; ++i) d[i] = dim(gen, 1, hi);
  return Shape::from_range(d.begin(), d.begin() + rank);
}

}  // namespace

// ---- linear.hpp ----

TEST_CASE("matmul: gradient of both operands, and of one with the other constant") {
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    Generator gen(seed);
    std::int64_t const M = dim(gen, 1, 6), K = dim(gen, 1, 6), N = dim(gen, 1, 6);
    VarD a = param(uniform(Shape{M, K}, gen)), b = param(uniform(Shape{K, N}, gen));
    auto f = [](Inputs const& in) { return matmul(in[0], in[1]); };
    check_grad(label("matmul", seed, Shape{M, K, N}), f, {a, b});
    check_grad(label("matmul, b constant", seed, Shape{M, K, N}), f, {a, constant(b.value())});
    check_grad(label("matmul, a constant", seed, Shape{M, K, N}), f, {constant(a.value()), b});
  }
}

TEST_CASE("matmul forward equals the triple loop") {
  Generator gen(21);
  VarD a = constant(uniform(Shape{3, 5}, gen)), b = constant(uniform(Shape{5, 4}, gen));
  Tensor<double> const y = matmul(a, b).value();
  REQUIRE(y.shape() == Shape{3, 4});
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) {
      double s = 0;
      for (int k = 0; k < 5; ++k) s += a.value()[i * 5 + k] * b.value()[k * 4 + j];
      CHECK(y[i * 4 + j] == doctest::Approx(s).epsilon(1e-14));
    }
}

TEST_CASE("linear: with and without bias, 1-D to 4-D input, every input's gradient") {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    Generator gen(seed);
    std::int64_t const B = dim(gen, 1, 5), A = dim(gen, 1, 3), in = dim(gen, 1, 6), out = dim(gen, 1, 6);
    VarD w = param(uniform(Shape{out, in}, gen)), b = param(uniform(Shape{out}, gen));
    for (Shape xs : {Shape{in}, Shape{B, in}, Shape{A, B, in}, Shape{2, A, B, in}}) {
      VarD x = param(uniform(xs, gen));
      check_grad(label("linear+bias", seed, xs), [](Inputs const& v) { return linear(v[0], v[1], v[2]); }, {x, w, b});
      check_grad(label("linear", seed, xs), [](Inputs const& v) { return linear(v[0], v[1]); }, {x, w});
      check_grad(label("linear, x constant", seed, xs), [](Inputs const& v) { return linear(v[0], v[1], v[2]); },
                 {constant(x.value()), w, b});
    }
  }
}

TEST_CASE("linear forward: y[..., o] = Σ_i x[..., i] W[o, i] + b[o], leading dims kept") {
  Generator gen(22);
  VarD x = constant(uniform(Shape{2, 3, 4}, gen)), w = constant(uniform(Shape{5, 4}, gen)),
       b = constant(uniform(Shape{5}, gen));
  Tensor<double> const y = linear(x, w, b).value();
  REQUIRE(y.shape() == Shape{2, 3, 5});
  Tensor<double> const y0 = linear(x, w).value();
  for (int r = 0; r < 6; ++r)
    for (int o = 0; o < 5; ++o) {
      double s = 0;
      for (int i = 0; i < 4; ++i) s += x.value()[r * 4 + i] * w.value()[o * 4 + i];
      CHECK(y0[r * 5 + o] == doctest::Approx(s).epsilon(1e-14));
      CHECK(y[r * 5 + o] == doctest::Approx(s + b.value()[o]).epsilon(1e-14));
    }
}

TEST_CASE("linear and matmul shape errors name both shapes") {
  Generator gen(23);
  VarD a = param(uniform(Shape{2, 3}, gen)), b = param(uniform(Shape{4, 5}, gen));
  check_throws_with<ShapeError>([&] { (void)matmul(a, b); }, {"matmul", "[2, 3]", "[4, 5]"});
  check_throws_with<ShapeError>([&] { (void)matmul(a, param(uniform(Shape{3}, gen))); }, {"[2, 3]", "[3]"});
  VarD w = param(uniform(Shape{5, 4}, gen));
  check_throws_with<ShapeError>([&] { (void)linear(a, w); }, {"linear", "[2, 3]", "[5, 4]"});
  check_throws_with<ShapeError>(
      [&] {
        (void)linear(param(uniform(Shape{2, 4}, gen)), w, param(uniform(Shape{4}, gen)));
      },
      {"bias", "[4]", "[5]"});
}

TEST_CASE("linear_residual: r + linear(x, W, b), every input's gradient, r a leaf, interior, reused or x itself") {
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    Generator gen(seed);
    std::int64_t const B = dim(gen, 1, 5), n = dim(gen, 1, 6), in = dim(gen, 1, 6), out = dim(gen, 1, 6);
    VarD x = param(uniform(Shape{B, n, in}, gen)), w = param(uniform(Shape{out, in}, gen)),
         b = param(uniform(Shape{out}, gen)), r = param(uniform(Shape{B, n, out}, gen));
    Shape const xs = x.shape();
    check_grad(label("linear_residual+bias", seed, xs),
               [](Inputs const& v) { return linear_residual(v[0], v[1], v[2], v[3]); }, {r, x, w, b});
    check_grad(label("linear_residual", seed, xs), [](Inputs const& v) { return linear_residual(v[0], v[1], v[2]); },
               {r, x, w});
    // r interior with no other consumer: its gradient is lent, then flows on through tanh.
    check_grad(label("linear_residual, r interior", seed, xs),
               [](Inputs const& v) { return linear_residual(tanh(v[0]), v[1], v[2], v[3]); }, {r, x, w, b});
    // r interior and used again: the other use adds into the lent storage (before or after, by the sweep's order).
    check_grad(label("linear_residual, r reused", seed, xs),
               [](Inputs const& v) {
                 VarD const t = tanh(v[0]);
                 return mul(linear_residual(t, v[1], v[2], v[3]), t);
               },
               {r, x, w, b});
    // r is x: the product reads y's gradient (gx = gy·W) before r may borrow it.
    VarD sq = param(uniform(Shape{in, in}, gen)), sb = param(uniform(Shape{in}, gen));
    check_grad(label("linear_residual, r is x", seed, xs),
               [](Inputs const& v) {
                 VarD const t = tanh(v[0]);
                 return linear_residual(t, t, v[1], v[2]);
               },
               {x, sq, sb});
  }
}

TEST_CASE("linear_residual forward: add(r, linear(x, W, b)) up to rounding; a constant r leaves it a plain product") {
  Generator gen(24);
  VarD x = constant(uniform(Shape{3, 4}, gen)), w = param(uniform(Shape{5, 4}, gen)), b = param(uniform(Shape{5}, gen)),
       r = constant(uniform(Shape{3, 5}, gen));
  VarD const y = linear_residual(r, x, w, b);
  Tensor<double> const want = add(r, linear(x, w, b)).value();
  REQUIRE(y.shape() == Shape{3, 5});
  for (std::int64_t i = 0; i < 15; ++i) CHECK(y.value()[i] == doctest::Approx(want[i]).epsilon(1e-14));
  CHECK(std::string(y.op()) == "linear_residual");
  backward(sum(y));
  for (std::int64_t o = 0; o < 5; ++o) CHECK(b.grad()[o] == doctest::Approx(3.0).epsilon(1e-14));
}

TEST_CASE("linear_residual shape errors name the residual") {
  Generator gen(25);
  VarD x = param(uniform(Shape{2, 4}, gen)), w = param(uniform(Shape{5, 4}, gen));
  check_throws_with<ShapeError>(
      [&] {
        (void)linear_residual(param(uniform(Shape{2, 4}, gen)), x, w);
      },
      {"linear_residual", "residual", "[2, 4]", "[2, 5]"});
  check_throws_with<ShapeError>(
      [&] {
        (void)linear_residual(param(uniform(Shape{2, 5}, gen)), x, param(uniform(Shape{5, 3}, gen)));
      },
      {"linear_residual", "[2, 4]", "[5, 3]"});
  check_throws_with<ArgumentError>([&] { (void)linear_residual(VarD{}, x, w); }, {"linear_residual", "undefined"});
}

TEST_CASE("a lent gradient: the root keeps its seed, leaves keep their own storage") {
  Generator gen(26);
  VarD a = param(uniform(Shape{2, 3}, gen)), p = param(uniform(Shape{2, 3}, gen));
  // The root is add(t, s) with t = tanh(a) also inside s: t may not borrow the root's gradient, which backward keeps.
  VarD const t = tanh(a);
  VarD const y = add(t, mul(t, t));
  Tensor<double> seed = uniform(Shape{2, 3}, gen);
  Tensor<double> const seed_copy = clone(seed);
  backward(y, seed, {.retain_graph = true});
  for (std::int64_t i = 0; i < 6; ++i) {
    CHECK(y.grad()[i] == seed_copy[i]);
    double const th = t.value()[i];
    CHECK(a.grad()[i] == doctest::Approx(seed_copy[i] * (1 + 2 * th) * (1 - th * th)).epsilon(1e-13));
  }
  // A leaf input of an add never borrows: its gradient stays where it was (a parameter's lives in the arena).
  backward(sum(add(p, tanh(a))));
  double const* storage = p.grad().data();
  p.zero_grad();  // keeps the storage; the next backward overwrites it
  backward(sum(add(p, tanh(a))));
  CHECK(p.grad().data() == storage);
  for (std::int64_t i = 0; i < 6; ++i) CHECK(p.grad()[i] == 1.0);
}

// ---- elementwise.hpp ----

TEST_CASE("add and sub: same shape, trailing-dims (bias) broadcast, scalar broadcast") {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    Generator gen(seed);
    Shape const as = random_shape(gen, 1 + static_cast<int>(seed % 4));
    std::array<std::int64_t, 4> d{};
    for (int i = 0; i < as.rank(); ++i) d[i] = as[i];
    Shape const trailing = Shape::from_range(d.begin() + (as.rank() > 1 ? 1 : 0), d.begin() + as.rank());
    for (Shape bs : {as, trailing, Shape{1}}) {
      VarD a = param(uniform(as, gen)), b = param(uniform(bs, gen));
      check_grad(label("add", seed, bs), [](Inputs const& v) { return add(v[0], v[1]); }, {a, b});
      check_grad(label("sub", seed, bs), [](Inputs const& v) { return sub(v[0], v[1]); }, {a, b});
      check_grad(label("sub, a constant", seed, bs), [](Inputs const& v) { return sub(v[0], v[1]); },
                 {constant(a.value()), b});
    }
    VarD x = param(uniform(as, gen));
    check_grad(label("add(x, x)", seed, as), [](Inputs const& v) { return add(v[0], v[0]); }, {x});
    check_grad(label("sub(x, x) + x", seed, as), [](Inputs const& v) { return add(sub(v[0], v[0]), v[0]); }, {x});
  }
  // A bias over the last two of three dims.
  Generator gen(24);
  VarD a = param(uniform(Shape{3, 2, 4}, gen)), b = param(uniform(Shape{2, 4}, gen));
  check_grad("add 3-D + 2-D bias", [](Inputs const& v) { return add(v[0], v[1]); }, {a, b});
  check_grad("sub 3-D - 2-D bias", [](Inputs const& v) { return sub(v[0], v[1]); }, {a, b});
}

TEST_CASE("add and sub forward with broadcasting") {
  Generator gen(25);
  VarD a = constant(uniform(Shape{3, 4}, gen)), bias = constant(uniform(Shape{4}, gen)),
       s = constant(from_values<double>(Shape{1}, {0.75}));
  Tensor<double> const y1 = add(a, bias).value(), y2 = sub(a, bias).value(), y3 = sub(a, s).value(),
                       y4 = (a + a).value();
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) {
      double const av = a.value()[r * 4 + c];
      CHECK(y1[r * 4 + c] == av + bias.value()[c]);
      CHECK(y2[r * 4 + c] == doctest::Approx(av - bias.value()[c]).epsilon(1e-15));
      CHECK(y3[r * 4 + c] == doctest::Approx(av - 0.75).epsilon(1e-15));
      CHECK(y4[r * 4 + c] == 2 * av);
    }
}

TEST_CASE("mul and scale") {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    Generator gen(seed);
    Shape const s = random_shape(gen, 1 + static_cast<int>(seed % 4));
    VarD a = param(uniform(s, gen)), b = param(uniform(s, gen));
    check_grad(label("mul", seed, s), [](Inputs const& v) { return mul(v[0], v[1]); }, {a, b});
    check_grad(label("mul(x, x)", seed, s), [](Inputs const& v) { return mul(v[0], v[0]); }, {a});
    check_grad(label("mul, b constant", seed, s), [](Inputs const& v) { return v[0] * v[1]; },
               {a, constant(b.value())});
    double const c = gen.uniform(-3.0, 3.0);
    check_grad(label("scale", seed, s), [c](Inputs const& v) { return scale(v[0], c); }, {a});
  }
  Generator gen(26);
  VarD a = constant(uniform(Shape{2, 3}, gen)), b = constant(uniform(Shape{2, 3}, gen));
  Tensor<double> const p = mul(a, b).value(), q = scale(a, -2.5).value();
  for (int i = 0; i < 6; ++i) {
    CHECK(p[i] == a.value()[i] * b.value()[i]);
    CHECK(q[i] == -2.5 * a.value()[i]);
  }
}

TEST_CASE("elementwise shape errors name both shapes") {
  Generator gen(27);
  VarD a = param(uniform(Shape{2, 3}, gen));
  check_throws_with<ShapeError>([&] { (void)add(a, param(uniform(Shape{2}, gen))); }, {"add", "[2, 3]", "[2]"});
  check_throws_with<ShapeError>([&] { (void)sub(a, param(uniform(Shape{3, 2}, gen))); }, {"sub", "[2, 3]", "[3, 2]"});
  check_throws_with<ShapeError>([&] { (void)mul(a, param(uniform(Shape{3}, gen))); }, {"mul", "[2, 3]", "[3]"});
}

// ---- activation.hpp ----

TEST_CASE("relu (inputs kept 0.1 away from the kink), tanh, sigmoid") {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    Generator gen(seed);
    Shape const s = random_shape(gen, 1 + static_cast<int>(seed % 4), 5);
    VarD xr = param(away_from_zero(s, gen));
    check_grad(label("relu", seed, s), [](Inputs const& v) { return relu(v[0]); }, {xr});
    VarD x = param(uniform(s, gen, -3.0, 3.0));
    check_grad(label("tanh", seed, s), [](Inputs const& v) { return tanh(v[0]); }, {x});
    check_grad(label("sigmoid", seed, s), [](Inputs const& v) { return sigmoid(v[0]); }, {x});
    // Composition through a linear layer, where relu sees interior values (nudged by a bias away from 0).
    VarD w = param(uniform(Shape{3, s[s.rank() - 1]}, gen));
    check_grad(label("tanh(sigmoid(linear))", seed, s),
               [](Inputs const& v) { return tanh(sigmoid(linear(v[0], v[1]))); }, {x, w});
  }
}

TEST_CASE("activation forward values") {
  VarD x = constant(from_values<double>(Shape{5}, {-2.0, -0.5, 0.0, 0.5, 3.0}));
  Tensor<double> const r = relu(x).value(), t = tanh(x).value(), s = sigmoid(x).value();
  for (int i = 0; i < 5; ++i) {
    double const v = x.value()[i];
    CHECK(r[i] == (v > 0 ? v : 0.0));
    CHECK(t[i] == doctest::Approx(std::tanh(v)).epsilon(1e-15));
    CHECK(s[i] == doctest::Approx(1 / (1 + std::exp(-v))).epsilon(1e-15));
  }
}

// ---- reduce.hpp ----

TEST_CASE("sum and mean: gradients and values") {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    Generator gen(seed);
    Shape const s = random_shape(gen, 1 + static_cast<int>(seed % 4), 5);
    VarD x = param(uniform(s, gen));
    check_grad(label("sum", seed, s), [](Inputs const& v) { return sum(v[0]); }, {x});
    check_grad(label("mean", seed, s), [](Inputs const& v) { return mean(v[0]); }, {x});
    check_grad(label("mean(x ⊙ x)", seed, s), [](Inputs const& v) { return mean(mul(v[0], v[0])); }, {x});
    double ref = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) ref += x.value()[i];
    VarD const sx = sum(x), mx = mean(x);
    CHECK(sx.shape() == Shape{1});
    CHECK(sx.item() == doctest::Approx(ref).epsilon(1e-14));
    CHECK(mx.item() == doctest::Approx(ref / double(x.numel())).epsilon(1e-14));
  }
}

// ---- shape_ops.hpp ----

TEST_CASE("reshape and flatten: gradients, including reshapes of interior values (gradient aliasing)") {
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    Generator gen(seed);
    std::int64_t const N = dim(gen, 1, 3), C = dim(gen, 1, 3), H = dim(gen, 1, 4), W = dim(gen, 1, 4);
    Shape const s{N, C, H, W};
    VarD x = param(uniform(s, gen));
    check_grad(label("reshape", seed, s), [=](Inputs const& v) { return reshape(v[0], Shape{N * C, H * W}); }, {x});
    check_grad(label("flatten", seed, s), [](Inputs const& v) { return flatten(v[0]); }, {x});
    // An interior input reshaped twice: the first reshape's gradient becomes h's storage, the second adds to it.
    check_grad(label("two reshapes of tanh(x)", seed, s),
               [=](Inputs const& v) {
                 VarD h = tanh(v[0]);
                 return mul(reshape(h, Shape{N, C * H * W}), flatten(h));
               },
               {x});
    // Interior value used both reshaped and directly, and a reshape chain as the root.
    check_grad(label("reshape chain + direct use", seed, s),
               [=](Inputs const& v) {
                 VarD h = sigmoid(v[0]);
                 VarD r = reshape(reshape(h, Shape{N * C * H * W}), s);
                 return reshape(add(mul(r, h), h), Shape{N, C * H * W});
               },
               {x});
  }
}

TEST_CASE("reshape and flatten: values shared, shapes as documented, errors name shapes") {
  Generator gen(28);
  VarD x = param(uniform(Shape{2, 3, 4}, gen));
  VarD f = flatten(x);
  CHECK(f.shape() == Shape{2, 12});
  CHECK(f.value().data() == x.value().data());
  CHECK(reshape(x, Shape{4, 6}).shape() == Shape{4, 6});
  check_throws_with<ShapeError>([&] { (void)reshape(x, Shape{5, 5}); }, {"reshape", "[2, 3, 4]", "[5, 5]"});
}

TEST_CASE("float and double agree on a small network's forward and gradients") {
  Generator gen(29);
  Tensor<double> const xd = uniform(Shape{4, 3}, gen), wd = uniform(Shape{5, 3}, gen), bd = uniform(Shape{5}, gen);
  VarD w = param(clone(wd)), b = param(clone(bd));
  Var wf(to_float(wd), RequiresGrad::kYes), bf(to_float(bd), RequiresGrad::kYes);
  VarD const ld = mean(mul(sigmoid(linear(constant(xd), w, b)), tanh(scale(linear(constant(xd), w), 0.5))));
  Var const lf =
      mean(mul(sigmoid(linear(Var(to_float(xd)), wf, bf)), tanh(scale(linear(Var(to_float(xd)), wf), 0.5f))));
  CHECK(lf.item() == doctest::Approx(ld.item()).epsilon(1e-6));
  backward(ld);
  backward(lf);
  for (std::int64_t i = 0; i < w.numel(); ++i)
    CHECK(wf.grad()[i] == doctest::Approx(w.grad()[i]).epsilon(1e-5).scale(1));
  for (std::int64_t i = 0; i < b.numel(); ++i)
    CHECK(bf.grad()[i] == doctest::Approx(b.grad()[i]).epsilon(1e-5).scale(1));
}
