// nn::clip_grad_norm and nn::clip_grad_value (ddp/nn/clip_grad.hpp): against a double-precision definition and
// against PyTorch 1.13's torch.nn.utils.clip_grad_norm_ (values from clip_grad_reference.py), argument and
// non-finite errors, and under DDP on the threads backend (the same norm on every rank, equal to one process on
// the whole batch).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ddp/ddp.hpp"
#include "test/parallel/ddp_cases.hpp"

using namespace ddp;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

// Gradient values that PyTorch's reference script builds the same way: g[k] = sin(0.37 (k + offset)) * scale.
std::vector<float> wave(std::int64_t n, int offset, float scale) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t k = 0; k < n; ++k)
    v[static_cast<std::size_t>(k)] = float(std::sin(0.37 * double(k + offset))) * scale;
  return v;
}

double norm_of(std::vector<std::vector<float>> const& gs, double p) {
  double acc = 0;
  for (auto const& g : gs)
    for (float x : g) acc = std::isinf(p) ? std::max(acc, std::abs(double(x))) : acc + std::pow(std::abs(double(x)), p);
  return std::isinf(p) ? acc : std::pow(acc, 1 / p);
}

// Three parameters (4×3, 3, 5) whose gradients are the waves, packed in an arena as an optimizer would.
struct Params {
  std::vector<nn::NamedParameter<float, HostSpace>> named;
  nn::ParameterArena<float> arena;
  explicit Params(float scale) : named(make(scale)), arena(named) {}
  static std::vector<nn::NamedParameter<float, HostSpace>> make(float scale) {
    std::vector<nn::NamedParameter<float, HostSpace>> ps;
    std::vector<std::pair<std::string, Shape>> const specs{
        {"a.weight", Shape{4, 3}}, {"a.bias", Shape{3}}, {"b", Shape{5}}};
    int offset = 1;
    for (auto const& [name, shape] : specs) {
      Var v(Tensor<float>(shape), RequiresGrad::kYes);
      auto const g = wave(shape.numel(), offset, scale);
      offset += 100;
      Tensor<float> gt(shape);
      std::copy(g.begin(), g.end(), gt.data());
      backward(sum(v * Var(gt)));  // d/dv Σ v·g = g
      ps.push_back({name, v});
    }
    return ps;
  }
  std::vector<std::vector<float>> grads() const {
    std::vector<std::vector<float>> out;
    for (auto const& e : arena.entries()) {
      auto const g = e.var.grad();
      out.emplace_back(g.data(), g.data() + g.numel());
    }
    return out;
  }
};
}  // namespace

TEST_CASE("Kernels<HostSpace>::norm is the p-norm; NaN propagates; clamp keeps NaN") {
  for (std::int64_t n : {0, 1, 7, 1000}) {
    auto const x = wave(n, 3, 2.5f);
    for (double p : {1.0, 2.0, 3.0, 0.5, kInf}) {
      CAPTURE(n);
      CAPTURE(p);
      double const want = n ? norm_of({x}, p) : 0.0;
      float const got = Kernels<HostSpace>::norm(n, x.data(), float(p));
      CHECK(double(got) == doctest::Approx(want).epsilon(2e-6));
    }
  }
  std::vector<float> x{1, -3, std::nanf(""), 2};
  CHECK(std::isnan(Kernels<HostSpace>::norm(4, x.data(), std::numeric_limits<float>::infinity())));
  CHECK(std::isnan(Kernels<HostSpace>::norm(4, x.data(), 2.0f)));
  std::vector<float> y{-5, -0.5f, std::nanf(""), 0.25f, 7, -std::numeric_limits<float>::infinity()};
  Kernels<HostSpace>::clamp(6, -1.0f, 1.0f, y.data());
  CHECK(y[0] == -1);
  CHECK(y[1] == -0.5f);
  CHECK(std::isnan(y[2]));
  CHECK(y[3] == 0.25f);
  CHECK(y[4] == 1);
  CHECK(y[5] == -1);
}

TEST_CASE("clip_grad_norm scales every gradient by max_norm / (total + 1e-6) and returns the total") {
  for (double p : {2.0, 1.0, 3.0, kInf}) {
    CAPTURE(p);
    Params ps(1.5f);
    auto const before = ps.grads();
    double const total = norm_of(before, p);
    double const max_norm = total / 4;
    float const got = nn::clip_grad_norm(ps.arena, max_norm, {.norm_type = p});
    CHECK(double(got) == doctest::Approx(total).epsilon(2e-6));
    float const coef = float(max_norm) / (got + 1e-6f);
    auto const after = ps.grads();
    for (std::size_t i = 0; i < after.size(); ++i)
      for (std::size_t k = 0; k < after[i].size(); ++k) CHECK(after[i][k] == before[i][k] * coef);
    CHECK(norm_of(after, p) == doctest::Approx(max_norm).epsilon(2e-6));
  }
}

TEST_CASE("grad_norm is the total clip_grad_norm returns, and changes no gradient") {
  for (double p : {2.0, 1.0, kInf}) {
    CAPTURE(p);
    Params ps(1.5f), clipped(1.5f);
    auto const before = ps.grads();
    float const norm = nn::grad_norm(ps.arena, {.norm_type = p});
    CHECK(norm == nn::clip_grad_norm(clipped.arena, 0.01, {.norm_type = p}));
    CHECK(ps.grads() == before);
  }
  Params ps(1.0f);
  CHECK_THROWS_AS(nn::grad_norm(ps.arena, {.norm_type = 0.0}), ArgumentError);
}

TEST_CASE("clip_grad_norm matches PyTorch 1.13's clip_grad_norm_") {
  // Printed by test/nn/clip_grad_reference.py with Debian's python3-torch 1.13.1 (2026-11-27): the same three
  // gradients (scale 1.5), torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type); the returned total norm,
  // and the first element of each gradient after clipping (the last case does not clip).
  struct Ref {
    double p, max_norm, total;
    float first[3];
  };
  for (Ref const r : {
           Ref{2.0, 1.0, 4.18419266, {0.129636243f, -0.115865573f, -0.307006508f}},
           Ref{1.0, 2.0, 16.3574867, {0.066321075f, -0.0592760928f, -0.15706259f}},
           Ref{3.0, 0.5, 2.75961566, {0.0982787088f, -0.0878390148f, -0.232745156f}},
           Ref{kInf, 0.25, 1.49382126, {0.090777725f, -0.0811348259f, -0.214981198f}},
           Ref{2.0, 100.0, 4.18419266, {0.542423129f, -0.484804004f, -1.28457475f}},
       }) {
    CAPTURE(r.p);
    Params ps(1.5f);
    float const got = nn::clip_grad_norm(ps.named, r.max_norm, {.norm_type = r.p});
    CHECK(double(got) == doctest::Approx(r.total).epsilon(1e-6));
    auto const after = ps.grads();
    for (int i = 0; i < 3; ++i) CHECK(double(after[i][0]) == doctest::Approx(r.first[i]).epsilon(1e-6));
  }
}

TEST_CASE("below max_norm the gradients are bitwise unchanged; without gradients the norm is 0") {
  Params ps(0.01f);
  auto const before = ps.grads();
  float const got = nn::clip_grad_norm(ps.arena, 100.0);
  CHECK(got > 0);
  CHECK(ps.grads() == before);
  ps.arena.zero_grad();
  CHECK(nn::clip_grad_norm(ps.arena, 1.0) == 0.0f);
}

TEST_CASE("parameters without a gradient are skipped; a shared parameter counts once") {
  Params ps(1.5f);
  auto const g = ps.grads();
  auto named = ps.named;
  named.push_back({"tied", named[0].var});  // the same parameter under a second name
  named[2].var.zero_grad();                 // "b" has no gradient now
  double const want = norm_of({g[0], g[1]}, 2.0);
  CHECK(double(nn::clip_grad_norm(named, 1e9)) == doctest::Approx(want).epsilon(2e-6));
}

TEST_CASE("clip_grad_value clamps every gradient element into [-v, v]") {
  Params ps(1.5f);
  auto const before = ps.grads();
  nn::clip_grad_value(ps.arena, 0.5);
  auto const after = ps.grads();
  for (std::size_t i = 0; i < after.size(); ++i)
    for (std::size_t k = 0; k < after[i].size(); ++k) CHECK(after[i][k] == std::clamp(before[i][k], -0.5f, 0.5f));
  Params qs(1.5f);
  nn::clip_grad_value(qs.named, 0.5);
  CHECK(qs.grads() == after);
}

TEST_CASE("bad arguments name themselves") {
  Params ps(1.0f);
  auto const msg = [](auto&& f) {
    try {
      f();
    } catch (ArgumentError const& e) {
      return std::string(e.what());
    }
    return std::string("no ArgumentError");
  };
  CHECK(msg([&] { nn::clip_grad_norm(ps.arena, -1.0); }).find("max_norm must be a finite number >= 0, got -1") !=
        std::string::npos);
  CHECK(msg([&] { nn::clip_grad_norm(ps.arena, std::nan("")); }).find("max_norm") != std::string::npos);
  CHECK(msg([&] { nn::clip_grad_norm(ps.arena, 1.0, {.norm_type = 0}); }).find("norm_type must be > 0") !=
        std::string::npos);
  CHECK(msg([&] { nn::clip_grad_norm(ps.arena, 1.0, {.norm_type = std::nan("")}); }).find("norm_type") !=
        std::string::npos);
  CHECK(msg([&] { nn::clip_grad_value(ps.arena, -0.5); }).find("clip_value must be a finite number >= 0") !=
        std::string::npos);
  CHECK(msg([&] { nn::clip_grad_value(ps.arena, kInf); }).find("clip_value") != std::string::npos);
}

TEST_CASE("a non-finite norm: kRaise names the parameters and changes nothing; kScale scales as PyTorch") {
  Params ps(1.5f);
  ps.arena.entries()[1].var.grad().data()[2] = std::numeric_limits<float>::infinity();
  auto const before = ps.grads();
  std::string m;
  try {
    nn::clip_grad_norm(ps.arena, 1.0, {.non_finite = nn::NonFiniteNorm::kRaise});
  } catch (DdpError const& e) {
    m = e.what();
  }
  CHECK(m.find("total norm of order 2 of the gradients is inf") != std::string::npos);
  CHECK(m.find("a.bias (inf)") != std::string::npos);
  CHECK(m.find("a.weight") == std::string::npos);
  CHECK(ps.grads() == before);
  // PyTorch: coef = 1 / (inf + 1e-6) = 0, so finite gradients become 0 and the infinite one NaN.
  CHECK(std::isinf(nn::clip_grad_norm(ps.arena, 1.0)));
  auto const after = ps.grads();
  CHECK(after[0][1] == 0.0f);
  CHECK(std::isnan(after[1][2]));

  Params qs(1.5f);
  qs.arena.entries()[2].var.grad().data()[0] = std::nanf("");
  CHECK(std::isnan(nn::clip_grad_norm(qs.arena, 1.0, {.norm_type = kInf})));
  CHECK(std::isnan(qs.grads()[0][1]));  // scaled by a NaN factor, as torch.clamp(NaN, max=1) leaves it
}

TEST_CASE("under DDP every rank clips alike, as one process on the whole batch") {
  constexpr std::int64_t kBatch = 16;
  auto const data = test::make_data(kBatch, 8, 4, 7);
  // One process on the whole batch.
  auto ref = test::make_mlp(8, 32, 4, 1);
  nn::ParameterArena<float> ref_params(ref);
  backward(mse_loss(ref(Var(data.x)), data.y));
  float const ref_total = nn::clip_grad_norm(ref_params, 0.05);
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    std::vector<float> totals(static_cast<std::size_t>(n));
    std::vector<std::vector<float>> grads(static_cast<std::size_t>(n));
    spawn(n, [&](ThreadsBackend& comm) {
      auto model = test::make_mlp(8, 32, 4, 1);
      DistributedDataParallel ddp(model, comm);
      std::int64_t const local = kBatch / comm.world_size();
      backward(mse_loss(ddp(Var(test::rows(data.x, comm.rank() * local, local))),
                        test::rows(data.y, comm.rank() * local, local)));
      auto const r = static_cast<std::size_t>(comm.rank());
      totals[r] = nn::clip_grad_norm(ddp.parameters(), 0.05);
      for (auto const& e : ddp.parameters().entries()) {
        auto const g = e.var.grad();
        grads[r].insert(grads[r].end(), g.data(), g.data() + g.numel());
      }
    });
    CHECK(double(totals[0]) == doctest::Approx(double(ref_total)).epsilon(1e-5));
    for (int r = 1; r < n; ++r) {
      CHECK(totals[static_cast<std::size_t>(r)] == totals[0]);  // bitwise: the same averaged gradients
      CHECK(grads[static_cast<std::size_t>(r)] == grads[0]);
    }
    std::vector<float> want;
    for (auto const& e : ref_params.entries()) {
      auto const g = e.var.grad();
      want.insert(want.end(), g.data(), g.data() + g.numel());
    }
    REQUIRE(want.size() == grads[0].size());
    for (std::size_t i = 0; i < want.size(); ++i)
      CHECK(grads[0][i] == doctest::Approx(want[i]).epsilon(1e-4).scale(1e-3));
  }
}
