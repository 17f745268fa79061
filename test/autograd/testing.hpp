// Helpers shared by the autograd tests: seeded random tensors, inputs kept off kinks and ties, check_grad.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <string>
#include <vector>

#include "ddp/autograd/autograd.hpp"
#include "ddp/autograd/grad_check.hpp"

namespace ddp::testing {

using VarD = Variable<double>;
using Inputs = std::vector<VarD>;
using NodeD = Node<double, HostSpace>;

// Uniform in [lo, hi) from a seeded generator.
inline Tensor<double> uniform(Shape s, Generator& gen, double lo = -1.0, double hi = 1.0) {
  Tensor<double> t(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = gen.uniform(lo, hi);
  return t;
}

// Uniform in ±[margin, margin + 1): no element within `margin` of zero (relu's kink).
inline Tensor<double> away_from_zero(Shape s, Generator& gen, double margin = 0.1) {
  Tensor<double> t(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    double const u = gen.uniform(-1.0, 1.0);
    t[i] = u < 0 ? u - margin : u + margin;
  }
  return t;
}

// Distinct values in [-2, 2): any two differ by at least 2/numel (far more than a finite-difference step),
// so max-pool windows have no ties to break.
inline Tensor<double> distinct(Shape s, Generator& gen) {
  Tensor<double> t(s);
  std::int64_t const n = t.numel();
  std::vector<std::int64_t> perm(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) perm[static_cast<std::size_t>(i)] = i;
  gen.shuffle(perm.begin(), perm.end());
  for (std::int64_t i = 0; i < n; ++i)
    t[i] =
        (static_cast<double>(perm[static_cast<std::size_t>(i)]) + 0.25 + 0.5 * gen.uniform_double()) / double(n) * 4.0 -
        2.0;
  return t;
}

inline VarD param(Tensor<double> t) { return VarD(std::move(t), RequiresGrad::kYes); }
inline VarD constant(Tensor<double> t) { return VarD(std::move(t)); }

// Integer in [lo, hi].
inline std::int64_t dim(Generator& gen, std::int64_t lo, std::int64_t hi) {
  return lo + static_cast<std::int64_t>(gen.below(static_cast<std::uint32_t>(hi - lo + 1)));
}

inline Tensor<std::int32_t> random_targets(std::int64_t rows, std::int64_t classes, Generator& gen) {
  Tensor<std::int32_t> t(Shape{rows});
  for (std::int64_t i = 0; i < rows; ++i)
    t[i] = static_cast<std::int32_t>(gen.below(static_cast<std::uint32_t>(classes)));
  return t;
}

// Max |a - b| over two same-shaped host tensors (infinity when the shapes differ).
template <class T>
double max_abs_diff(Tensor<T> const& a, Tensor<T> const& b) {
  if (!(a.shape() == b.shape())) return INFINITY;
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

inline Tensor<float> to_float(Tensor<double> const& t) {
  Tensor<float> f(t.shape());
  for (std::int64_t i = 0; i < t.numel(); ++i) f[i] = static_cast<float>(t[i]);
  return f;
}

// max |f - d| / max(1, |d|) between a float result and its double counterpart.
inline double float_vs_double(Tensor<float> const& f, Tensor<double> const& d) {
  if (!(f.shape() == d.shape())) return INFINITY;
  double m = 0;
  for (std::int64_t i = 0; i < d.numel(); ++i)
    m = std::max(m, std::abs(double(f[i]) - d[i]) / std::max(1.0, std::abs(d[i])));
  return m;
}

// Direct 7-loop cross-correlation with zero padding: y[n,o,i,j] = b[o] + Σ_c,ki,kj x[n,c,i·s-p+ki,j·s-p+kj] w[o,c,ki,kj].
inline Tensor<double> conv2d_reference(Tensor<double> const& x, Tensor<double> const& w, Tensor<double> const* b,
                                       std::int64_t stride, std::int64_t pad) {
  std::int64_t const N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), O = w.size(0), k = w.size(2);
  std::int64_t const OH = (H + 2 * pad - k) / stride + 1, OW = (W + 2 * pad - k) / stride + 1;
  Tensor<double> y(Shape{N, O, OH, OW});
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < O; ++o)
      for (std::int64_t i = 0; i < OH; ++i)
        for (std::int64_t j = 0; j < OW; ++j) {
          double s = b ? (*b)[o] : 0.0;
          for (std::int64_t c = 0; c < C; ++c)
            for (std::int64_t ki = 0; ki < k; ++ki)
              for (std::int64_t kj = 0; kj < k; ++kj) {
                std::int64_t const ih = i * stride - pad + ki, iw = j * stride - pad + kj;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                s += x[((n * C + c) * H + ih) * W + iw] * w[((o * C + c) * k + ki) * k + kj];
              }
          y[((n * O + o) * OH + i) * OW + j] = s;
        }
  return y;
}

// Does `what` contain `part`?
inline bool contains(std::string const& what, std::string const& part) { return what.find(part) != std::string::npos; }

// Gradient check with the tolerance (relative error < 1e-6); `label` says which case failed.
template <class Fn>
void check_grad(std::string const& label, Fn&& fn, Inputs const& inputs, GradCheckOptions const& opts = {}) {
  GradCheckResult const r = grad_check(fn, inputs, opts);
  INFO(label);
  CHECK_MESSAGE(r.ok, r.summary());
  CHECK(r.elements_checked > 0);
}

// Expects `f()` to throw Exc whose message contains every one of `parts` (shapes, op names).
template <class Exc, class F>
void check_throws_with(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (Exc const& e) {
    std::string const what = e.what();
    for (auto const& part : parts)
      CHECK_MESSAGE(contains(what, part), "message '" << what << "' lacks '" << part << "'");
    return;
  } catch (std::exception const& e) {
    FAIL_CHECK("threw the wrong exception type: " << e.what());
    return;
  }
  FAIL_CHECK("did not throw");
}

}  // namespace ddp::testing
