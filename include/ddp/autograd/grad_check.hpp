// grad_check: compares backward()'s gradients with central finite differences, in double, element by element.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/autograd/backward.hpp"
#include "ddp/autograd/variable.hpp"
#include "ddp/error.hpp"
#include "ddp/tensor/host_kernels.hpp"
#include "ddp/tensor/random.hpp"

namespace ddp {

struct GradCheckOptions {
  double eps = 1e-6;            // finite-difference step: (f(x + eps) - f(x - eps)) / (2 eps)
  double rtol = 1e-6;           // pass when every element's error (see GradCheckResult::max_error) is at most this
  double atol = 1.0;            // error floor of the denominator: below |grad| = atol the error is absolute
  std::uint64_t seed = 0x5eed;  // draws the cotangent v for outputs with more than one element
};

// The outcome of a check; `worst_*` describe the element with the largest error.
struct GradCheckResult {
  bool ok = true;
  double max_error = 0;             // max over elements of |analytic - numeric| / max(atol, |analytic|, |numeric|)
  int worst_input = -1;             // index into the inputs passed to grad_check
  std::int64_t worst_element = -1;  // flat (row-major) index within that input
  double worst_analytic = 0;
  double worst_numeric = 0;
  std::int64_t elements_checked = 0;

  std::string summary() const {
    if (worst_input < 0) return detail::cat("grad_check: ", elements_checked, " elements checked");
    std::ostringstream os;
    os.precision(12);  // enough digits to see a 1e-7 relative difference between the two sides
    os << "grad_check " << (ok ? "passed" : "FAILED") << ": worst error " << max_error << " at input " << worst_input
       << " element " << worst_element << " (backward " << worst_analytic << ", finite difference " << worst_numeric
       << "); " << elements_checked << " elements checked";
    return os.str();
  }
};

namespace detail {
// The elements of a tensor of any space, on the host.
template <MemorySpace S>
std::vector<double> host_copy(Tensor<double, S> const& t) {
  std::vector<double> v(static_cast<std::size_t>(t.numel()));
  Kernels<S>::to_host(t.numel(), t.data(), v.data());
  return v;
}

template <MemorySpace S, class Fn>
GradCheckResult grad_check_impl(Fn& fn, std::vector<Variable<double, S>> const& inputs, GradCheckOptions const& opts) {
  using K = Kernels<S>;
  if (!(opts.eps > 0)) throw ArgumentError(detail::cat("grad_check: eps must be > 0, got ", opts.eps));
  if (!(opts.atol > 0)) throw ArgumentError(detail::cat("grad_check: atol must be > 0, got ", opts.atol));
  bool any = false;
  for (auto const& x : inputs) any |= x.requires_grad();
  if (!any) throw ArgumentError("grad_check: no input requires grad (construct them with RequiresGrad::kYes)");

  // Analytic side.
  for (auto const& x : inputs) x.zero_grad();
  Variable<double, S> const y = fn(inputs);
  std::vector<double> v(static_cast<std::size_t>(y.numel()));
  Generator gen(opts.seed);
  for (auto& e : v) e = y.numel() == 1 ? 1.0 : gen.uniform(-1.0, 1.0);
  Tensor<double, S> v_space(y.shape());
  K::from_host(y.numel(), v.data(), v_space.data());
  backward(y, v_space);

  auto eval = [&] {
    NoGradGuard const no_grad;
    Variable<double, S> const out = fn(inputs);
    if (!(out.shape() == y.shape()))
      throw ShapeError(detail::cat("grad_check: fn returned shape ", out.shape(), " after returning ", y.shape()));
    std::vector<double> const o = host_copy(out.value());
    double s = 0;  // Σ v ⊙ y in double (the scalar whose gradient both sides compute)
    for (std::size_t i = 0; i < o.size(); ++i) s += v[i] * o[i];
    return s;
  };

  GradCheckResult res;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    Variable<double, S> const& x = inputs[k];
    if (!x.requires_grad()) continue;
    Tensor<double, S> const gt = x.grad();  // undefined: x did not reach the output, its gradient is 0
    std::vector<double> const g = gt.defined() ? host_copy(gt) : std::vector<double>{};
    double* const xs = x.value().data();
    auto set = [&](std::int64_t j, double value) { K::from_host(std::int64_t{1}, &value, xs + j); };
    std::vector<double> const x0s = host_copy(x.value());
    for (std::int64_t j = 0; j < x.numel(); ++j) {
      double const x0 = x0s[static_cast<std::size_t>(j)];
      set(j, x0 + opts.eps);
      double const fp = eval();
      set(j, x0 - opts.eps);
      double const fm = eval();
      set(j, x0);
      double const numeric = (fp - fm) / (2 * opts.eps);
      double const analytic = g.empty() ? 0.0 : g[static_cast<std::size_t>(j)];
      double err = std::abs(analytic - numeric) / std::max({opts.atol, std::abs(analytic), std::abs(numeric)});
      if (std::isnan(err)) err = std::numeric_limits<double>::infinity();  // a NaN on either side fails
      ++res.elements_checked;
      if (res.worst_input < 0 || err > res.max_error) {
        res.max_error = err;
        res.worst_input = static_cast<int>(k);
        res.worst_element = j;
        res.worst_analytic = analytic;
        res.worst_numeric = numeric;
      }
    }
  }
  res.ok = res.max_error <= opts.rtol;
  return res;
}
}  // namespace detail

// Checks the gradient of `fn(inputs)` with respect to every input that requires grad.
//
// `fn` must be deterministic (re-seed any Generator inside it) and must not modify its inputs. Its output
// y may have any shape: the checked scalar is L = Σ v ⊙ y with v drawn once from `opts.seed` (v = 1 for a
// one-element y), so that every output element contributes with a distinct weight and errors cannot cancel
// by symmetry. The analytic side is backward(y, v); the numeric side evaluates fn under NoGradGuard at
// x ± eps for each element in turn, restoring the exact original value afterwards.
//
// Error measure, |a - n| / max(atol, |a|, |n|): the finite difference carries an absolute round-off error
// of about ε_mach·|L| / eps whatever the gradient's size, so a purely relative error on an element whose
// gradient is near zero would measure only that noise. Below |grad| = atol (1 by default) the measure is
// the absolute error; above it, the relative error, so large gradients are held to the same number of
// correct digits. It is symmetric in a and n, so neither side is privileged as "the truth".
//
// Costs 2·(elements checked) + 1 evaluations of fn. Calls zero_grad() on the inputs first and leaves their
// gradients holding backward's result. Inputs may live in any memory space with kernels (device tensors too:
// the perturbations and the contraction go through Kernels<S>::from_host / to_host).
template <class Fn>
requires std::invocable < Fn&, std::vector<Variable<double>>
const& > GradCheckResult grad_check(Fn&& fn, std::vector<Variable<double>> const& inputs,
                                    GradCheckOptions const& opts = {}) {
  return detail::grad_check_impl<HostSpace>(fn, inputs, opts);
}
template <MemorySpace S, class Fn>
requires(!std::same_as<S, HostSpace>) && std::invocable<Fn&, std::vector<Variable<double, S>> const&> GradCheckResult
    grad_check(Fn&& fn, std::vector<Variable<double, S>> const& inputs, GradCheckOptions const& opts = {}) {
  return detail::grad_check_impl<S>(fn, inputs, opts);
}

}  // namespace ddp
