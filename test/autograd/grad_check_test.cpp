// grad_check itself: it passes correct gradients, and it catches (and locates) wrong ones.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "test/autograd/testing.hpp"

using namespace ddp;
using namespace ddp::testing;

namespace {

// y = x² with a backward that is wrong by `factor` at element `bad` (factor 1: correct).
VarD square_with_bug(VarD const& x, std::int64_t bad, double factor) {
  Tensor<double> y(x.shape());
  for (std::int64_t i = 0; i < y.numel(); ++i) y[i] = x.value()[i] * x.value()[i];
  return detail::record(
      "square_with_bug", std::move(y),
      [x, bad, factor](NodeD& self) {
        auto& xn = x.node();
        double const beta = detail::grad_beta(xn);
        for (std::int64_t i = 0; i < xn.value.numel(); ++i) {
          double const g = self.grad[i] * 2 * xn.value[i] * (i == bad ? factor : 1.0);
          xn.grad[i] = beta == 0 ? g : xn.grad[i] + g;
        }
      },
      x);
}

// y = a ⊙ b whose backward forgets b's gradient.
VarD mul_forgets_b(VarD const& a, VarD const& b) {
  Tensor<double> y(a.shape());
  for (std::int64_t i = 0; i < y.numel(); ++i) y[i] = a.value()[i] * b.value()[i];
  return detail::record(
      "mul_forgets_b", std::move(y),
      [a, b](NodeD& self) {
        auto& an = a.node();
        double const beta = detail::grad_beta(an);
        for (std::int64_t i = 0; i < an.value.numel(); ++i) {
          double const g = self.grad[i] * b.value()[i];
          an.grad[i] = beta == 0 ? g : an.grad[i] + g;
        }
      },
      a, b);
}

}  // namespace

TEST_CASE("grad_check passes a correct gradient, for scalar and non-scalar outputs") {
  Generator gen(11);
  VarD x = param(uniform(Shape{3, 4}, gen));
  auto const r1 = grad_check([](Inputs const& in) { return square_with_bug(in[0], -1, 1.0); }, {x});
  CHECK(r1.ok);
  CHECK(r1.max_error < 1e-8);
  CHECK(r1.elements_checked == 12);
  auto const r2 = grad_check([](Inputs const& in) { return sum(square_with_bug(in[0], -1, 1.0)); }, {x});
  CHECK(r2.ok);
  CHECK(r2.max_error < 1e-8);
}

TEST_CASE("grad_check catches a gradient wrong in one element and names the input and element") {
  Generator gen(12);
  VarD c = constant(uniform(Shape{2, 2}, gen));
  VarD x = param(away_from_zero(Shape{2, 3}, gen, 0.5));
  for (std::int64_t bad : {0, 4, 5}) {
    // A 1e-4 relative mistake: far below what a loss curve would show, far above the checker's noise.
    auto const r = grad_check([bad](Inputs const& in) { return square_with_bug(in[1], bad, 1.0 + 1e-4); }, {c, x});
    CHECK_FALSE(r.ok);
    CHECK(r.worst_input == 1);
    CHECK(r.worst_element == bad);
    CHECK(r.max_error > 1e-5);
    CHECK(r.max_error < 2e-4);
    CHECK(r.elements_checked == 6);  // the constant input is not checked
    CHECK(contains(r.summary(), "FAILED"));
    CHECK(contains(r.summary(), "input 1 element " + std::to_string(bad)));
  }
}

TEST_CASE("grad_check catches a missing gradient (an input the backward forgets)") {
  Generator gen(13);
  VarD a = param(uniform(Shape{5}, gen)), b = param(away_from_zero(Shape{5}, gen, 0.5));
  auto const r = grad_check([](Inputs const& in) { return mul_forgets_b(in[0], in[1]); }, {a, b});
  CHECK_FALSE(r.ok);
  CHECK(r.worst_input == 1);
  CHECK(r.worst_analytic == 0.0);
  CHECK(r.worst_numeric != 0.0);
}

TEST_CASE("grad_check's error measure: relative for large gradients, absolute below atol") {
  Generator gen(14);
  // Gradients ~200: an absolute error of 2e-6 (relative 1e-8) is finite-difference-level agreement, and
  // passes; an absolute measure would fail it.
  VarD big = param(full<double>(Shape{3}, 100.0));
  for (std::int64_t i = 0; i < 3; ++i) big.value()[i] += gen.uniform(0.0, 1.0);
  auto const rb = grad_check([](Inputs const& in) { return sum(square_with_bug(in[0], 2, 1.0 + 1e-8)); }, {big});
  CHECK(rb.ok);
  CHECK(rb.max_error > 1e-9);
  // ... while a 1e-5 relative error on such a gradient is caught, and measured as relative.
  auto const rb_bad = grad_check([](Inputs const& in) { return sum(square_with_bug(in[0], 2, 1.0 + 1e-5)); }, {big});
  CHECK_FALSE(rb_bad.ok);
  CHECK(rb_bad.worst_element == 2);
  CHECK(rb_bad.max_error == doctest::Approx(1e-5).epsilon(1e-2));
  // Gradients near zero (x ~ 1e-9): a purely relative measure would fail on finite-difference noise.
  VarD tiny = param(full<double>(Shape{4}, 1e-9));
  auto const rt = grad_check([](Inputs const& in) { return sum(square_with_bug(in[0], -1, 1.0)); }, {tiny});
  CHECK(rt.ok);
}

TEST_CASE("grad_check restores its inputs bit for bit and fails on NaN") {
  Generator gen(15);
  VarD x = param(uniform(Shape{2, 3}, gen));
  Tensor<double> const before = clone(x.value());
  (void)grad_check([](Inputs const& in) { return tanh(in[0]); }, {x});
  for (std::int64_t i = 0; i < x.numel(); ++i) CHECK(x.value()[i] == before[i]);

  // A NaN in one element of the backward only (the forward is finite).
  auto const r = grad_check(
      [](Inputs const& in) { return sum(square_with_bug(in[0], 1, std::numeric_limits<double>::quiet_NaN())); }, {x});
  CHECK_FALSE(r.ok);
  CHECK(r.worst_element == 1);
  CHECK(std::isinf(r.max_error));
}

TEST_CASE("grad_check rejects nothing to check and bad options") {
  Generator gen(16);
  VarD c = constant(uniform(Shape{2}, gen));
  auto f = [](Inputs const& in) { return tanh(in[0]); };
  check_throws_with<ArgumentError>([&] { (void)grad_check(f, {c}); }, {"no input requires grad"});
  VarD x = param(uniform(Shape{2}, gen));
  check_throws_with<ArgumentError>([&] { (void)grad_check(f, {x}, GradCheckOptions{.eps = 0}); }, {"eps"});
  check_throws_with<ArgumentError>([&] { (void)grad_check(f, {x}, GradCheckOptions{.atol = -1}); }, {"atol"});
}
