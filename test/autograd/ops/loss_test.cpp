// Loss and dropout op families (log_softmax, mse_loss, cross_entropy, nll_loss, dropout): gradients against
// central finite differences in double, forward values against the formulas, and errors.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "test/autograd/testing.hpp"

using namespace ddp;
using namespace ddp::testing;

namespace {

// log_softmax over the last dim by the formula x - m - log Σ exp(x - m), in long double.
Tensor<double> log_softmax_reference(Tensor<double> const& x) {
  std::int64_t const cols = x.size(-1), rows = x.numel() / cols;
  Tensor<double> y(x.shape());
  for (std::int64_t r = 0; r < rows; ++r) {
    long double m = x[r * cols];
    for (std::int64_t c = 1; c < cols; ++c) m = std::max<long double>(m, x[r * cols + c]);
    long double z = 0;
    for (std::int64_t c = 0; c < cols; ++c) z += std::exp(static_cast<long double>(x[r * cols + c]) - m);
    for (std::int64_t c = 0; c < cols; ++c) y[r * cols + c] = static_cast<double>(x[r * cols + c] - m - std::log(z));
  }
  return y;
}

Shape logits_shape(Generator& gen, int rank) {
  std::int64_t const C = dim(gen, 1, 6);
  if (rank == 1) return Shape{C};
  if (rank == 2) return Shape{dim(gen, 1, 5), C};
  return Shape{dim(gen, 1, 3), dim(gen, 1, 3), C};
}

}  // namespace

// ---- log_softmax ----

TEST_CASE("log_softmax: gradient over the last dim of 1-, 2- and 3-D inputs; values against the formula") {
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    Generator gen(seed);
    Shape const s = logits_shape(gen, 1 + static_cast<int>(seed % 3));
    VarD x = param(uniform(s, gen, -3.0, 3.0));
    check_grad(detail::cat("log_softmax seed ", seed, " shape ", s), [](Inputs const& v) { return log_softmax(v[0]); },
               {x});
    CHECK(max_abs_diff(log_softmax(x).value(), log_softmax_reference(x.value())) < 1e-14);
  }
}

TEST_CASE("log_softmax is stable for large logits, and each row's probabilities sum to 1") {
  VarD x = param(from_values<double>(Shape{2, 3}, {1000.0, 1001.0, 999.0, -1000.0, -1002.0, -1001.5}));
  Tensor<double> const y = log_softmax(x).value();
  CHECK(max_abs_diff(y, log_softmax_reference(x.value())) < 1e-12);
  for (int r = 0; r < 2; ++r) {
    double s = 0;
    for (int c = 0; c < 3; ++c) s += std::exp(y[r * 3 + c]);
    CHECK(s == doctest::Approx(1.0).epsilon(1e-14));
  }
  check_grad("log_softmax large logits", [](Inputs const& v) { return log_softmax(v[0]); }, {x});
  // float: log-probabilities of logits near 1000 keep float's relative precision (x - max is exact there;
  // forming max + log Σ first would round to ulp(1000) ≈ 6e-5).
  Tensor<float> xf(Shape{2, 3});
  for (std::int64_t i = 0; i < 6; ++i) xf[i] = static_cast<float>(x.value()[i]);
  Tensor<float> const yf = log_softmax(Var(xf)).value();
  for (std::int64_t i = 0; i < 6; ++i) CHECK(yf[i] == doctest::Approx(y[i]).epsilon(1e-6));
  Tensor<std::int32_t> const t = from_values<std::int32_t>(Shape{2}, {2, 0});
  CHECK(cross_entropy(Var(xf), t).item() == doctest::Approx(-(y[2] + y[3]) / 2).epsilon(1e-6));
}

// ---- mse_loss ----

TEST_CASE("mse_loss: gradient of the prediction and the value mean((p - t)²)") {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    Generator gen(seed);
    Shape const s = logits_shape(gen, 1 + static_cast<int>(seed % 3));
    VarD p = param(uniform(s, gen));
    Tensor<double> const t = uniform(s, gen);
    check_grad(detail::cat("mse_loss seed ", seed, " shape ", s), [&t](Inputs const& v) { return mse_loss(v[0], t); },
               {p});
    double ref = 0;
    for (std::int64_t i = 0; i < p.numel(); ++i) ref += (p.value()[i] - t[i]) * (p.value()[i] - t[i]);
    CHECK(mse_loss(p, t).item() == doctest::Approx(ref / double(p.numel())).epsilon(1e-14));
  }
  Generator gen(30);
  check_throws_with<ShapeError>(
      [&] {
        (void)mse_loss(param(uniform(Shape{2, 3}, gen)), uniform(Shape{3, 2}, gen));
      },
      {"mse_loss", "[2, 3]", "[3, 2]"});
}

// ---- cross_entropy and nll_loss ----

TEST_CASE("cross_entropy and nll_loss: gradients on 1-row, 2-D and 3-D logits") {
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    Generator gen(seed);
    Shape const s = logits_shape(gen, 2 + static_cast<int>(seed % 2));
    std::int64_t const C = s[s.rank() - 1], rows = s.numel() / C;
    Tensor<std::int32_t> const t = random_targets(rows, C, gen);
    VarD x = param(uniform(s, gen, -3.0, 3.0));
    std::string const what = detail::cat("seed ", seed, " shape ", s);
    check_grad("cross_entropy " + what, [&t](Inputs const& v) { return cross_entropy(v[0], t); }, {x});
    // nll_loss on arbitrary inputs (it is linear in them), and on log-probabilities.
    check_grad("nll_loss " + what, [&t](Inputs const& v) { return nll_loss(v[0], t); }, {x});
    check_grad("nll_loss(log_softmax) " + what, [&t](Inputs const& v) { return nll_loss(log_softmax(v[0]), t); }, {x});
    // A loss scaled after the fact: the incoming gradient is not 1.
    check_grad("3 · cross_entropy " + what, [&t](Inputs const& v) { return scale(cross_entropy(v[0], t), 3.0); }, {x});
  }
}

TEST_CASE("cross_entropy equals nll_loss(log_softmax), in value and gradient; nll_loss is the mean of -logp[target]") {
  for (std::uint64_t seed = 10; seed < 14; ++seed) {
    Generator gen(seed);
    std::int64_t const rows = dim(gen, 1, 6), C = dim(gen, 2, 7);
    Tensor<std::int32_t> const t = random_targets(rows, C, gen);
    Tensor<double> const logits = uniform(Shape{rows, C}, gen, -4.0, 4.0);
    VarD a = param(clone(logits)), b = param(clone(logits));
    VarD const ce = cross_entropy(a, t), nl = nll_loss(log_softmax(b), t);
    CHECK(ce.item() == doctest::Approx(nl.item()).epsilon(1e-14));
    backward(ce);
    backward(nl);
    CHECK(max_abs_diff(a.grad(), b.grad()) < 1e-15);
    // By hand: -mean_r logp[r, t[r]], and the gradient (softmax - onehot) / rows.
    Tensor<double> const lp = log_softmax_reference(logits);
    double ref = 0;
    for (std::int64_t r = 0; r < rows; ++r) ref -= lp[r * C + t[r]];
    CHECK(ce.item() == doctest::Approx(ref / double(rows)).epsilon(1e-14));
    CHECK(nll_loss(constant(lp), t).item() == doctest::Approx(ref / double(rows)).epsilon(1e-14));
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < C; ++c)
        CHECK(a.grad()[r * C + c] ==
              doctest::Approx((std::exp(lp[r * C + c]) - (c == t[r] ? 1.0 : 0.0)) / double(rows)).epsilon(1e-13));
  }
}

TEST_CASE("cross_entropy is stable for large logits") {
  VarD x = param(from_values<double>(Shape{2, 3}, {1000.0, 1001.0, 999.0, -1000.0, -1002.0, -1001.5}));
  Tensor<std::int32_t> const t = from_values<std::int32_t>(Shape{2}, {2, 0});
  VarD const l = cross_entropy(x, t);
  CHECK(std::isfinite(l.item()));
  Tensor<double> const lp = log_softmax_reference(x.value());
  CHECK(l.item() == doctest::Approx(-(lp[2] + lp[3]) / 2).epsilon(1e-13));
  check_grad("cross_entropy large logits", [&t](Inputs const& v) { return cross_entropy(v[0], t); }, {x});
}

TEST_CASE("cross_entropy and nll_loss errors name the shapes and the bad target") {
  Generator gen(31);
  VarD x = param(uniform(Shape{4, 3}, gen));
  check_throws_with<ShapeError>([&] { (void)cross_entropy(x, random_targets(3, 3, gen)); },
                                {"cross_entropy", "[3]", "[4]"});
  check_throws_with<ShapeError>([&] { (void)nll_loss(x, random_targets(5, 3, gen)); }, {"nll_loss", "[5]", "[4]"});
  Tensor<std::int32_t> bad = from_values<std::int32_t>(Shape{4}, {0, 1, 3, 2});
  check_throws_with<ArgumentError>([&] { (void)cross_entropy(x, bad); }, {"target 3", "row 2"});
  bad[2] = -1;
  check_throws_with<ArgumentError>([&] { (void)nll_loss(x, bad); }, {"target -1", "row 2"});
}

// ---- dropout ----

TEST_CASE("dropout in training: gradient with the mask fixed by re-seeding; eval and p = 0 are the identity") {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    Generator gen(seed);
    Shape const s{dim(gen, 1, 4), dim(gen, 1, 8)};
    VarD x = param(uniform(s, gen));
    for (double p : {0.2, 0.5, 0.9}) {
      check_grad(detail::cat("dropout train p ", p, " seed ", seed),
                 [p, seed](Inputs const& v) {
                   Generator g(seed * 1000);  // same seed every call: the same mask
                   return dropout(v[0], p, Mode::kTrain, g);
                 },
                 {x});
      check_grad(detail::cat("dropout eval p ", p, " seed ", seed),
                 [p, seed](Inputs const& v) {
                   Generator g(seed);
                   return tanh(dropout(v[0], p, Mode::kEval, g));
                 },
                 {x});
    }
  }
}

TEST_CASE("dropout forward: kept elements scaled by 1/(1-p), about p dropped, same seed same mask") {
  Generator data(40);
  VarD x = param(uniform(Shape{100, 100}, data, 0.5, 1.5));  // nonzero, so a zero output means dropped
  double const p = 0.3;
  Generator g1(7), g2(7), g3(8);
  Tensor<double> const y1 = dropout(x, p, Mode::kTrain, g1).value(), y2 = dropout(x, p, Mode::kTrain, g2).value(),
                       y3 = dropout(x, p, Mode::kTrain, g3).value();
  std::int64_t dropped = 0, differ = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    if (y1[i] == 0.0)
      ++dropped;
    else
      CHECK(y1[i] == doctest::Approx(x.value()[i] / (1 - p)).epsilon(1e-15));
    CHECK(y1[i] == y2[i]);
    differ += (y1[i] == 0.0) != (y3[i] == 0.0);
  }
  double const frac = double(dropped) / double(x.numel());
  CHECK(frac == doctest::Approx(p).epsilon(0.05));  // 10000 draws: std ≈ 0.0046, 5% relative ≈ 3σ
  CHECK(differ > 1000);                             // another seed, another mask
  // The generator advanced: a second draw from the same generator gives another mask.
  Tensor<double> const y1b = dropout(x, p, Mode::kTrain, g1).value();
  CHECK(max_abs_diff(y1, y1b) > 0.0);

  // float draws the same mask as double from the same seed.
  Tensor<float> xf(x.shape());
  for (std::int64_t i = 0; i < x.numel(); ++i) xf[i] = static_cast<float>(x.value()[i]);
  Generator gf(7);
  Tensor<float> const yf = dropout(Var(xf, RequiresGrad::kYes), p, Mode::kTrain, gf).value();
  std::int64_t mismatched = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) mismatched += (yf[i] == 0.0f) != (y1[i] == 0.0);
  CHECK(mismatched == 0);

  // Eval and p = 0: the identity, and the generator is not consumed.
  Generator ge(9), ge_ref(9);
  VarD const e = dropout(x, p, Mode::kEval, ge), z = dropout(x, 0.0, Mode::kTrain, ge);
  CHECK(max_abs_diff(e.value(), x.value()) == 0.0);
  CHECK(max_abs_diff(z.value(), x.value()) == 0.0);
  CHECK(ge.next_u32() == ge_ref.next_u32());
}

TEST_CASE("dropout rejects p outside [0, 1)") {
  Generator gen(41);
  VarD x = param(uniform(Shape{3}, gen));
  for (double p : {-0.1, 1.0, 1.5, std::nan("")})
    check_throws_with<ArgumentError>([&] { (void)dropout(x, p, Mode::kTrain, gen); }, {"dropout", "p"});
}
