// Transformer op families (embedding, layer_norm, gelu, softmax with a causal mask, transpose, slice_last and
// split_last, bmm): gradients against central finite differences in double, forward values against direct loops,
// and the errors that name what is wrong.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <string>

#include "test/autograd/testing.hpp"

using namespace ddp;
using namespace ddp::testing;

namespace {

Tensor<std::int32_t> random_ids(Shape s, std::int64_t rows, Generator& gen) {
  Tensor<std::int32_t> t(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<std::int32_t>(gen.below(std::uint32_t(rows)));
  return t;
}

}  // namespace

// ---- embedding.hpp ----

TEST_CASE("embedding: forward gathers rows, backward adds every use of a row (repeated ids included)") {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    Generator gen(seed);
    std::int64_t const rows = dim(gen, 1, 5), d = dim(gen, 1, 4), B = dim(gen, 1, 3), T = dim(gen, 2, 6);
    VarD table = param(uniform(Shape{rows, d}, gen));
    auto const ids = random_ids(Shape{B, T}, rows, gen);
    VarD y = embedding(table, ids);
    REQUIRE(y.shape() == Shape{B, T, d});
    for (std::int64_t i = 0; i < B * T; ++i)
      for (std::int64_t c = 0; c < d; ++c) CHECK(y.value()[i * d + c] == table.value()[ids[i] * d + c]);
    check_grad(detail::cat("embedding seed ", seed), [&](Inputs const& in) { return embedding(in[0], ids); }, {table});
  }
}

TEST_CASE("embedding: a table used twice (a tied head) gets the sum of both gradients") {
  Generator gen(3);
  VarD table = param(uniform(Shape{5, 3}, gen));
  auto const ids = random_ids(Shape{2, 4}, 5, gen);
  auto f = [&](Inputs const& in) { return linear(embedding(in[0], ids), in[0]); };  // (2,4,3)·(5,3)ᵀ
  check_grad("tied embedding and head", f, {table});
  // The sum of the two uses, each computed alone.
  table.zero_grad();
  backward(sum(f({table})));
  Tensor<double> const both = clone(table.grad());
  table.zero_grad();
  VarD const frozen = constant(table.value());
  backward(sum(linear(embedding(table, ids), frozen)));
  Tensor<double> const first = clone(table.grad());
  table.zero_grad();
  backward(sum(linear(embedding(frozen, ids), table)));
  for (std::int64_t i = 0; i < both.numel(); ++i)
    CHECK(both[i] == doctest::Approx(first[i] + table.grad()[i]).epsilon(1e-12));
}

TEST_CASE("embedding: an id outside the table names its position and the table's size") {
  VarD table = param(zeros<double>(Shape{4, 2}));
  Tensor<std::int32_t> ids = from_values<std::int32_t>(Shape{3}, {0, 4, 1});
  check_throws_with<ArgumentError>([&] { (void)embedding(table, ids); }, {"id 4", "position 1", "[0, 4)"});
}

// ---- layer_norm.hpp ----

TEST_CASE("layer_norm: with and without weight and bias, gradients of every input") {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    Generator gen(seed);
    std::int64_t const R = dim(gen, 1, 4), C = dim(gen, 2, 7);
    VarD x = param(uniform(Shape{2, R, C}, gen)), w = param(uniform(Shape{C}, gen)), b = param(uniform(Shape{C}, gen));
    check_grad(detail::cat("layer_norm affine seed ", seed),
               [](Inputs const& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b});
    check_grad(detail::cat("layer_norm no bias seed ", seed),
               [](Inputs const& in) { return layer_norm(in[0], in[1], VarD{}); }, {x, w});
    check_grad(detail::cat("layer_norm plain seed ", seed),
               [](Inputs const& in) { return layer_norm(in[0], VarD{}, VarD{}, {.eps = 1e-3}); }, {x});
  }
}

TEST_CASE("layer_norm forward: biased variance, eps inside the root, then weight and bias") {
  Generator gen(9);
  VarD x = constant(uniform(Shape{3, 5}, gen)), w = constant(uniform(Shape{5}, gen)),
       b = constant(uniform(Shape{5}, gen));
  Tensor<double> const y = layer_norm(x, w, b, {.eps = 1e-5}).value();
  for (int r = 0; r < 3; ++r) {
    double m = 0, v = 0;
    for (int c = 0; c < 5; ++c) m += x.value()[r * 5 + c] / 5;
    for (int c = 0; c < 5; ++c) v += (x.value()[r * 5 + c] - m) * (x.value()[r * 5 + c] - m) / 5;
    for (int c = 0; c < 5; ++c)
      CHECK(y[r * 5 + c] ==
            doctest::Approx((x.value()[r * 5 + c] - m) / std::sqrt(v + 1e-5) * w.value()[c] + b.value()[c])
                .epsilon(1e-12));
  }
  check_throws_with<ShapeError>([&] { (void)layer_norm(x, constant(zeros<double>(Shape{4})), VarD{}); },
                                {"weight", "[4]", "5"});
}

// ---- activation.hpp: gelu ----

TEST_CASE("gelu: exact and tanh forms, values and gradients") {
  Generator gen(5);
  VarD x = param(uniform(Shape{4, 6}, gen, -3.0, 3.0));
  for (auto a : {GeluApprox::kErf, GeluApprox::kTanh})
    check_grad(a == GeluApprox::kErf ? "gelu erf" : "gelu tanh", [a](Inputs const& in) { return gelu(in[0], a); }, {x});
  Tensor<double> const ye = gelu(x, GeluApprox::kErf).value(), yt = gelu(x, GeluApprox::kTanh).value();
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    double const v = x.value()[i];
    CHECK(ye[i] == doctest::Approx(0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))).epsilon(1e-14));
    double const t = std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v));
    CHECK(yt[i] == doctest::Approx(0.5 * v * (1 + t)).epsilon(1e-14));
  }
}

TEST_CASE("gelu on float: the vectorised erf stays within a few ulps of the double result") {
  Generator gen(6);
  Tensor<double> xd = uniform(Shape{4096}, gen, -6.0, 6.0);
  Var xf(to_float(xd));
  Tensor<float> const yf = gelu(xf).value();
  Tensor<double> const yd = gelu(constant(xd)).value();
  CHECK(float_vs_double(yf, yd) < 2e-6);
}

// ---- softmax.hpp ----

TEST_CASE("softmax: scaled, plain and causal, gradients and row sums") {
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    Generator gen(seed);
    std::int64_t const T = dim(gen, 2, 5);
    VarD x = param(uniform(Shape{2, 3, T, T}, gen, -2.0, 2.0));
    for (auto m : {SoftmaxMask::kNone, SoftmaxMask::kCausal}) {
      SoftmaxArgs const args{.scale = 0.7, .mask = m};
      check_grad(detail::cat("softmax seed ", seed, m == SoftmaxMask::kCausal ? " causal" : ""),
                 [args](Inputs const& in) { return softmax(in[0], args); }, {x});
      Tensor<double> const y = softmax(x, args).value();
      for (std::int64_t r = 0; r < x.numel() / T; ++r) {
        double s = 0;
        for (std::int64_t j = 0; j < T; ++j) {
          if (m == SoftmaxMask::kCausal && j > r % T) CHECK(y[r * T + j] == 0.0);
          s += y[r * T + j];
        }
        CHECK(s == doctest::Approx(1.0).epsilon(1e-14));
      }
    }
  }
  // Against the formula, first row of a causal 3×3: only key 0 is visible.
  VarD x = constant(from_values<double>(Shape{3, 3}, {1, 5, 5, 2, 3, 9, 0, 1, 2}));
  Tensor<double> const y = softmax(x, {.scale = 2.0, .mask = SoftmaxMask::kCausal}).value();
  CHECK(y[0] == 1.0);
  CHECK(y[3] == doctest::Approx(std::exp(4.0) / (std::exp(4.0) + std::exp(6.0))).epsilon(1e-14));
  check_throws_with<ShapeError>(
      [&] {
        (void)softmax(constant(zeros<double>(Shape{2, 3})), {.mask = SoftmaxMask::kCausal});
      },
      {"causal", "(…, T, T)"});
}

// ---- shape_ops.hpp: transpose, slice_last, split_last ----

TEST_CASE("transpose: every pair of axes of 2-D to 4-D tensors, values and gradients") {
  Generator gen(8);
  for (int rank = 2; rank <= 4; ++rank) {
    std::array<std::int64_t, 4> d{};
    for (int i = 0; i < rank; ++i) d[i] = dim(gen, 1, 4);
    Shape const s = Shape::from_range(d.begin(), d.begin() + rank);
    VarD x = param(uniform(s, gen));
    for (int i = 0; i < rank; ++i)
      for (int j = i + 1; j < rank; ++j) {
        check_grad(detail::cat("transpose ", i, ",", j, " of ", s),
                   [i, j](Inputs const& in) { return transpose(in[0], i, j); }, {x});
        // Values: index arithmetic on the padded 4-D shape.
        Tensor<double> const y = transpose(x, i, j).value();
        std::array<std::int64_t, 4> dd{1, 1, 1, 1}, ys{1, 1, 1, 1};
        for (int k = 0; k < rank; ++k) dd[k] = d[k];
        ys = dd;
        std::swap(ys[i], ys[j]);
        for (std::int64_t f = 0; f < x.numel(); ++f) {
          std::array<std::int64_t, 4> idx{};
          std::int64_t rem = f;
          for (int k = 3; k >= 0; --k) idx[k] = rem % dd[k], rem /= dd[k];
          std::swap(idx[i], idx[j]);
          std::int64_t const g = ((idx[0] * ys[1] + idx[1]) * ys[2] + idx[2]) * ys[3] + idx[3];
          CHECK(y[g] == x.value()[f]);
        }
      }
  }
}

TEST_CASE("slice_last and split_last: pieces of the last dimension and the gradient of their use") {
  Generator gen(4);
  VarD x = param(uniform(Shape{2, 3, 6}, gen));
  auto f = [](Inputs const& in) {
    auto p = split_last(in[0], 3);  // q, k, v as attention takes them
    return add(mul(p[0], p[1]), scale(p[2], 2.0));
  };
  check_grad("split_last into 3", f, {x});
  check_grad("one slice only", [](Inputs const& in) { return slice_last(in[0], 1, 4); }, {x});
  Tensor<double> const y = slice_last(x, 2, 3).value();
  for (int r = 0; r < 6; ++r)
    for (int c = 0; c < 3; ++c) CHECK(y[r * 3 + c] == x.value()[r * 6 + 2 + c]);
  check_throws_with<ShapeError>([&] { (void)slice_last(x, 4, 3); }, {"[4, 7)", "size 6"});
  check_throws_with<ShapeError>([&] { (void)split_last(x, 4); }, {"size 6", "4 equal"});
}

// ---- linear.hpp: bmm ----

TEST_CASE("bmm: every transpose combination over 3-D and 4-D batches, values and gradients") {
  Generator gen(12);
  for (auto ta : {Trans::kNo, Trans::kYes})
    for (auto tb : {Trans::kNo, Trans::kYes}) {
      std::int64_t const B = 2, H = 3, M = dim(gen, 1, 4), K = dim(gen, 1, 4), N = dim(gen, 1, 4);
      Shape const as = ta == Trans::kNo ? Shape{B, H, M, K} : Shape{B, H, K, M};
      Shape const bs = tb == Trans::kNo ? Shape{B, H, K, N} : Shape{B, H, N, K};
      VarD a = param(uniform(as, gen)), b = param(uniform(bs, gen));
      auto f = [ta, tb](Inputs const& in) { return bmm(in[0], in[1], ta, tb); };
      std::string const what = detail::cat("bmm ta ", int(ta), " tb ", int(tb));
      check_grad(what, f, {a, b});
      check_grad(what + " 3-D",
                 [ta, tb](Inputs const& in) {
                   Shape const& s0 = in[0].shape();
                   Shape const& s1 = in[1].shape();
                   return bmm(reshape(in[0], Shape{s0[0] * s0[1], s0[2], s0[3]}),
                              reshape(in[1], Shape{s1[0] * s1[1], s1[2], s1[3]}), ta, tb);
                 },
                 {a, b});
      Tensor<double> const y = bmm(a, b, ta, tb).value();
      for (std::int64_t z = 0; z < B * H; ++z)
        for (std::int64_t i = 0; i < M; ++i)
          for (std::int64_t j = 0; j < N; ++j) {
            double s = 0;
            for (std::int64_t k = 0; k < K; ++k)
              s += a.value()[z * M * K + (ta == Trans::kNo ? i * K + k : k * M + i)] *
                   b.value()[z * K * N + (tb == Trans::kNo ? k * N + j : j * K + k)];
            CHECK(y[(z * M + i) * N + j] == doctest::Approx(s).epsilon(1e-13));
          }
    }
  check_throws_with<ShapeError>(
      [] {
        (void)bmm(constant(zeros<double>(Shape{2, 3, 4})), constant(zeros<double>(Shape{3, 3, 4})));
      },
      {"bmm", "do not chain"});
}

TEST_CASE("causal self-attention composed from the ops: gradient of the input through q, k, v and the mask") {
  Generator gen(13);
  std::int64_t const B = 2, T = 4, H = 2, D = 3, C = H * D;
  VarD x = param(uniform(Shape{B, T, 3 * C}, gen));
  auto f = [&](Inputs const& in) {
    auto qkv = split_last(in[0], 3);
    auto heads = [&](VarD const& t) { return transpose(reshape(t, Shape{B, T, H, D}), 1, 2); };
    VarD att = softmax(bmm(heads(qkv[0]), heads(qkv[1]), Trans::kNo, Trans::kYes),
                       {.scale = 1 / std::sqrt(double(D)), .mask = SoftmaxMask::kCausal});
    return reshape(transpose(bmm(att, heads(qkv[2])), 1, 2), Shape{B, T, C});
  };
  check_grad("attention", f, {x});
  // Causality: changing the last position's inputs leaves every earlier output as it was.
  Tensor<double> const y0 = f({x}).value();
  Tensor<double> x2 = clone(x.value());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t c = 0; c < 3 * C; ++c) x2[(b * T + T - 1) * 3 * C + c] += 1.0;
  Tensor<double> const y1 = f({constant(x2)}).value();
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t + 1 < T; ++t)
      for (std::int64_t c = 0; c < C; ++c) CHECK(y1[(b * T + t) * C + c] == y0[(b * T + t) * C + c]);
}

// ---- attention.hpp ----

TEST_CASE("causal_self_attention: the fused host kernel equals the composed ops, values and gradients") {
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    Generator gen(seed);
    std::int64_t const B = dim(gen, 1, 3), T = dim(gen, 1, 6), H = dim(gen, 1, 3), D = dim(gen, 1, 4), C = H * D;
    VarD qkv = param(uniform(Shape{B, T, 3 * C}, gen));
    check_grad(detail::cat("fused attention seed ", seed),
               [H](Inputs const& in) { return causal_self_attention(in[0], H); }, {qkv});
    Tensor<double> const gy = uniform(Shape{B, T, C}, gen);
    VarD const fused = causal_self_attention(qkv, H), composed = detail::composed_attention(qkv, H);
    CHECK(fused.op() == std::string("causal_self_attention"));  // the host has the fused kernel
    CHECK(max_abs_diff(fused.value(), composed.value()) < 1e-14);
    qkv.zero_grad();
    backward(fused, gy);
    Tensor<double> const g_fused = clone(qkv.grad());
    qkv.zero_grad();
    backward(composed, gy);
    CHECK(max_abs_diff(g_fused, qkv.grad()) < 1e-13);
  }
  check_throws_with<ShapeError>(
      [] {
        (void)causal_self_attention(param(zeros<double>(Shape{2, 3, 12})), 3);
      },
      {"causal_self_attention", "[2, 3, 12]", "3 heads"});
}
